"""Pipeline parallelism: which decoder layers a stage holds, and the point-to-point transfers between stages.

Stage s of `size` holds the contiguous layers `[first, end)` of `split_layers`: layer counts as even as
they go, the later stages taking one more when `size` does not divide the count (vLLM's rule). The first
stage holds the embedding, the last the final norm and the LM head. With T-way tensor parallelism inside each
stage, stage s runs on ranks `[s*T, (s+1)*T)` (`stage_rank`), which form its tensor-parallel group:

    rank:   0      1      2      3          (pipeline 2 x tensor parallel 2)
    stage:  0      0      1      1          hidden states go rank t of stage s -> rank t of stage s+1
    tp:     0      1      0      1          logits: the last stage's tensor-parallel rank 0 -> rank 0
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ShardingError
from .group import TPGroup


@dataclass(frozen=True)
class Stage:
    """Stage `index` of `size`: decoder layers `[first, end)` of the model's `num_layers`."""

    index: int
    size: int
    first: int
    end: int
    num_layers: int

    def __post_init__(self) -> None:
        if not (0 <= self.index < self.size and 0 <= self.first < self.end <= self.num_layers):
            raise ValueError(f"bad stage {self}")

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1

    def __contains__(self, layer: int) -> bool:
        return self.first <= layer < self.end


def whole(num_layers: int) -> Stage:
    """The one stage of an unsplit model."""
    return Stage(0, 1, 0, num_layers, num_layers)


def split_layers(num_layers: int, size: int) -> list[Stage]:
    """The stages of `num_layers` over `size` ranks: stage s holds `[s*L//size, (s+1)*L//size)`.
    ShardingError when a stage would hold no layer."""
    if size > num_layers:
        raise ShardingError(f"pipeline_parallel_size {size} exceeds the model's {num_layers} decoder layers")
    bounds = [s * num_layers // size for s in range(size + 1)]
    return [Stage(s, size, bounds[s], bounds[s + 1], num_layers) for s in range(size)]


def stage_rank(stage: int, tp_rank: int, tp_size: int) -> int:
    """The rank (in the group of every stage's ranks) of tensor-parallel rank `tp_rank` of stage `stage`."""
    return stage * tp_size + tp_rank


def stage_group_name(stage: int) -> str:
    """The rendezvous name of stage `stage`'s tensor-parallel group (`group.connect`)."""
    return f"hybridcache_stage{stage}"


def send_tensor(group: TPGroup, x: torch.Tensor, dst: int) -> None:
    """Send `x` (contiguous; the receiver knows its shape and dtype) to rank `dst`; raises after the
    group's timeout."""
    group.pg.send([x.contiguous()], dst, 0).wait(group.timeout)


def recv_tensor(group: TPGroup, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
    """A tensor of `shape` and `dtype` from rank `src`, on this rank's device; raises after the timeout."""
    x = torch.empty(shape, dtype=dtype, device=group.device)
    group.pg.recv([x], src, 0).wait(group.timeout)
    return x


def send_object(group: TPGroup, obj: Any, dst: int) -> None:
    """Send a picklable object (its length, then its bytes) to rank `dst`."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    send_tensor(group, torch.tensor([data.numel()], dtype=torch.int64, device=group.device), dst)
    send_tensor(group, data.to(group.device), dst)


def recv_object(group: TPGroup, src: int) -> Any:
    """An object `send_object` sent from rank `src`."""
    n = int(recv_tensor(group, (1,), torch.int64, src).item())
    return pickle.loads(recv_tensor(group, (n,), torch.uint8, src).cpu().numpy().tobytes())
