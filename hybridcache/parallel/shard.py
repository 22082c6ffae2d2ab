"""How a checkpoint tensor is split across tensor-parallel ranks, and the share of heads / groups a rank owns.

A sharded parameter (or a view a module names in `checkpoint_tensors`) carries a `shard` attribute: the
loader reads only its ranges from the safetensors file (`safe_open(...).get_slice`), never the whole tensor.
A tensor without one is replicated: every rank loads it whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import ShardingError
from .group import TPGroup


@dataclass(frozen=True)
class Shard:
    """Along `dim`, the checkpoint tensor has `full` entries; this rank holds the concatenation of
    `ranges` (start, length), in order."""

    dim: int
    full: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def local(self) -> int:
        return sum(n for _, n in self.ranges)

    def checkpoint_shape(self, local_shape: Sequence[int]) -> tuple[int, ...]:
        shape = list(local_shape)
        shape[self.dim] = self.full
        return tuple(shape)


def shard(t: torch.Tensor | None, dim: int, full: int, *ranges: tuple[int, int]) -> torch.Tensor | None:
    """Mark `t` as holding `ranges` of a checkpoint dim of size `full` (no mark when they cover it all);
    returns `t`."""
    if t is None or list(ranges) == [(0, full)]:
        return t
    s = Shard(dim, full, tuple(ranges))
    if s.local != t.shape[dim]:
        raise ValueError(f"shard of {s.local} entries for a tensor of {t.shape[dim]} along dim {dim}")
    t.shard = s  # read by the loader
    return t


def head_share(tp: TPGroup, n: int, what: str) -> tuple[int, int]:
    """(first, count) of `n` heads (or channels) split evenly: rank r owns [r*n/size, (r+1)*n/size)."""
    if n % tp.size:
        raise ShardingError(f"tensor_parallel_size {tp.size} does not divide {what} = {n}")
    count = n // tp.size
    return tp.rank * count, count


def group_share(tp: TPGroup, groups: int, members: int, what: str) -> tuple[int, int]:
    """(first, count) of the `groups` that this rank's share of `members` heads belongs to (member m is in
    group m // (members / groups)). When the size divides `groups` they are sharded with the heads; when
    it is a multiple of `groups` each rank holds the one group of its heads (replicated across the ranks
    that share it, as vLLM's mamba_mixer2 does); otherwise ShardingError."""
    if groups % tp.size == 0:
        return head_share(tp, groups, what)
    if tp.size % groups == 0:
        first, _ = head_share(tp, members, f"heads of {what}")
        return first // (members // groups), 1
    raise ShardingError(f"tensor_parallel_size {tp.size} neither divides nor is a multiple of {what} = {groups}")
