"""Recurrent kernels on the GPU, side by side in one run: ours vs the field's vs the copy roofline.

decode   one token per row from a pool of slots, at each batch size, every call a CUDA-graph replay:
         GDN (16 key / 32 value heads, K = V = 128) — ours (slots indexed in the kernel) vs fla's
         `fused_recurrent_gated_delta_rule` plus the gather/scatter it needs, and fla's kernel alone;
         KDA (16 heads x 128) — ours vs fla's `fused_recurrent_kda_fwd` with its own slot indices (in place);
         Mamba2 (64 heads x 64, state 128, 8 groups) — ours vs mamba_ssm's `selective_state_update` with
         `state_batch_indices`; the conv1d update (Mamba2's 6,144 channels, width 4) — ours only.
         GB/s counts the state read and written (the inputs are < 1% of it), against the measured
         device-to-device copy bandwidth.
prefill  8,192 tokens as one sequence and as 8 x 1,024, from initial states in the slots, final states
         written back: ours vs fla's `chunk_gated_delta_rule` / `chunk_kda` called directly, and Mamba2's
         ours vs mamba_ssm's `mamba_chunk_scan_combined`; our torch path (the CPU path) for reference.
         Eager calls (fla's varlen set-up reads the sequence lengths on the host).

    PYTHONPATH=. python benchmarks/ops_kernels.py --json bench-out/ops_kernels.json
    PYTHONPATH=. python benchmarks/ops_kernels.py --skip-decode --prefill-ops mamba2 --prefill-shapes 8x1024

Each figure is the median of 5 timed runs after warm-up calls at the same shapes (CUDA events).
"""
from __future__ import annotations

import argparse
from typing import Callable

import torch

from benchmarks.ops_mamba2 import copy_bandwidth, timed
from benchmarks.peers import fla_ops, mamba_ssm_ops
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed
from hybridcache.ops.conv1d import causal_conv1d_update
from hybridcache.ops.gdn import chunk_gated_delta_rule, gdn_decode, gdn_prefill
from hybridcache.ops.kda import chunk_kda, kda_decode, kda_prefill
from hybridcache.ops.mamba2 import mamba2_chunk_scan_varlen, mamba2_decode, mamba2_prefill

DEV = "cuda"
ACT = torch.bfloat16
GDN = dict(H=16, HV=32, K=128, V=128)
KDA = dict(H=16, K=128, V=128)
MAMBA2 = dict(H=64, P=64, N=128, G=8, W=4, chunk=128)


def rand(*shape: int, scale: float = 1.0, dtype: torch.dtype = ACT) -> torch.Tensor:
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def pool_and_slots(batch: int, *row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool of 2 x batch fp32 states (each row's slot is random) and the batch's slots."""
    size = 2 * batch
    return torch.randn(size, *row, device=DEV) * 0.1, torch.randperm(size, device=DEV)[:batch]


def graph_seconds(fn: Callable[[], object], iters: int) -> float:
    return timed(graphed(fn, DEV, True), DEV, iters)


def gdn_decode_case(batch: int, fla, iters: int) -> dict:
    H, HV, K, V = GDN["H"], GDN["HV"], GDN["K"], GDN["V"]
    q, k = rand(batch, 1, H, K), rand(batch, 1, H, K)
    v = rand(batch, 1, HV, V)
    g = -torch.rand(batch, 1, HV, device=DEV) * 0.1
    beta = torch.rand(batch, 1, HV, device=DEV)
    ssm, slots = pool_and_slots(batch, HV, K, V)
    row = dict(ours_us=graph_seconds(lambda: gdn_decode(q, k, v, g, beta, ssm, slots, use_qk_l2norm_in_kernel=True),
                                     iters) * 1e6)
    if fla is not None:
        h0 = ssm[slots]

        def fla_gathered() -> None:
            _, h = fla.fused_recurrent_gdn(q, k, v, g=g, beta=beta, initial_state=ssm.index_select(0, slots),
                                           output_final_state=True, use_qk_l2norm_in_kernel=True)
            ssm.index_copy_(0, slots, h)

        row["fla_gather_us"] = graph_seconds(fla_gathered, iters) * 1e6
        row["fla_kernel_us"] = graph_seconds(lambda: fla.fused_recurrent_gdn(
            q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True),
            iters) * 1e6
    return dict(row, state_bytes=batch * HV * K * V * 4 * 2)


def kda_decode_case(batch: int, fla, iters: int) -> dict:
    H, K, V = KDA["H"], KDA["K"], KDA["V"]
    q, k, v = rand(batch, 1, H, K), rand(batch, 1, H, K), rand(batch, 1, H, V)
    g = -torch.rand(batch, 1, H, K, device=DEV) * 0.1
    beta = torch.rand(batch, 1, H, device=DEV)
    ssm, slots = pool_and_slots(batch, H, K, V)
    row = dict(ours_us=graph_seconds(lambda: kda_decode(q, k, v, g, beta, ssm, slots, use_qk_l2norm_in_kernel=True),
                                     iters) * 1e6)
    if fla is not None:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        indices = slots.to(torch.int32)
        row["fla_indexed_us"] = graph_seconds(lambda: fused_recurrent_kda_fwd(
            q, k, v, g, beta, initial_state=ssm, inplace_final_state=True, ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True), iters) * 1e6
    return dict(row, state_bytes=batch * H * K * V * 4 * 2)


def mamba2_decode_case(batch: int, mamba, iters: int) -> dict:
    H, P, N, G = MAMBA2["H"], MAMBA2["P"], MAMBA2["N"], MAMBA2["G"]
    x, B, C = rand(batch, H, P), rand(batch, G, N), rand(batch, G, N)
    dt = rand(batch, H)
    A = -torch.rand(H, device=DEV) - 0.5
    D, dt_bias = torch.randn(H, device=DEV), torch.randn(H, device=DEV)
    ssm, slots = pool_and_slots(batch, H, P, N)
    row = dict(ours_us=graph_seconds(lambda: mamba2_decode(x, dt, A, B, C, ssm, slots, D, dt_bias), iters) * 1e6)
    if mamba is not None:
        # mamba_ssm's per-channel form, tied across the head dim by zero strides (as Mamba2 calls it)
        dt_p, A_p = dt[..., None].expand(batch, H, P), A[:, None, None].expand(H, P, N)
        D_p, bias_p = D[:, None].expand(H, P), dt_bias[:, None].expand(H, P)
        indices = slots.to(torch.int32)
        row["mamba_ssm_us"] = graph_seconds(lambda: mamba.state_update(
            ssm, x, dt_p, A_p, B, C, D_p, dt_bias=bias_p, dt_softplus=True, state_batch_indices=indices),
            iters) * 1e6
    return dict(row, state_bytes=batch * H * P * N * 4 * 2)


def conv_update_case(batch: int, iters: int) -> dict:
    H, P, N, G, W = MAMBA2["H"], MAMBA2["P"], MAMBA2["N"], MAMBA2["G"], MAMBA2["W"]
    channels = H * P + 2 * G * N
    x = rand(batch, 1, channels)
    weight, bias = rand(channels, W), rand(channels)
    conv, slots = pool_and_slots(batch, channels, W - 1)
    conv = conv.to(ACT)
    row = dict(ours_us=graph_seconds(lambda: causal_conv1d_update(x, weight, bias, conv, slots, "silu"), iters) * 1e6)
    return dict(row, state_bytes=batch * channels * (W - 1) * 2 * 2)


def prefill_inputs(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *lengths], device=DEV).cumsum(0)
    rows = len(lengths)
    slots = torch.randperm(2 * rows, device=DEV)[:rows]
    return cu, slots, torch.ones(rows, dtype=torch.bool, device=DEV)


def gdn_prefill_case(lengths: list[int], fla) -> dict:
    H, HV, K, V = GDN["H"], GDN["HV"], GDN["K"], GDN["V"]
    n = sum(lengths)
    cu, slots, has_initial = prefill_inputs(lengths)
    q, k, v = rand(n, H, K), rand(n, H, K), rand(n, HV, V)
    g = -torch.rand(n, HV, device=DEV) * 0.1
    beta = torch.rand(n, HV, device=DEV).to(ACT)
    ssm = torch.randn(2 * len(lengths), HV, K, V, device=DEV) * 0.1
    row = dict(ours_ms=timed(lambda: gdn_prefill(q, k, v, g, beta, cu, ssm, slots, has_initial,
                                                 use_qk_l2norm_in_kernel=True), DEV, 3) * 1e3)
    h0 = ssm[slots]
    row["torch_ms"] = timed(lambda: chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], None, h0, True, cu, True), DEV, 1) * 1e3
    if fla is not None:
        row["fla_ms"] = timed(lambda: fla.chunk_gdn(
            q[None], k[None], v[None], g[None], beta[None], initial_state=h0, output_final_state=True,
            cu_seqlens=cu, use_qk_l2norm_in_kernel=True), DEV, 3) * 1e3
    return row


def kda_prefill_case(lengths: list[int], fla) -> dict:
    H, K, V = KDA["H"], KDA["K"], KDA["V"]
    n = sum(lengths)
    cu, slots, has_initial = prefill_inputs(lengths)
    q, k, v = rand(n, H, K), rand(n, H, K), rand(n, H, V)
    g = -torch.rand(n, H, K, device=DEV) * 0.1
    beta = torch.rand(n, H, device=DEV).to(ACT)
    ssm = torch.randn(2 * len(lengths), H, K, V, device=DEV) * 0.1
    row = dict(ours_ms=timed(lambda: kda_prefill(q, k, v, g, beta, cu, ssm, slots, has_initial,
                                                 use_qk_l2norm_in_kernel=True), DEV, 3) * 1e3)
    h0 = ssm[slots]
    row["torch_ms"] = timed(lambda: chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], None, h0, True, cu, True), DEV, 1) * 1e3
    if fla is not None:
        row["fla_ms"] = timed(lambda: fla.chunk_kda(
            q[None], k[None], v[None], g[None], beta[None], initial_state=h0, output_final_state=True,
            cu_seqlens=cu, use_qk_l2norm_in_kernel=True), DEV, 3) * 1e3
    return row


def mamba2_prefill_case(lengths: list[int], mamba) -> dict:
    H, P, N, G, chunk = MAMBA2["H"], MAMBA2["P"], MAMBA2["N"], MAMBA2["G"], MAMBA2["chunk"]
    n = sum(lengths)
    cu, slots, has_initial = prefill_inputs(lengths)
    x, B, C, dt = rand(n, H, P), rand(n, G, N), rand(n, G, N), rand(n, H)
    A = -torch.rand(H, device=DEV) - 0.5
    D, dt_bias = torch.randn(H, device=DEV), torch.randn(H, device=DEV)
    ssm = torch.randn(2 * len(lengths), H, P, N, device=DEV) * 0.1
    row = dict(ours_ms=timed(lambda: mamba2_prefill(x, dt, A, B, C, ssm, slots, has_initial, cu, D=D,
                                                    dt_bias=dt_bias, chunk_size=chunk), DEV, 3) * 1e3)
    print(f"  ours {row['ours_ms']:.2f} ms", flush=True)  # each peer as it is timed: a run cut short says where
    h0 = ssm[slots]
    row["torch_ms"] = timed(lambda: mamba2_chunk_scan_varlen(
        x, dt, A, B, C, cu, h0, D=D, dt_bias=dt_bias, chunk_size=chunk), DEV, 1) * 1e3
    print(f"  our torch path {row['torch_ms']:.2f} ms", flush=True)
    if mamba is not None:
        varlen = len(lengths) > 1
        seq_idx = torch.repeat_interleave(torch.arange(len(lengths), device=DEV, dtype=torch.int32),
                                          torch.tensor(lengths, device=DEV))[None]
        row["mamba_ssm_ms"] = timed(lambda: mamba.chunk_scan(
            x[None], dt[None], A, B[None], C[None], chunk, D=D, dt_bias=dt_bias, dt_softplus=True,
            initial_states=None if varlen else h0, seq_idx=seq_idx if varlen else None,
            cu_seqlens=cu if varlen else None, return_final_states=not varlen, return_varlen_states=varlen),
            DEV, 3) * 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--iters", type=int, default=50, help="graph replays per timed run")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--prefill-ops", nargs="+", choices=["gdn", "kda", "mamba2"], default=["gdn", "kda", "mamba2"])
    ap.add_argument("--prefill-shapes", nargs="+", default=["1x8192", "8x1024"],
                    help="prefill rows x tokens each (a run cut short can be resumed at one shape)")
    add_json_arg(ap)
    args = ap.parse_args()
    fla, mamba = fla_ops(), mamba_ssm_ops()
    rec = Record(args.json, "ops_kernels", DEV, dict(device=DEV, batches=args.batches, gdn=GDN, kda=KDA, mamba2=MAMBA2,
                                                     dtype=str(ACT), iters=args.iters, prefill_ops=args.prefill_ops,
                                                     prefill_shapes=args.prefill_shapes))
    bw = copy_bandwidth(DEV)
    rec.extra("copy_gbs", bw)
    print(f"copy bandwidth {bw:.0f} GB/s (read + write); decode figures are CUDA-graph replays, us per call")
    cases = (("gdn", lambda b: gdn_decode_case(b, fla, args.iters)), ("kda", lambda b: kda_decode_case(b, fla, args.iters)),
             ("mamba2", lambda b: mamba2_decode_case(b, mamba, args.iters)),
             ("conv1d", lambda b: conv_update_case(b, args.iters)))
    for op, case in cases if not args.skip_decode else ():
        for batch in args.batches:
            row = case(batch)
            gbs = row["state_bytes"] / row["ours_us"] / 1e3
            peers = {key: val for key, val in row.items() if key.endswith("_us") and key != "ours_us"}
            rec.add(kind="decode", op=op, batch=batch, ours_gbs=gbs, roofline_share=gbs / bw, **row)
            peer_text = "  ".join(f"{key[:-3]} {val:8.1f} us ({val / row['ours_us']:.2f}x ours)" for key, val in peers.items())
            print(f"decode {op:6} B={batch:<4} ours {row['ours_us']:8.1f} us {gbs:7.0f} GB/s ({gbs / bw:5.1%})  {peer_text}")
    if not args.skip_prefill:
        prefill_cases = {"gdn": lambda ls: gdn_prefill_case(ls, fla), "kda": lambda ls: kda_prefill_case(ls, fla),
                         "mamba2": lambda ls: mamba2_prefill_case(ls, mamba)}
        for shape in args.prefill_shapes:
            rows, tokens = map(int, shape.split("x"))
            lengths = [tokens] * rows
            for op, case in ((op, prefill_cases[op]) for op in args.prefill_ops):
                print(f"prefill {op} {len(lengths)} x {lengths[0]} ...", flush=True)
                row = case(lengths)
                rec.add(kind="prefill", op=op, rows=len(lengths), tokens=sum(lengths), **row)
                print(f"prefill {op:6} {len(lengths)} x {lengths[0]:<5} " + "  ".join(
                    f"{key[:-3]} {val:8.2f} ms" for key, val in row.items()))
    rec.close()


if __name__ == "__main__":
    main()
