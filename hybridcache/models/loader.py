"""`load_model` (config.json + safetensors -> a registered model) and `load_tokenizer`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..parallel import SINGLE, TPGroup
from ..parallel.pipeline import Stage
from .checkpoint import CheckpointReader, read_config
from .errors import MissingTensorError, ModelLoadError, NonFiniteTensorError, TensorDtypeError, TensorShapeError
from .registry import model_class

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # what a checkpoint may store


def load_model(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               tp: TPGroup = SINGLE, stage: Stage | None = None) -> Any:
    """The model of a HF-format checkpoint directory, its weights in `dtype` on `device`, in eval mode.

    Raises UnsupportedModelTypeError, UnsupportedConfigError, CheckpointFileError (a file truncated, corrupt
    or not JSON), MissingTensorError, TensorShapeError, TensorDtypeError (e.g. int32 weights),
    NonFiniteTensorError (NaN or inf, stored or from the cast to `dtype`); all ModelLoadError. Tensors the
    model does not use (e.g. multi-token-prediction heads) are ignored.

    Once every tensor is filled (name for name, in the checkpoint's layout), each module that has a
    `finish_load()` method gets it called once, to put its weights into a layout of its own (e.g.
    `GatedDeltaNetMixer` permutes its projections' rows so that its kernels read column slices).

    With `tp` of more than one rank the model is this rank's shard (docs/parallel.md): a sharded target
    (one with a `shard`) is read as its ranges of the checkpoint tensor only; the rest are read whole.
    With a pipeline `stage`, only that stage's tensors are read (`parallel/pipeline.py`).
    """
    config = read_config(path)
    cls = model_class(config.get("model_type"))
    model = cls.from_config(config, device, dtype, tp, stage)
    with CheckpointReader(path) as reader:
        for name, target in model.tensor_targets().items():
            found = next((n for n in cls.checkpoint_names(name) if n in reader), None)
            if found is None:
                raise MissingTensorError(name, str(path))
            part = getattr(target, "shard", None)
            want = tuple(target.shape) if part is None else part.checkpoint_shape(target.shape)
            shape = reader.shape(found)
            if shape != want:
                raise TensorShapeError(found, want, shape)
            source = reader.tensor(found) if part is None else reader.tensor_ranges(found, part.dim, part.ranges)
            if source.dtype not in WEIGHT_DTYPES:
                raise TensorDtypeError(found, source.dtype, [str(d) for d in WEIGHT_DTYPES])
            with torch.no_grad():
                target.copy_(source)
            _check_finite(found, source, target)
    for module in model.modules():
        finish = getattr(module, "finish_load", None)
        if finish is not None:
            finish()
    return model.eval()


def model_on_meta(path: str | Path, dtype: torch.dtype = torch.float32, tp: TPGroup = SINGLE,
                  stage: Stage | None = None) -> Any:
    """The checkpoint's model (this rank's shard of it, or this stage's part) on the meta device: no weights
    read, no memory. Enough to check that a tensor-parallel size splits it and to size its cache."""
    config = read_config(path)
    return model_class(config.get("model_type")).from_config(config, "meta", dtype, tp, stage)


def _check_finite(name: str, source: torch.Tensor, target: torch.Tensor) -> None:
    """Refuse NaN or inf in the loaded weight: stored so, or overflowing the serving dtype (fp32 -> fp16).
    One device reduction per tensor; the offending tensor alone is inspected further."""
    if bool(torch.isfinite(target).all()):
        return
    stored = int((~torch.isfinite(source)).sum())
    if stored:
        raise NonFiniteTensorError(name, stored, source.numel(), "in the checkpoint")
    cast = int((~torch.isfinite(target)).sum())
    raise NonFiniteTensorError(name, cast, source.numel(), f"after the cast from {source.dtype} to {target.dtype} "
                               f"(values beyond its range); load it in a wider dtype")


def load_tokenizer(path: str | Path) -> Any | None:
    """A transformers tokenizer when the directory has tokenizer files, else None."""
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, JSON and tokenizers errors)
        raise ModelLoadError(f"{path}: the tokenizer files cannot be loaded ({type(e).__name__}: {e})") from e
