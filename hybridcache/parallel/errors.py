"""Typed errors of tensor parallelism."""
from __future__ import annotations


class ShardingError(ValueError):
    """A model dimension the tensor-parallel size cannot split (nothing was started or loaded)."""


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died, hung past the group timeout, or failed; the LLM cannot go on and
    must be closed (its requests' state lived on every rank)."""
