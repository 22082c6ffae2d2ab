"""KDA speculative verify: replay with pending drafts vs per-token intermediate states, and plain decode.

Replay (what hybridcache keeps, docs/layouts.md): the verify step replays each row's accepted pending drafts into
its checkpoint, runs the T tokens, writes the state after the first new token and the other T - 1 tokens as
the new pending drafts; accept sets pend_n. The per-token approach runs the T tokens one at a time, writes
the state after each to a per-slot buffer [S, T, H, K, V] and copies the accepted one back. Both run their
accept step inside the timed call; on CUDA both run our fused kernels, captured as CUDA graphs and timed as
replays. Shapes: Kimi Linear's (16 heads, K = V = 128, bf16) on CUDA; tiny on the CPU.

    PYTHONPATH=. python benchmarks/ops_kda.py --device cuda --batches 1 16 64 256 --drafts 3

Each figure is the median of --repeats runs (default 5) of --iters calls, after warm-up calls at the same
shapes; CUDA events on CUDA. `--json PATH` writes the rows (the same fields as ops_gdn.py's).
"""
import torch

from benchmarks.ops_gdn import run_settings, start_table, table_row, verify_args
from benchmarks.ops_mamba2 import timed
from benchmarks.record import Record
from benchmarks.timing import REPEATS, graphed
from hybridcache.ops.kda import kda_accept, kda_decode, kda_verify
from hybridcache.ops.kda.block import prepare_qk
from hybridcache.ops.triton_support import runs_triton


def intermediate_verify(q, k, v, g, beta, ssm, inter, slots, num_valid) -> torch.Tensor:
    """Per-token states: the T tokens one at a time from ssm[slot], the state after each to inter[slot, t]
    [S, T, H, K, V], then the accepted one copied back. On CUDA the fused decode kernel (`intermediate=`)."""
    B, T = q.shape[:2]
    if runs_triton(q):
        from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton

        o = delta_rule_decode_triton(q, k, v, g, beta, ssm, slots, use_qk_l2norm_in_kernel=True, intermediate=inter)
    else:
        qn, kn = prepare_qk(q, k, None, True)  # fp32 [B, H, T, K], normalised, q scaled
        vt, gt, bt = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)
        h = ssm.index_select(0, slots)  # [B, H, K, V]
        outs = []
        for t in range(T):
            h = h * gt[:, :, t, :, None].exp()  # per-key decay
            kt = kn[:, :, t, None, :]  # [B, H, 1, K]
            u = bt[:, :, t, None, None] * (vt[:, :, t, None, :] - kt @ h)
            h = h + kt.transpose(-1, -2) @ u
            outs.append(qn[:, :, t, None, :] @ h)
            inter.select(1, t).index_copy_(0, slots, h)
        o = torch.cat(outs, dim=-2).transpose(1, 2).to(v.dtype)
    ssm.index_copy_(0, slots, inter.flatten(0, 1).index_select(0, slots * T + num_valid - 1))
    return o


def bench_case(B: int, drafts: int, H: int, D: int, act: torch.dtype, dev: str, iters: int, use_graph: bool,
               repeats: int = REPEATS) -> tuple[float, float, float]:
    """Seconds per call of (replay verify + accept, intermediate verify + accept, plain decode)."""
    T, P, S = drafts + 1, drafts, B
    gen = torch.Generator(device=dev).manual_seed(B * 10 + drafts)
    rand = lambda *shape: torch.randn(*shape, device=dev, generator=gen)  # noqa: E731
    slots = torch.randperm(S, device=dev, generator=gen)[:B]
    ssm = rand(S, H, D, D) * 0.1
    pend = dict(k=rand(S, P, H, D).to(act), g=-torch.rand(S, P, H, D, device=dev, generator=gen) * 0.1,
                v=rand(S, P, H, D).to(act), beta=torch.rand(S, P, H, device=dev, generator=gen),
                n=torch.randint(0, P + 1, (S,), device=dev, generator=gen, dtype=torch.int32))
    inter = torch.empty(S, T, H, D, D, device=dev)
    q, k, v = (rand(B, T, H, D).to(act) for _ in range(3))
    g = -torch.rand(B, T, H, D, device=dev, generator=gen) * 0.1
    beta = torch.rand(B, T, H, device=dev, generator=gen)
    accepted = torch.randint(1, T + 1, (B,), device=dev, generator=gen)

    def replay() -> None:
        kda_verify(q, k, v, g, beta, ssm, *pend.values(), slots, use_qk_l2norm_in_kernel=True)
        kda_accept(pend["n"], slots, accepted)

    def intermediate() -> None:
        intermediate_verify(q, k, v, g, beta, ssm, inter, slots, accepted)

    def decode() -> None:
        kda_decode(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], ssm, slots, use_qk_l2norm_in_kernel=True)

    return tuple(timed(graphed(fn, dev, use_graph), dev, iters, repeats) for fn in (replay, intermediate, decode))


def main() -> None:
    args = verify_args(__doc__, [3]).parse_args()
    dev, full, iters, act, use_graph = run_settings(args)
    H, D = (16, 128) if full else (2, 32)
    act_bytes = torch.finfo(act).bits // 8
    rec = Record(args.json, "ops_kda", dev, dict(op="kda", device=dev, batches=args.batches, drafts=args.drafts,
                                                 heads=H, head_dim=D, dtype=str(act), iters=iters,
                                                 repeats=args.repeats, graphs=use_graph))
    start_table(rec, dev, f"H={H} K=V={D}", act, use_graph, args.repeats, iters)
    state_bytes = H * D * D * 4
    for drafts in args.drafts:
        T = drafts + 1
        draft_bytes = H * (2 * D * act_bytes + D * 4 + 4)  # a pending draft: k, v in act, g fp32, beta fp32
        pending_bytes = drafts * draft_bytes
        for B in args.batches:
            secs = bench_case(B, drafts, H, D, act, dev, iters, use_graph, args.repeats)
            # least traffic: replay reads and writes the state, reads about half its pending drafts (pend_n
            # uniform over 0..k) and writes T - 1; per-token reads the state, writes T states, reads the
            # accepted one and writes it back
            replay_bytes = B * (2 * state_bytes + pending_bytes / 2 + (T - 1) * draft_bytes)
            table_row(rec, "kda", dev, B, drafts, secs, replay_bytes, B * state_bytes * (T + 3),
                      state_bytes + pending_bytes, state_bytes * (T + 1))
    rec.close()


if __name__ == "__main__":
    main()
