"""Where chunked prefill's time goes, ours vs the peer, at the shapes of `ops_kernels.py` (one GPU).

For each op (GDN, KDA, Mamba2) and each side (ours: slots in and out; the peer called directly): the wall
time per call (CUDA events), the GPU kernel time per call and the host time to launch one call (both
from torch.profiler), and the kernels that take the most GPU time. A wall time well above the kernel time
means the call is bound by its launches or by a host sync.

    PYTHONPATH=. python benchmarks/profile_prefill.py --tokens 8192 --top 8
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import ops_kernels as ok
from benchmarks.ops_mamba2 import timed
from benchmarks.peers import fla_ops, mamba_ssm_ops
from hybridcache.ops.gdn import gdn_prefill
from hybridcache.ops.kda import kda_prefill
from hybridcache.ops.mamba2 import mamba2_prefill

CALLS = 5


def breakdown(name: str, fn: Callable[[], object], top: int) -> None:
    wall_ms = timed(fn, ok.DEV, 3) * 1e3
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    launch_ms = (time.perf_counter() - start) * 1e3  # host time to issue one call (a sync inside shows here)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / CALLS / 1e3
    syncs = sum(e.count for e in prof.key_averages() if "Synchronize" in e.key or e.key == "aten::item") / CALLS
    print(f"{name:28} wall {wall_ms:7.3f} ms  kernels {gpu_ms:7.3f} ms  host launch {launch_ms:7.3f} ms  "
          f"syncs/call {syncs:.0f}  launches/call {sum(e.count for e in kernels) / CALLS:.0f}")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"    {e.self_device_time_total / CALLS / 1e3:7.3f} ms x{e.count // CALLS:<3} {e.key[:110]}")


def delta_rule(op: str, tokens: int, fla, top: int) -> None:
    """GDN (H key / HV value heads, a log-decay per value head) or KDA (H heads, one per channel)."""
    if op == "gdn":
        H, HV, K, V = ok.GDN["H"], ok.GDN["HV"], ok.GDN["K"], ok.GDN["V"]
        gate, ours, peer = (HV,), gdn_prefill, fla.chunk_gdn
    else:
        H, K, V = ok.KDA["H"], ok.KDA["K"], ok.KDA["V"]
        HV, gate, ours, peer = H, (H, K), kda_prefill, fla.chunk_kda
    cu, slots, has_initial = ok.prefill_inputs([tokens])
    q, k, v = ok.rand(tokens, H, K), ok.rand(tokens, H, K), ok.rand(tokens, HV, V)
    g = -torch.rand(tokens, *gate, device=ok.DEV) * 0.1
    beta = torch.rand(tokens, HV, device=ok.DEV).to(ok.ACT)
    ssm = torch.randn(2, HV, K, V, device=ok.DEV) * 0.1
    breakdown(f"{op} ours", lambda: ours(q, k, v, g, beta, cu, ssm, slots, has_initial,
                                         use_qk_l2norm_in_kernel=True), top)
    h0 = ssm[slots]
    breakdown(f"{op} fla", lambda: peer(q[None], k[None], v[None], g[None], beta[None], initial_state=h0,
                                        output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True), top)


def mamba2(tokens: int, mamba, top: int) -> None:
    H, P, N, G, chunk = ok.MAMBA2["H"], ok.MAMBA2["P"], ok.MAMBA2["N"], ok.MAMBA2["G"], ok.MAMBA2["chunk"]
    cu, slots, has_initial = ok.prefill_inputs([tokens])
    x, B, C, dt = ok.rand(tokens, H, P), ok.rand(tokens, G, N), ok.rand(tokens, G, N), ok.rand(tokens, H)
    A = -torch.rand(H, device=ok.DEV) - 0.5
    D, dt_bias = torch.randn(H, device=ok.DEV), torch.randn(H, device=ok.DEV)
    ssm = torch.randn(2, H, P, N, device=ok.DEV) * 0.1
    breakdown("mamba2 ours", lambda: mamba2_prefill(x, dt, A, B, C, ssm, slots, has_initial, cu, D=D,
                                                    dt_bias=dt_bias, chunk_size=chunk), top)
    if mamba is not None:
        h0 = ssm[slots]
        breakdown("mamba2 mamba_ssm", lambda: mamba.chunk_scan(
            x[None], dt[None], A, B[None], C[None], chunk, D=D, dt_bias=dt_bias, dt_softplus=True,
            initial_states=h0, return_final_states=True), top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda", "mamba2"])
    args = ap.parse_args()
    fla, mamba = fla_ops(), mamba_ssm_ops()
    for op in args.ops:
        if op == "mamba2":
            mamba2(args.tokens, mamba, args.top)
        elif fla is not None:
            delta_rule(op, args.tokens, fla, args.top)


if __name__ == "__main__":
    main()
