"""GDN speculative verify: replay (checkpoint + history) vs per-token intermediate states.

The intermediate-state approach runs the T tokens one at a time, writes the state after each token to a
per-slot buffer [S, T, HV, K, V] and copies the accepted one back into ssm. Replay reads the checkpoint
and the valid history, appends the new tokens' (u, k, G, beta) and folds into ssm only when the history
is full. Both run their accept step inside the timed call. On CUDA both are captured as CUDA graphs and
timed as graph replays (neither syncs with the host), so the table measures GPU work, not Python launch
overhead; `--no-graph` times eager launches. Usage:

    PYTHONPATH=. python benchmarks/ops_gdn.py --device cuda   # H=16, HV=32, K=V=128 (Qwen3-Next-like), bf16
    PYTHONPATH=. python benchmarks/ops_gdn.py --device cpu    # small shapes, finishes in well under a minute

Each figure is the median of --repeats runs (default 5) of --iters calls, after warm-up calls at the same
shapes; CUDA events on CUDA. `--json PATH` writes the rows.
"""
import argparse

import torch

from benchmarks.ops_mamba2 import timed
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import REPEATS, graphed
from hybridcache.ops.gdn import gdn_accept, gdn_decode, gdn_verify
from hybridcache.ops.gdn.block import per_value_head, prepare_qk
from hybridcache.ops.triton_support import runs_triton


def intermediate_verify(q, k, v, g, beta, ssm, inter, slots, num_valid) -> torch.Tensor:
    """Per-token states: the T tokens one at a time, the state after each written to a per-slot buffer
    [S, T, HV, K, V], then the accepted one copied back into ssm. On CUDA the tokens run in our fused decode
    kernel (`intermediate=`), so both approaches are measured at the same kernel quality."""
    B, T, hv = q.shape[0], q.shape[1], v.shape[2]
    if runs_triton(q):
        from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton

        o = delta_rule_decode_triton(q, k, v, g, beta, ssm, slots, use_qk_l2norm_in_kernel=True, intermediate=inter)
    else:
        qn, kn = (per_value_head(x, hv).view(B, hv, T, -1) for x in prepare_qk(q, k, None, True))  # [B, HV, T, K]
        vt, gt, bt = (x.float().transpose(1, 2) for x in (v, g, beta))
        h = ssm.index_select(0, slots)
        outs = []
        for t in range(T):
            h = h * gt[..., t, None, None].exp()
            kt = kn[..., t, :].unsqueeze(-2)  # [B, HV, 1, K]
            u = bt[..., t, None, None] * (vt[..., t, :].unsqueeze(-2) - kt @ h)
            h = torch.baddbmm(h.flatten(0, 1), kt.transpose(-1, -2).flatten(0, 1), u.flatten(0, 1)).view_as(h)
            outs.append(qn[..., t, :].unsqueeze(-2) @ h)
            inter.select(1, t).index_copy_(0, slots, h)
        o = torch.cat(outs, dim=-2).transpose(1, 2).to(v.dtype)
    ssm.index_copy_(0, slots, inter.flatten(0, 1).index_select(0, slots * T + num_valid - 1))
    return o


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write."""
    a = torch.empty(nbytes // 4, device=device)
    b = torch.empty_like(a)
    return 2 * nbytes / timed(lambda: b.copy_(a), device, 10) / 1e9


def bench_case(B: int, k: int, H: int, HV: int, D: int, hist: int, act: torch.dtype, dev: str, iters: int,
               use_graph: bool, profile: bool = False, repeats: int = REPEATS) -> tuple[float, float, float]:
    """Seconds per call of (replay verify + accept, intermediate verify + accept, plain decode)."""
    T = k + 1
    gen = torch.Generator(device=dev).manual_seed(B * 10 + k)
    S = B
    slots = torch.randperm(S, device=dev, generator=gen)[:B]
    ssm = torch.randn(S, HV, D, D, device=dev, generator=gen) * 0.1
    roles = dict(
        replay_u=torch.zeros(S, 2, hist, HV, D, device=dev, dtype=act),
        replay_k=torch.zeros(S, 2, hist, H, D, device=dev, dtype=act),
        replay_G=torch.zeros(S, 2, HV, hist, device=dev),
        replay_beta=torch.zeros(S, 2, HV, hist, device=dev),
        pnat=torch.randint(0, hist - T + 1, (S,), device=dev, generator=gen, dtype=torch.int32),
        buf_idx=torch.randint(0, 2, (S,), device=dev, generator=gen, dtype=torch.int32),
    )
    inter = torch.empty(S, T, HV, D, D, device=dev)
    q, kk = (torch.randn(B, T, H, D, device=dev, generator=gen).to(act) for _ in range(2))
    v = torch.randn(B, T, HV, D, device=dev, generator=gen).to(act)
    g = -torch.rand(B, T, HV, device=dev, generator=gen) * 0.1
    beta = torch.rand(B, T, HV, device=dev, generator=gen)
    # eager calls cycle through accept patterns; a graph replays the one it captured (pnat still moves, so
    # rows keep folding; the replay's work does not depend on which rows fold)
    accepts = [torch.randint(1, T + 1, (B,), device=dev, generator=gen) for _ in range(8)]
    step = [0]

    def replay() -> None:
        nv = accepts[step[0] % len(accepts)]
        step[0] += 1
        gdn_verify(q, kk, v, g, beta, ssm, *roles.values(), slots, use_qk_l2norm_in_kernel=True)
        gdn_accept(roles["pnat"], roles["buf_idx"], slots, T, nv, hist)

    def intermediate() -> None:
        intermediate_verify(q, kk, v, g, beta, ssm, inter, slots, accepts[0])

    def decode() -> None:
        gdn_decode(q[:, :1], kk[:, :1], v[:, :1], g[:, :1], beta[:, :1], ssm, slots, use_qk_l2norm_in_kernel=True)

    if profile:
        for name, fn in (("replay", replay), ("intermediate", intermediate)):
            fn()
            with torch.profiler.profile() as prof:
                fn()
            sort = "device_time_total" if dev == "cuda" else "cpu_time_total"
            print(f"--- {name}, batch {B}, k {k}: one call")
            print(prof.key_averages().table(sort_by=sort, row_limit=15))
    return tuple(timed(graphed(fn, dev, use_graph), dev, iters, repeats) for fn in (replay, intermediate, decode))


def verify_args(doc: str, drafts: list[int]) -> argparse.ArgumentParser:
    """The arguments of a delta-rule verify benchmark (this one, ops_kda.py): device, size, batches, drafts,
    iters, repeats, no-graph, json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=["tiny", "full"], help="head shapes (default: full on cuda, tiny on cpu)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--drafts", type=int, nargs="+", default=drafts)
    ap.add_argument("--iters", type=int, help="calls per timed run (default 50 on cuda, 10 on cpu)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed runs per figure (the median is reported)")
    ap.add_argument("--no-graph", action="store_true", help="CUDA: time eager launches, not graph replays")
    add_json_arg(ap)
    return ap


def run_settings(args: argparse.Namespace) -> tuple[str, bool, int, torch.dtype, bool]:
    """(device, full shapes, calls per timed run, activation dtype, graphs) from `verify_args`' arguments: on
    CUDA full shapes, 50 calls, bf16, graphs (unless --no-graph); on the CPU tiny shapes, 10 calls, fp32."""
    dev = args.device
    gpu = dev == "cuda"
    full = (args.size or ("full" if gpu else "tiny")) == "full"
    act = torch.bfloat16 if gpu else torch.float32
    return dev, full, args.iters or (50 if gpu else 10), act, gpu and not args.no_graph


TABLE_HEADER = (f"{'B':>4} {'k':>2} {'replay ms':>10} {'inter ms':>9} {'ratio':>6} {'replay GB/s':>12}"
                f" {'inter GB/s':>11} {'decode ms':>10} {'replay B/req':>13} {'inter B/req':>12}")


def start_table(rec: Record, dev: str, shapes: str, act: torch.dtype, use_graph: bool, repeats: int,
                iters: int) -> None:
    """The device's copy bandwidth into the record, then the run's heading and TABLE_HEADER printed."""
    bw = copy_bandwidth(dev, (256 if dev == "cuda" else 64) << 20)
    rec.extra("copy_gbs", bw)
    print(f"device {dev}  {shapes}  activations {act}  copy bandwidth {bw:.0f} GB/s  graphs={use_graph}; "
          f"median of {repeats} runs of {iters} calls")
    print(TABLE_HEADER)


def table_row(rec: Record, op: str, dev: str, B: int, k: int, secs: tuple[float, float, float], replay_bytes: float,
              inter_bytes: float, replay_state: int, inter_state: int) -> None:
    """One (batch, k) case into the record and printed under TABLE_HEADER; secs: replay, per-token, decode."""
    s_r, s_i, s_d = secs
    rec.add(op=op, device=dev, batch=B, k=k, replay_ms=s_r * 1e3, inter_ms=s_i * 1e3, decode_ms=s_d * 1e3,
            ratio=s_i / s_r, replay_gbs=replay_bytes / s_r / 1e9, inter_gbs=inter_bytes / s_i / 1e9,
            replay_state_bytes=replay_state, inter_state_bytes=inter_state)
    print(f"{B:>4} {k:>2} {s_r * 1e3:>10.3f} {s_i * 1e3:>9.3f} {s_i / s_r:>5.2f}x {replay_bytes / s_r / 1e9:>12.1f}"
          f" {inter_bytes / s_i / 1e9:>11.1f} {s_d * 1e3:>10.3f} {replay_state:>13,} {inter_state:>12,}")


def main() -> None:
    ap = verify_args(__doc__, [3, 7])
    ap.add_argument("--heads", type=int, help="key heads H (default 16 full, 2 tiny)")
    ap.add_argument("--value-heads", type=int, help="value heads HV (default 32 full, 4 tiny)")
    ap.add_argument("--head-dim", type=int, help="K = V (default 128 full, 64 tiny)")
    ap.add_argument("--hist", type=int, default=16)
    ap.add_argument("--profile", action="store_true", help="print the top kernels of each approach per case")
    args = ap.parse_args()
    dev, full, iters, act, use_graph = run_settings(args)
    H = args.heads or (16 if full else 2)
    HV = args.value_heads or (32 if full else 4)
    D = args.head_dim or (128 if full else 64)
    act_bytes = torch.finfo(act).bits // 8
    rec = Record(args.json, "ops_gdn", dev, dict(
        op="gdn", device=dev, batches=args.batches, drafts=args.drafts, heads=H, value_heads=HV, head_dim=D,
        hist=args.hist, dtype=str(act), iters=iters, repeats=args.repeats, graphs=use_graph))
    start_table(rec, dev, f"H={H} HV={HV} K=V={D}  HIST>={args.hist}", act, use_graph, args.repeats, iters)
    state_bytes = HV * D * D * 4
    for k in args.drafts:
        T, hist = k + 1, max(args.hist, k + 1)
        hist_bytes = 2 * hist * (HV * D * act_bytes + H * D * act_bytes + 2 * HV * 4) + 8
        for B in args.batches:
            secs = bench_case(B, k, H, HV, D, hist, act, dev, iters, use_graph, args.profile, args.repeats)
            # least traffic each approach needs: replay reads the checkpoint and history, writes T history
            # entries and folds about once per HIST / mean-accept steps; intermediate reads the state, writes
            # T states, reads the accepted one and writes it back
            fold_rate = ((T + 1) / 2) / (hist - T + 1)
            replay_bytes = B * (state_bytes * (1 + 2 * fold_rate) + hist_bytes / 2)
            table_row(rec, "gdn", dev, B, k, secs, replay_bytes, B * state_bytes * (T + 3), state_bytes + hist_bytes,
                      state_bytes * (T + 1))
    rec.close()


if __name__ == "__main__":
    main()
