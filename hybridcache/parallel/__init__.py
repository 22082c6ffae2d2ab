"""Tensor parallelism on torch.distributed (gloo on CPU, NCCL on CUDA): the rank group and its collectives,
how a tensor is sharded, and the column- / row-parallel linears. See docs/parallel.md."""
from .errors import ShardingError, TensorParallelError
from .group import SINGLE, TPGroup
from .shard import Shard, head_share, group_share, shard

__all__ = ["SINGLE", "Shard", "ShardingError", "TPGroup", "TensorParallelError", "group_share", "head_share", "shard"]
