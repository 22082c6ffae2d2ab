"""Programmatic dependent launch (PDL, compute capability 9.0 and up) for every Triton kernel here, on unless
HYBRIDCACHE_PDL=0.

A launch with PDL may be scheduled while the kernel before it in the stream still runs; small decode kernels
(a batch-1 step launches about 150, most of them a few microseconds long) then overlap their launch and ramp-up
with their predecessor's tail. Each kernel takes `PDL: tl.constexpr` and begins with `pdl_entry(PDL)`: wait for
every grid before it to finish and its writes to be visible (before any load), then let the next launch be
scheduled. Waiting first keeps stream order exact whatever precedes (a cuBLAS GEMM or torch kernel triggers at
its end), so the results are those of plain launches, bit for bit. Captured CUDA graphs keep the programmatic
edges. `pdl_launch(t)` gives the launch options: PDL and launch_pdl on, or PDL off; tests switch `ENABLED`.

On an H100, CUDA-graph decode steps of the 1B-class checkpoints (benchmarks/step_profile.py, same machine,
back to back): batch 1 kimi_linear 1,445 against 1,318 tok/s, qwen3_next 1,142 against 1,055, nemotron_h
1,050 against 994; batch 16 kimi_linear 14,465 against 13,820 (an earlier run), qwen3_next 10,597 against 10,119.

`EARLY_TRIGGER` releases the next launch before the wait instead: the next grid may then be made resident while
this one still waits on its own predecessor, one kernel further ahead. The order stays exact: each grid still
waits for its predecessor to complete, and a grid completes only after its own wait returned.
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
    """A kernel's first statement: under PDL, wait for the grids before it, then release the next launch
    (PDL == EARLY: release it first, then wait)."""
    if PDL == EARLY:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL:
        gdc_wait()
        gdc_launch_dependents()


ENABLED = os.environ.get(ENV, "1") != "0"  # read once: a launch checks a flag (an environment lookup costs ~0.7 us)
# Off until timed in the engine's steps (benchmarks/gpu/gemv_steps.sh MODULE=pdl_triton SETTING=EARLY_TRIGGER)
EARLY_TRIGGER = False
EARLY = tl.constexpr(2)  # PDL's value for the early release
ON, ON_EARLY, OFF = {"PDL": True, "launch_pdl": True}, {"PDL": 2, "launch_pdl": True}, {"PDL": False}


def pdl_launch(t: torch.Tensor) -> dict[str, bool | int]:
    """Launch options of a kernel on `t`'s device: PDL there where ENABLED (HYBRIDCACHE_PDL not 0 when this
    module was imported) and the device is CUDA of compute capability 9.0 or more (EARLY where EARLY_TRIGGER);
    not to be mutated."""
    if ENABLED and t.is_cuda and _capability(t.device.index or 0) >= 9:
        return ON_EARLY if EARLY_TRIGGER else ON
    return OFF


@cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
