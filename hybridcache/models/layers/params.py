"""Parameter creation and the checkpoint-name -> destination-tensor walk used by the loader."""
from __future__ import annotations

import torch
from torch import nn


def param(*shape: int, device: torch.device | str, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised, non-trainable parameter (the loader fills it)."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def checkpoint_targets(module: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the tensor (or view) to copy it into.

    A module with a `checkpoint_tensors()` method names its own tensors (e.g. stacked experts stored one
    expert per checkpoint tensor); otherwise its direct parameters and persistent buffers are used as named.
    """
    own = getattr(module, "checkpoint_tensors", None)
    if own is not None:
        targets = {prefix + k: v for k, v in own().items()}
    else:
        targets = {prefix + k: p for k, p in module.named_parameters(recurse=False)}
        skip = module._non_persistent_buffers_set
        targets.update({prefix + k: b for k, b in module.named_buffers(recurse=False) if k not in skip})
    for name, child in module.named_children():
        targets.update(checkpoint_targets(child, f"{prefix}{name}."))
    return targets
