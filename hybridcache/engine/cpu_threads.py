"""Torch threads for a model on the CPU."""
from __future__ import annotations

import logging
from typing import Any

import torch

TINY_HIDDEN_SIZE = 256
log = logging.getLogger(__name__)


def tune_cpu_threads(device: torch.device | str, config: dict[str, Any]) -> None:
    """One torch thread for a tiny model on the CPU: its matmuls are too small to split, and more threads only
    contend (the embedded default runs about 10x faster so on 2 cores). Larger models keep torch's default."""
    hidden = config.get("hidden_size")
    if torch.device(device).type == "cpu" and isinstance(hidden, int) and hidden <= TINY_HIDDEN_SIZE:
        log.info("hidden size %d on the CPU: one torch thread", hidden)
        torch.set_num_threads(1)
