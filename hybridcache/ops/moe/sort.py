"""Token copies sorted by expert, on the device: the layout the grouped paths (sort-by-expert GEMMs, the
sorted Triton kernels) read. Torch only; nothing is read on the host, so it is CUDA-graph capturable."""
from __future__ import annotations

import torch


def sort_by_expert(index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """index [N, k] -> (order [N*k]: the pairs p = n*k + j sorted by expert, stable; token [N*k]: order // k;
    ends [E] int32: the end of each expert's run in `order`). Run ends come from a search over the sorted
    ids."""
    flat = index.flatten()
    order = flat.argsort(stable=True)
    experts = torch.arange(num_experts, device=index.device, dtype=flat.dtype)
    ends = torch.searchsorted(flat[order], experts, right=True).to(torch.int32)
    return order, order // index.shape[1], ends
