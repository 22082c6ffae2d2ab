"""Programmatic dependent launch (PDL, compute capability 9.0 and up) for every Triton kernel here, on unless
HYBRIDCACHE_PDL=0.

A launch with PDL may be scheduled while the kernel before it in the stream still runs; small decode kernels
(a batch-1 step launches about 150, most of them a few microseconds long) then overlap their launch and ramp-up
with their predecessor's tail. Each kernel takes `PDL: tl.constexpr` and begins with `pdl_entry(PDL)`: wait for
every grid before it to finish and its writes to be visible (before any load but of a parameter no kernel writes,
through a function in BEFORE_WAIT), then let the next launch be scheduled. Waiting first keeps stream order exact
whatever precedes (a cuBLAS GEMM or torch kernel triggers at its end), so the results are those of plain launches,
bit for bit. Captured CUDA graphs keep the programmatic edges. `pdl_launch(t)` gives the launch options: PDL and
launch_pdl on, or PDL off; tests switch `ENABLED`. On an H100, CUDA-graph decode steps of the 1B-class
checkpoints (benchmarks/step_profile.py, same machine, back to back): batch 1 kimi_linear 1,445 against 1,318
tok/s, qwen3_next 1,142 against 1,055, nemotron_h 1,050 against 994; batch 16 kimi_linear 14,465 against 13,820
(an earlier run), qwen3_next 10,597 against 10,119.

Releasing the next launch before the wait instead (the next grid resident one kernel further ahead; each grid still
waits for its predecessor, so the order is the same; session 48, history 74535d0) did not pay: H100, batch-1 graph
steps, tok/s after / before the wait, kimi_linear 1,589 / 1,596, qwen3_next 1,232 / 1,215, nemotron_h 1,241 / 1,217.
"""
from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENV = "HYBRIDCACHE_PDL"


@triton.jit
def pdl_entry(PDL: tl.constexpr):
    """A kernel's first statement: under PDL, wait for the grids before it, then release the next launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


# jit functions a kernel may call before its `pdl_entry`: each reads only parameters no kernel writes, which can
# stream in while the kernels before it finish (the routers' weight: routers_triton._weights_first)
BEFORE_WAIT = frozenset({"_weights_first"})

ENABLED = os.environ.get(ENV, "1") != "0"  # read once: a launch checks a flag (an environment lookup costs ~0.7 us)
ON, OFF = {"PDL": True, "launch_pdl": True}, {"PDL": False}


def pdl_launch(t: torch.Tensor) -> dict[str, bool]:
    """Launch options of a kernel on `t`'s device: PDL there where ENABLED (HYBRIDCACHE_PDL not 0 when this
    module was imported) and the device is CUDA of compute capability 9.0 or more; not to be mutated."""
    return ON if ENABLED and t.is_cuda and _capability(t.device.index or 0) >= 9 else OFF


@cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
