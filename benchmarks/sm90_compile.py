"""Compile a Triton op's real launches for the H200 (sm_90) on a machine without a GPU.

`captured_launches()` runs an op's Python wrapper on CPU tensors with every `kernel[grid](...)` recorded
instead of launched; `compile_launch` then compiles one as Triton's JIT would on the GPU: the same binder
specialises the arguments (an integer equal to 1 becomes a constant, integers and pointers divisible by 16
carry that fact), which decides the layouts, the vector widths and so the registers. A compile from a
hand-written signature (every stride an unknown i64) gives other layouts than the launch does.
`ptxas_report` reads the registers and spills of the result from Triton's bundled ptxas. A wrapper that
chooses by its tensors' device (a tiling from the SM count, one token a program on CUDA) makes its CPU
choice here: pass the tiling, or take shapes where both choices agree.

Needs triton's NVIDIA backend (not a GPU); run without TRITON_INTERPRET (interpreted functions do not compile).
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterator

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nvidia
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

H200 = GPUTarget("cuda", 90, 32)


@dataclass
class Launch:
    kernel: JITFunction
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def captured_launches() -> Iterator[list[Launch]]:
    """Within the block, `kernel[grid](*args, **kwargs)` records a Launch into the yielded list and runs
    nothing (the wrapper's outputs stay unwritten)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels do not compile")
    launches: list[Launch] = []
    original = JITFunction.__getitem__
    JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: launches.append(Launch(fn, a, k)))
    try:
        yield launches
    finally:
        JITFunction.__getitem__ = original


def compile_launch(launch: Launch, target: GPUTarget = H200):
    """The CompiledKernel the JIT would build for `launch` on `target` (a Triton or a Gluon kernel: Gluon's run
    in no interpreter, but compile here all the same)."""
    fn, backend = launch.kernel, make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, specialization, options)
    return triton.compile(_source(fn)(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _source(fn):
    """The compiler's source class for a kernel: Gluon's where `fn` is a Gluon kernel."""
    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    except ImportError:  # a Triton without Gluon
        return ASTSource
    return GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource


def ptxas_report(kernel, arch: int = 90) -> tuple[int, int, int]:
    """(registers a thread, spill-store bytes, spill-load bytes) of a compiled kernel's PTX."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        out = subprocess.run([nvidia.get_ptxas(arch).path, f"-arch=sm_{arch}a", "-v", ptx.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    stores, loads = (int(m) for m in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text).groups())
    return regs, stores, loads


def sass_counts(kernel) -> dict[str, int]:
    """Instruction counts of a compiled kernel's SASS (Triton's bundled nvdisasm): global loads (LDG), their
    16-byte vector share (LDG128) and those issued before the first fp32 product (LDG_AHEAD: loads
    in flight together, rather than each after the products of the one before); shared-memory stores and loads
    (STS, LDS) and barriers (BAR), the marks of a layout change through shared memory (a broadcast or a
    cross-warp reduction); and all instructions."""
    nvdisasm = os.path.join(os.path.dirname(nvidia.get_ptxas(90).path), "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        text = subprocess.run([nvdisasm, "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)", text)
    counts = {name: sum(op.split(".")[0] == name for op in ops) for name in ("LDG", "STS", "LDS", "BAR")}
    first = next((i for i, op in enumerate(ops) if op.startswith(("FFMA", "FMUL"))), len(ops))  # HFMA2.MMA zeroes
    return {**counts, "LDG128": sum(op.startswith("LDG.E.128") for op in ops),
            "LDG_AHEAD": sum(op.startswith("LDG") for op in ops[:first]), "instructions": len(ops)}
