"""Reading a HF-format checkpoint directory: config.json and one or many `*.safetensors` files.

Every failure to read a file (missing, truncated, not JSON, not safetensors) is a CheckpointFileError
naming the file; nothing here lets a JSONDecodeError or a SafetensorError through.
"""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointFileError, ModelLoadError

INDEX_FILE = "model.safetensors.index.json"
T = TypeVar("T")


def read_json(file: Path) -> dict[str, Any]:
    """A JSON object from `file`; CheckpointFileError when it is unreadable, not JSON or not an object."""
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointFileError(str(file), f"cannot be read ({e})") from e
    except json.JSONDecodeError as e:
        raise CheckpointFileError(str(file), f"is not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise CheckpointFileError(str(file), f"must hold a JSON object, not {type(value).__name__}")
    return value


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint directory as a dict."""
    if not Path(path).is_dir():
        raise ModelLoadError(f"{path} is not a checkpoint directory (config.json + *.safetensors)")
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    return read_json(file)


def read_generation_config(path: str | Path) -> dict[str, Any]:
    """generation_config.json of a checkpoint directory as a dict, {} when it has none."""
    file = Path(path) / "generation_config.json"
    return read_json(file) if file.is_file() else {}


def _open(file: Path) -> Any:
    """`safe_open(file)`; CheckpointFileError when it is truncated or not a safetensors file."""
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise CheckpointFileError(str(file), f"is not a readable safetensors file ({e})") from e


class CheckpointReader:
    """Tensors by name across the directory's safetensors files, opened lazily (one tensor at a time).

    With `model.safetensors.index.json` its `weight_map` says which file holds each tensor; otherwise every
    `*.safetensors` file in the directory is read. Use as a context manager.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._where = self._locate()
        self._stack = ExitStack()
        self._open: dict[str, Any] = {}

    def _locate(self) -> dict[str, str]:
        index = self.path / INDEX_FILE
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
            ):
                raise CheckpointFileError(str(index), "has no weight_map of tensor name -> file name")
            for file in set(weight_map.values()):
                if not (self.path / file).is_file():
                    raise ModelLoadError(f"{index} names {file}, which is not in {self.path}")
            return dict(weight_map)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{self.path} has no *.safetensors file")
        where: dict[str, str] = {}
        for file in files:
            with _open(file) as f:
                where.update({name: file.name for name in f.keys()})
        return where

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._open.clear()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def _file(self, name: str) -> Any:
        file = self._where[name]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(_open(self.path / file))
        return self._open[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._read(name, lambda f: f.get_slice(name).get_shape()))

    def tensor(self, name: str) -> torch.Tensor:
        return self._read(name, lambda f: f.get_tensor(name))

    def tensor_ranges(self, name: str, dim: int, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
        """The concatenation along `dim` of the tensor's `(start, length)` ranges, each read on its own
        (`get_slice`): the rest of the tensor is never read."""

        def read(f: Any) -> torch.Tensor:
            part = f.get_slice(name)
            lead = (slice(None),) * dim
            return torch.cat([part[(*lead, slice(start, start + n))] for start, n in ranges], dim=dim)

        return self._read(name, read)

    def _read(self, name: str, read: Callable[[Any], T]) -> T:
        f = self._file(name)
        try:
            return read(f)
        except SafetensorError as e:  # e.g. an index that names a file without this tensor
            raise CheckpointFileError(str(self.path / self._where[name]), f"tensor {name!r}: {e}") from e
