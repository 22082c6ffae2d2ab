"""Registers and spills of the recurrent verify kernels at their tilings, compiled for the H200 (sm_90) on
this machine: Triton's compiler and its bundled ptxas run on the CPU (`ptxas -v` on the kernel's PTX). No
GPU needed, and no timing: what it shows is whether a change made a kernel's full registers spill to local
memory, which the interpreter cannot say.

    PYTHONPATH=. python benchmarks/kernel_registers.py
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # interpreted functions do not compile

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia import compiler as nvidia  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from hybridcache.ops.delta_rule_verify_triton import BLOCK_V, GDN_BLOCK_V, verify_warps  # noqa: E402
from hybridcache.ops.gdn import triton_verify as gdn_verify  # noqa: E402
from hybridcache.ops.kda import triton_verify as kda_verify  # noqa: E402
from hybridcache.ops.mamba2 import triton_verify as mamba2_verify  # noqa: E402

BF16_IO = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), "*bf16")


def runtime_signature(fn, types: dict[str, str]) -> dict[str, str]:
    """Every runtime argument of `fn`: `types` by name, else a pointer to fp32 (`*_ptr`) or an i64."""
    consts = {fn.arg_names[i] for i in fn.constexprs}
    return {n: types.get(n, "*fp32" if n.endswith("_ptr") else "i64") for n in fn.arg_names if n not in consts}


def ptxas_report(fn, types: dict[str, str], consts: dict, num_warps: int) -> tuple[int, int, int]:
    """(registers a thread, spill-store bytes, spill-load bytes) of `fn` compiled for sm_90."""
    sig = {**runtime_signature(fn, types), **{n: "constexpr" for n in consts}}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        out = subprocess.run([nvidia.get_ptxas(90).path, "-arch=sm_90a", "-v", ptx.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    stores, loads = (int(m) for m in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text).groups())
    return regs, stores, loads


def cases() -> list[tuple[str, object, dict, dict, int]]:
    """(label, kernel, argument types, constexprs, warps) at the engine's shapes (1B-class): the delta-rule
    verify kernels at T = 4 over three tilings and at T = 1 (a one-token step) at the default warps."""
    gdn_types = {**BF16_IO, "u_ptr": "*bf16", "hk_ptr": "*bf16", "pnat_ptr": "*i32", "buf_ptr": "*i32",
                 "slot_ptr": "*i64", "scale": "fp32"}
    kda_types = {**BF16_IO, "pk_ptr": "*bf16", "pv_ptr": "*bf16", "n_ptr": "*i32", "slot_ptr": "*i64", "scale": "fp32"}

    def gdn(T: int, bv: int) -> dict:
        return {"T": T, "H": 16, "HV": 32, "K": 128, "V": 128, "HIST": 16, "BK": 128, "BV": bv, "L2NORM": True,
                "RAW_GATE": True}

    def kda(T: int, bv: int) -> dict:
        return {"T": T, "H": 16, "K": 128, "V": 128, "P": 3, "BK": 128, "BV": bv, "L2NORM": True, "RAW_GATE": True}

    out = []
    for bv, warps in ((16, 1), (32, 1), (32, 2)):
        out.append((f"gdn verify T=4 BV={bv} warps={warps}", gdn_verify._gdn_verify_kernel, gdn_types, gdn(4, bv), warps))
        out.append((f"kda verify T=4 BV={bv} warps={warps}", kda_verify._kda_verify_kernel, kda_types, kda(4, bv), warps))
    w1 = verify_warps(1)
    out.append((f"gdn verify T=1 BV={GDN_BLOCK_V} warps={w1}", gdn_verify._gdn_verify_kernel, gdn_types,
                gdn(1, GDN_BLOCK_V), w1))
    out.append((f"kda verify T=1 BV={BLOCK_V} warps={w1}", kda_verify._kda_verify_kernel, kda_types, kda(1, BLOCK_V), w1))
    out.append(("mamba2 verify BLOCK_P=32 warps=4", mamba2_verify._verify_kernel,
                {**dict.fromkeys(("x_ptr", "dt_ptr", "B_ptr", "C_ptr", "y_ptr", "rx_ptr", "rb_ptr"), "*bf16"),
                 "pnat_ptr": "*i32", "buf_ptr": "*i32", "slot_ptr": "*i64", "dt_lo": "fp32", "dt_hi": "fp32",
                 "hist": "i32"},
                {"STEPS": 4, "HEAD_DIM": 64, "DSTATE": 128, "REPS": 8, "BLOCK_P": 32, "BLOCK_N": 128, "BLOCK_H": 16,
                 "HAS_D": True, "HAS_BIAS": True, "TP": 4}, 4))
    return out


def main() -> None:
    print(f"{'kernel':36} {'registers':>9} {'spill stores':>13} {'spill loads':>12}  (bytes a thread, sm_90)")
    for label, fn, types, consts, warps in cases():
        regs, stores, loads = ptxas_report(fn, types, consts, warps)
        print(f"{label:36} {regs:>9} {stores:>13} {loads:>12}")


if __name__ == "__main__":
    main()
