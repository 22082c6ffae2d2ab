"""Token embedding table `weight [V, D]`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .params import param


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(vocab, hidden, device=device, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [N] -> [N, D]."""
        return F.embedding(ids, self.weight)
