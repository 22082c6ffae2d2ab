"""Where a command's model comes from and whether it can load there: the device and the checkpoint are
checked before any weight loads, and the embedded default model is built once."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import UsageError


def check_device(name: str) -> None:
    """Refuse a device torch cannot parse, CUDA without a GPU, or a GPU index past the last."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    elif device.type != "cpu":
        raise UsageError(f"--device {name}: only cpu and cuda are supported")


def check_model(model_dir: Path | str) -> dict[str, Any]:
    """config.json read and its model_type known, before any weight loads; returns the config."""
    from ..models import model_class
    from ..models.checkpoint import read_config

    config = read_config(model_dir)
    model_class(config.get("model_type"))
    return config


def default_model_dir() -> Path:
    root = Path(os.environ.get("HYBRIDCACHE_HOME", Path.home() / ".cache" / "hybridcache"))
    return root / "default-nemotron-h"


def ensure_default_model(path: Path) -> Path:
    """Build the default checkpoint once; rebuild when its recipe (config, seed, tokenizer, versions) changes."""
    from ..models import default

    recipe = default.recipe()
    stamp = path / "RECIPE"
    if not stamp.exists() or stamp.read_text() != recipe:
        default.build_default_checkpoint(path)
        stamp.write_text(recipe)
    return path
