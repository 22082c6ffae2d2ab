"""HF-checkpoint-compatible model definitions over `hybridcache.ops`, and their loader."""
from . import kimi_linear  # noqa: F401  (registers "kimi_linear")
from . import nemotron_h  # noqa: F401  (registers "nemotron_h")
from . import qwen3_next  # noqa: F401  (registers "qwen3_next")
from .batch import ForwardBatch
from .errors import (
    MissingTensorError,
    ModelLoadError,
    TensorShapeError,
    UnsupportedConfigError,
    UnsupportedModelTypeError,
)
from .loader import load_model, load_tokenizer
from .registry import model_class, register, supported_model_types

__all__ = [
    "ForwardBatch", "MissingTensorError", "ModelLoadError", "TensorShapeError", "UnsupportedConfigError",
    "UnsupportedModelTypeError", "load_model", "load_tokenizer", "model_class", "register", "supported_model_types",
]
