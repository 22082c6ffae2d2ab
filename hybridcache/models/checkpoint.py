"""Reading a HF-format checkpoint directory: config.json and one or many `*.safetensors` files."""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint directory as a dict."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ModelLoadError(f"{file} must hold a JSON object")
    return config


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
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelLoadError(f"{index} has no weight_map")
            for file in set(weight_map.values()):
                if not (self.path / file).is_file():
                    raise ModelLoadError(f"{index} names {file}, which is not in {self.path}")
            return dict(weight_map)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{self.path} has no *.safetensors file")
        where: dict[str, str] = {}
        for file in files:
            with safe_open(file, framework="pt") as f:
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
            self._open[file] = self._stack.enter_context(safe_open(self.path / file, framework="pt"))
        return self._open[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(name)
