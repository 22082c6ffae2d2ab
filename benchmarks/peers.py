"""The field's kernels the kernel benchmarks measure against, loaded only where they can run (CUDA).

- flash-linear-attention (fla-core 0.6): `fused_recurrent_gated_delta_rule`, `fused_recurrent_kda`,
  `chunk_gated_delta_rule`, `chunk_kda`.
- mamba_ssm 2.3.2's Triton kernels (`selective_state_update`, `mamba_chunk_scan_combined`). Its package
  `__init__` imports a CUDA extension that a wheel built with MAMBA_SKIP_CUDA_BUILD lacks, so the package
  is registered here without running its `__init__`, and only the Triton modules are imported. Build the
  wheel on a CPU machine with torch installed:
      MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip wheel --no-deps --no-build-isolation mamba-ssm==2.3.2.post1
Each loader returns None (and says why) when the library is missing.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path


def fla_ops() -> types.SimpleNamespace | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
    except Exception as exc:  # noqa: BLE001 - any import failure means: no peer to measure
        print(f"peers: fla unavailable ({type(exc).__name__}: {exc})")
        return None
    return types.SimpleNamespace(
        fused_recurrent_gdn=fused_recurrent_gated_delta_rule, fused_recurrent_kda=fused_recurrent_kda,
        chunk_gdn=chunk_gated_delta_rule, chunk_kda=chunk_kda)


def mamba_ssm_ops() -> types.SimpleNamespace | None:
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None or not spec.submodule_search_locations:
        print("peers: mamba_ssm unavailable (not installed)")
        return None
    if "mamba_ssm" not in sys.modules:
        package = types.ModuleType("mamba_ssm")
        package.__path__ = list(spec.submodule_search_locations)  # a namespace: its __init__ never runs
        sys.modules["mamba_ssm"] = package
    try:
        combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        update = importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    except Exception as exc:  # noqa: BLE001
        print(f"peers: mamba_ssm's Triton kernels unavailable ({type(exc).__name__}: {exc})")
        return None
    print(f"peers: mamba_ssm from {Path(spec.submodule_search_locations[0])}")
    return types.SimpleNamespace(chunk_scan=combined.mamba_chunk_scan_combined,
                                 state_update=update.selective_state_update)
