"""`load_model` (config.json + safetensors -> a registered model) and `load_tokenizer`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointReader, read_config
from .errors import MissingTensorError, TensorShapeError
from .registry import model_class

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def load_model(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """The model of a HF-format checkpoint directory, its weights in `dtype` on `device`, in eval mode.

    Raises UnsupportedModelTypeError, UnsupportedConfigError, MissingTensorError, TensorShapeError (all
    ModelLoadError). Tensors the model does not use (e.g. multi-token-prediction heads) are ignored.
    """
    config = read_config(path)
    cls = model_class(config.get("model_type"))
    model = cls.from_config(config, device, dtype)
    with CheckpointReader(path) as reader:
        for name, target in model.tensor_targets().items():
            found = next((n for n in cls.checkpoint_names(name) if n in reader), None)
            if found is None:
                raise MissingTensorError(name, str(path))
            shape = reader.shape(found)
            if shape != tuple(target.shape):
                raise TensorShapeError(found, tuple(target.shape), shape)
            with torch.no_grad():
                target.copy_(reader.tensor(found))
    return model.eval()


def load_tokenizer(path: str | Path) -> Any | None:
    """A transformers tokenizer when the directory has tokenizer files, else None."""
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
