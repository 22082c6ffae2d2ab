"""Registers and spills of the recurrent verify and decode kernels, the conv update and the MoE routers as the
engine launches them, compiled for the H200 (sm_90) on this machine: each op's wrapper runs on CPU tensors at
the 1B-class shapes (verify and decode: batch 64, raw gates, bf16 inputs and histories, fp32 states; routers:
hidden 2048, 8 experts, the logits computed in the kernel, one token, as CUDA runs a program a token) with its
launch captured, which is then compiled as the JIT would (`benchmarks/sm90_compile.py`) and read with
Triton's bundled ptxas and nvdisasm. No GPU, no timing: whether a change made a kernel's full registers spill to
local memory, which the interpreter cannot say, and its global loads (16-byte ones among them), shared-memory
stores and barriers (a layout change through shared memory costs a store, a barrier and a load). Also the MoE
experts' one-pair kernels at batch 1 (kimi_linear's shared expert of one part, qwen3_next's of four with its gate).

    PYTHONPATH=. python benchmarks/kernel_registers.py
"""
from __future__ import annotations

import os
from typing import Callable

os.environ.pop("TRITON_INTERPRET", None)  # interpreted functions do not compile

import torch  # noqa: E402

from benchmarks.sm90_compile import captured_launches, compile_launch, ptxas_report, sass_counts  # noqa: E402
from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton  # noqa: E402
from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton  # noqa: E402
from hybridcache.ops.gdn.decode import RawGate  # noqa: E402
from hybridcache.ops.gdn.triton_verify import gdn_verify_triton  # noqa: E402
from hybridcache.ops.kda.gate import KDARawGate  # noqa: E402
from hybridcache.ops.kda.triton_verify import kda_verify_triton  # noqa: E402
from hybridcache.ops.mamba2.common import NO_LIMIT  # noqa: E402
from hybridcache.ops.mamba2.triton_decode import mamba2_decode_triton  # noqa: E402
from hybridcache.ops.mamba2.triton_verify import mamba2_verify_triton  # noqa: E402
from hybridcache.ops.mamba2.triton_verify_heads import mamba2_verify_heads_triton  # noqa: E402
from hybridcache.ops.moe import SharedExpert  # noqa: E402
from hybridcache.ops.moe.experts_triton import fused_experts_triton  # noqa: E402
from hybridcache.ops.moe.routers_triton import group_topk_triton, softmax_topk_triton  # noqa: E402

BATCH, HIST, DRAFTS = 64, 16, 3
BF16 = torch.bfloat16


def _bf(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=BF16)


def gdn(T: int, block_v: int | None = None, warps: int | None = None) -> None:
    """qwen3_next 1b: 16 key / 32 value heads of 128."""
    B, S, H, HV, K = BATCH, BATCH, 16, 32, 128
    gate = RawGate(_bf(B, T, HV), _bf(B, T, HV), torch.zeros(HV), torch.zeros(HV))
    gdn_verify_triton(_bf(B, T, H, K), _bf(B, T, H, K), _bf(B, T, HV, K), None, None, torch.zeros(S, HV, K, K),
                      _bf(S, 2, HIST, HV, K), _bf(S, 2, HIST, H, K), torch.zeros(S, 2, HV, HIST),
                      torch.zeros(S, 2, HV, HIST), torch.zeros(S, dtype=torch.int32), torch.zeros(S, dtype=torch.int32),
                      torch.arange(B), use_qk_l2norm_in_kernel=True, block_v=block_v, num_warps=warps, gate=gate)


def kda(T: int, block_v: int | None = None, warps: int | None = None) -> None:
    """kimi_linear 1b: 16 heads of 128."""
    B, S, H, K = BATCH, BATCH, 16, 128
    gate = KDARawGate(_bf(B, T, H, K), _bf(B, T, H), torch.zeros(H), torch.zeros(H * K))
    kda_verify_triton(_bf(B, T, H, K), _bf(B, T, H, K), _bf(B, T, H, K), None, None, torch.zeros(S, H, K, K),
                      _bf(S, DRAFTS, H, K), torch.zeros(S, DRAFTS, H, K), _bf(S, DRAFTS, H, K),
                      torch.zeros(S, DRAFTS, H), torch.zeros(S, dtype=torch.int32), torch.arange(B),
                      use_qk_l2norm_in_kernel=True, block_v=block_v, num_warps=warps, gate=gate)


def mamba2(T: int, closed_form: bool | None = None, heads: bool = False) -> None:
    """nemotron_h 1b: 64 heads of 64, 8 groups, state 128; `heads`: the heads form (`triton_verify_heads`)."""
    B, S, H, P, G, N = BATCH, BATCH, 64, 64, 8, 128
    args = (_bf(B, T, H, P), _bf(B, T, H), torch.zeros(H), _bf(B, T, G, N), _bf(B, T, G, N), torch.zeros(S, H, P, N),
            _bf(S, 2, HIST, H, P), _bf(S, 2, HIST, G, N), torch.zeros(S, 2, H, HIST), torch.zeros(S, 2, H, HIST),
            torch.zeros(S, dtype=torch.int32), torch.zeros(S, dtype=torch.int32), torch.arange(B))
    if heads:
        mamba2_verify_heads_triton(*args, torch.zeros(H), torch.zeros(H), NO_LIMIT, run=8)
        return
    mamba2_verify_triton(*args, D=torch.zeros(H), dt_bias=torch.zeros(H), closed_form=closed_form)


def decode(op: str) -> None:
    """Plain decode at batch 64: GDN or KDA as their verify above (32 value columns, the CUDA default there:
    the CPU's choice is not halved by SM count), Mamba2 as nemotron_h 1b."""
    B = BATCH
    if op == "mamba2":
        mamba2_decode_triton(_bf(B, 64, 64), _bf(B, 64), torch.zeros(64), _bf(B, 8, 128), _bf(B, 8, 128),
                             torch.zeros(B, 64, 64, 128), torch.arange(B), D=torch.zeros(64), dt_bias=torch.zeros(64))
        return
    HV = 32 if op == "gdn" else 16
    gate = (RawGate(_bf(B, 1, HV), _bf(B, 1, HV), torch.zeros(HV), torch.zeros(HV)) if op == "gdn" else
            KDARawGate(_bf(B, 1, 16, 128), _bf(B, 1, 16), torch.zeros(16), torch.zeros(16 * 128)))
    delta_rule_decode_triton(_bf(B, 1, 16, 128), _bf(B, 1, 16, 128), _bf(B, 1, HV, 128), None, None,
                             torch.zeros(B, HV, 128, 128), torch.arange(B), use_qk_l2norm_in_kernel=True, block_v=32,
                             gate=gate)


def conv_update(T: int) -> None:
    """kimi_linear 1b's conv window update (q, k, v: 6,144 channels, kernel 4, k = 3 drafts of room), silu."""
    causal_conv1d_update_triton(_bf(BATCH, T, 6144), _bf(6144, 4), None, _bf(BATCH, 6144, 6), torch.arange(BATCH),
                                "silu")


def router(family: str, tokens: int) -> None:
    """kimi_linear's grouped sigmoid top-2 (fp32 weight) or qwen3_next's softmax top-2 (bf16), 8 experts of 2048."""
    x = _bf(tokens, 2048)
    if family == "kimi_linear":
        group_topk_triton(x, torch.zeros(8), 2, 1, 1, True, 2.446, weight=torch.zeros(8, 2048))
    else:
        softmax_topk_triton(x, 2, True, weight=_bf(8, 2048))


def experts(parts: int) -> None:
    """One token's routed top-2 of 8 experts of 512 over 2048 and a shared expert of `parts` parts (qwen3_next's
    four with its gate logit, kimi_linear's one), at the tiling CUDA takes at batch 1 (the CPU tensors would get
    the interpreter's)."""
    D, I = 2048, 512
    shared = SharedExpert(_bf(parts * I, D), _bf(D, parts * I), _bf(parts * I, D), _bf(D) if parts > 1 else None)
    fused_experts_triton(_bf(1, D), torch.tensor([[1, 5]]), torch.rand(1, 2), _bf(8, I, D), _bf(8, D, I), _bf(8, I, D),
                         "silu", BF16, shared=shared, up_launch=(4, 1024, 4), down_launch=(4, 512, 4))


def cases() -> list[tuple[str, Callable[[], None]]]:
    """(label, a call of the op) at T = 4 (a k = 3 verify) over tilings, and T = 1 (a one-token step); a
    tiling not named is the wrapper's default."""
    out = []
    for op in (gdn, kda):
        out.append((f"{op.__name__} T=4 default", lambda op=op: op(4)))
        for bv, warps in ((16, 1), (32, 1), (32, 2)):
            out.append((f"{op.__name__} T=4", lambda op=op, bv=bv, warps=warps: op(4, bv, warps)))
        out.append((f"{op.__name__} T=1 default", lambda op=op: op(1)))
    out += [("mamba2 T=4 default", lambda: mamba2(4)), ("mamba2 T=1 default", lambda: mamba2(1))]
    out.append(("mamba2 T=4 token by token", lambda: mamba2(4, closed_form=False)))
    out.append(("mamba2 T=4 heads form", lambda: mamba2(4, heads=True)))
    for op in ("gdn", "kda", "mamba2"):
        out.append((f"{op} decode default", lambda op=op: decode(op)))
    out += [("conv update T=1 default", lambda: conv_update(1)), ("conv update T=4 default", lambda: conv_update(4))]
    for family in ("kimi_linear", "qwen3_next"):  # one token: as CUDA launches every batch (a program a token)
        out.append((f"router {family}", lambda f=family: router(f, 1)))
    out += [("experts kimi_linear", lambda: experts(1)), ("experts qwen3_next", lambda: experts(4))]
    return out


def tiling(launch) -> str:
    """The launch's tile constants and warps, as 'BV=32 warps=1'."""
    kw = launch.kwargs
    tile = " ".join(f"{n}={kw[n]}" for n in ("BV", "BLOCK_P", "RUN", "BLOCK_C", "BLOCK_D") if n in kw)
    return f"{tile} warps={kw.get('num_warps', 4)}"


def main() -> None:
    print("sm_90; spills in bytes a thread; LDG global loads (16-byte ones), ahead: before the first product; STS "
          "shared-memory stores, BAR barriers")
    print(f"{'kernel':56} {'registers':>9} {'spill stores':>13} {'spill loads':>12} {'LDG (16-byte)':>14} "
          f"{'ahead':>5} {'STS':>4} {'BAR':>4}")
    for label, call in cases():
        with captured_launches() as launches:
            call()
        shown = launches[:1] if label.startswith("kda") else launches  # not KDA's second (the pending drafts')
        for launch in shown:
            kernel = compile_launch(launch)
            regs, stores, loads = ptxas_report(kernel)
            sass = sass_counts(kernel)
            name = f"{label} {launch.kernel.__name__.strip('_')} " if len(shown) > 1 else f"{label} "
            print(f"{name + tiling(launch):56} {regs:>9} {stores:>13} {loads:>12} {sass['LDG']:>7} "
                  f"({sass['LDG128']:>4}) {sass['LDG_AHEAD']:>5} {sass['STS']:>4} {sass['BAR']:>4}")


if __name__ == "__main__":
    main()
