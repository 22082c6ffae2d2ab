"""Typed errors of checkpoint loading; each names what is wrong and what was expected."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A checkpoint directory cannot be served."""


class UnsupportedModelTypeError(ModelLoadError):
    """config.json names a `model_type` no registered family serves."""

    def __init__(self, model_type: object, supported: list[str]) -> None:
        super().__init__(f"unsupported model_type {model_type!r}; supported: {', '.join(supported) or 'none'}")
        self.model_type, self.supported = model_type, supported


class UnsupportedConfigError(ModelLoadError):
    """A config field has a value the model or its kernels cannot serve."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"config field {field!r} = {value!r}: {reason}")
        self.field, self.value = field, value


class MissingTensorError(ModelLoadError):
    """A tensor the model needs is in none of the checkpoint's files."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(f"tensor {name!r} is missing from the checkpoint at {path}")
        self.name = name


class TensorShapeError(ModelLoadError):
    """A checkpoint tensor's shape differs from the one the config implies."""

    def __init__(self, name: str, expected: tuple[int, ...], got: tuple[int, ...]) -> None:
        super().__init__(f"tensor {name!r} has shape {list(got)}, expected {list(expected)}")
        self.name, self.expected, self.got = name, expected, got


class CheckpointFileError(ModelLoadError):
    """A checkpoint file cannot be read: missing, truncated, not JSON, or not a safetensors file."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file, self.reason = file, reason


class TensorDtypeError(ModelLoadError):
    """A checkpoint tensor is stored in a dtype the loader does not take as weights (e.g. int32)."""

    def __init__(self, name: str, dtype: object, supported: list[str]) -> None:
        super().__init__(f"tensor {name!r} has dtype {dtype}; weights must be one of {', '.join(supported)}")
        self.name, self.dtype = name, dtype


class NonFiniteTensorError(ModelLoadError):
    """A checkpoint tensor holds NaN or inf, in the file or after the cast to the serving dtype."""

    def __init__(self, name: str, count: int, numel: int, reason: str) -> None:
        super().__init__(f"tensor {name!r} has {count} of {numel} values NaN or inf {reason}")
        self.name, self.count = name, count
