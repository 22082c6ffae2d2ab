"""Mamba2 replay verify vs the per-token intermediate-state approach, plus plain decode.

Times one layer's verify step (verify + accept bookkeeping) for both approaches at several batch sizes
and draft counts, prints ms per call, the ratio from the same run, state bytes per request, and the
achieved memory bandwidth (bytes the step must touch / time). A script, not a test:

    PYTHONPATH=. python benchmarks/ops_mamba2.py [--device cpu|cuda] [--batches 1 16 64 256] [--drafts 3 7] [--json PATH]

Each figure is the median of --repeats runs (default 5) of --iters calls, timed with CUDA events on CUDA
(as graph replays unless --no-graph), after warm-up calls at the same shapes.
The replay figure includes one small copy launch after each call that restores pnat and buf_idx, so that every
call folds the same rows (until session 58, two launches: one for each tensor).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from benchmarks.record import Record, add_json_arg
from benchmarks.timing import REPEATS, graphed, median, time_runs
from hybridcache.ops.mamba2 import mamba2_accept, mamba2_decode, mamba2_verify
from hybridcache.ops.mamba2.intermediate import mamba2_accept_intermediate, mamba2_verify_intermediate


@dataclass(frozen=True)
class Layer:
    heads: int
    head_dim: int
    state: int
    groups: int
    hist: int
    dtype: torch.dtype

    @property
    def act_bytes(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()

    @property
    def ssm_bytes(self) -> int:
        return self.heads * self.head_dim * self.state * 4

    def token_bytes(self) -> int:
        """One token's inputs x, dt, B, C plus its output y."""
        a = self.act_bytes
        return (2 * self.heads * self.head_dim + self.heads + 2 * self.groups * self.state) * a

    def history_token_bytes(self) -> int:
        """One history entry: x, B (activation dtype), dt, dA_cumsum (fp32)."""
        return (self.heads * self.head_dim + self.groups * self.state) * self.act_bytes + 2 * self.heads * 4

    def replay_state_bytes(self) -> int:
        return self.ssm_bytes + 2 * self.hist * self.history_token_bytes() + 2 * 4

    def intermediate_state_bytes(self, steps: int) -> int:
        return self.ssm_bytes * (1 + steps)


def timed(fn: Callable[[], None], device: str, iters: int, repeats: int = REPEATS, warmup: int = 3) -> float:
    """Seconds per call: the median over `repeats` runs of `iters` calls each, after `warmup` calls."""
    return median(time_runs(fn, device, repeats, warmup, inner=iters))


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read and written (the roofline here)."""
    src = torch.empty(2**28 if device == "cuda" else 2**25, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, iters=20 if device == "cuda" else 5)
    return 2 * src.numel() * 4 / seconds / 1e9


def bench_case(layer: Layer, batch: int, drafts: int, device: str, iters: int, use_graph: bool,
               profile: bool = False, repeats: int = REPEATS) -> dict:
    steps = drafts + 1
    h, p, n, g, hist = layer.heads, layer.head_dim, layer.state, layer.groups, layer.hist
    gen = torch.Generator(device="cpu").manual_seed(batch * 10 + drafts)

    def rand(*shape: int, dtype: torch.dtype = layer.dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    slots_total = batch + 1
    slots = torch.randperm(slots_total, generator=gen)[:batch].to(device)
    A = -torch.exp(rand(h, dtype=torch.float32))
    D, dt_bias = rand(h, dtype=torch.float32), rand(h, dtype=torch.float32) - 2
    x, dt, B, C = rand(batch, steps, h, p), rand(batch, steps, h), rand(batch, steps, g, n), rand(batch, steps, g, n)
    num_valid = torch.randint(1, steps + 1, (batch,), generator=gen).to(device)

    ssm = rand(slots_total, h, p, n, dtype=torch.float32)
    replay = dict(
        replay_x=rand(slots_total, 2, hist, h, p), replay_B=rand(slots_total, 2, hist, g, n),
        replay_dt=rand(slots_total, 2, h, hist, dtype=torch.float32).abs(),
        replay_dA_cumsum=-rand(slots_total, 2, h, hist, dtype=torch.float32).abs().cumsum(-1),
    )
    # pnat and buf_idx as the rows of one tensor, so that restoring them after each call is one launch
    book = torch.stack([torch.randint(0, hist + 1, (slots_total,), generator=gen, dtype=torch.int32),
                        torch.randint(0, 2, (slots_total,), generator=gen, dtype=torch.int32)]).to(device)
    pnat, buf_idx = book[0], book[1]
    fold_fraction = float(((pnat[slots].long() + steps) > hist).float().mean())
    book0 = book.clone()
    inter = torch.zeros(slots_total, steps, h, p, n, device=device)

    def replay_step() -> None:
        mamba2_verify(x, dt, A, B, C, ssm, replay["replay_x"], replay["replay_B"], replay["replay_dt"],
                      replay["replay_dA_cumsum"], pnat, buf_idx, slots, D, dt_bias)
        mamba2_accept(pnat, buf_idx, slots, steps, num_valid, hist)
        book.copy_(book0)  # keep the fold pattern of every call the same (a few bytes, one launch)

    def intermediate_step() -> None:
        mamba2_verify_intermediate(x, dt, A, B, C, ssm, inter, slots, D, dt_bias)
        mamba2_accept_intermediate(ssm, inter, slots, num_valid)

    def decode_step() -> None:
        mamba2_decode(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], ssm, slots, D, dt_bias)

    if profile:
        for name, fn in (("replay", replay_step), ("intermediate", intermediate_step)):
            with torch.profiler.profile() as prof:
                for _ in range(5):
                    fn()
            sort = "device_time_total" if device == "cuda" else "cpu_time_total"
            print(f"--- {name}, batch {batch}, k {drafts}: 5 calls")
            print(prof.key_averages().table(sort_by=sort, row_limit=14))
    t_replay = timed(graphed(replay_step, device, use_graph), device, iters, repeats)
    t_inter = timed(graphed(intermediate_step, device, use_graph), device, iters, repeats)
    t_decode = timed(graphed(decode_step, device, use_graph), device, iters, repeats)

    # bytes each step must touch (reads + writes), the minimum any implementation moves
    io = steps * layer.token_bytes()
    replay_bytes = batch * (layer.ssm_bytes * (1 + fold_fraction) + hist * layer.history_token_bytes()
                            + steps * layer.history_token_bytes() + io)
    inter_bytes = batch * (layer.ssm_bytes * (1 + steps + 2) + io)  # read ckpt, write T, copy one back
    decode_bytes = batch * (2 * layer.ssm_bytes + layer.token_bytes())
    return dict(batch=batch, k=drafts, replay_ms=t_replay * 1e3, inter_ms=t_inter * 1e3, decode_ms=t_decode * 1e3,
                ratio=t_inter / t_replay, folds=fold_fraction, replay_gbs=replay_bytes / t_replay / 1e9,
                inter_gbs=inter_bytes / t_inter / 1e9, decode_gbs=decode_bytes / t_decode / 1e9,
                replay_state_bytes=layer.replay_state_bytes(), inter_state_bytes=layer.intermediate_state_bytes(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", choices=["tiny", "full"], help="layer shape (default: full on cuda, tiny on cpu)")
    parser.add_argument("--batches", type=int, nargs="+")
    parser.add_argument("--drafts", type=int, nargs="+", default=[3, 7])
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--state", type=int)
    parser.add_argument("--groups", type=int)
    parser.add_argument("--hist", type=int, default=16)
    parser.add_argument("--iters", type=int, help="calls per timed run (default 50 on cuda, 5 on cpu)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed runs per figure (the median is reported)")
    parser.add_argument("--no-graph", action="store_true", help="CUDA: time eager launches, not graph replay")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of each approach per case")
    add_json_arg(parser)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    full = (args.size or ("full" if cuda else "tiny")) == "full"
    # full: the Nemotron-H-like layer (the 1b family); tiny: a quarter of it, so a CPU run stays under a minute
    layer = Layer(heads=args.heads or (64 if full else 16), head_dim=args.head_dim, state=args.state or (128 if full else 64),
                  groups=args.groups or (8 if full else 4), hist=args.hist,
                  dtype=torch.bfloat16 if cuda else torch.float32)
    batches = args.batches or ([1, 16, 64, 256] if cuda else [1, 16, 64])
    iters = args.iters or (50 if cuda else 5)
    use_graph = cuda and not args.no_graph
    rec = Record(args.json, "ops_mamba2", args.device, dict(
        op="mamba2", device=args.device, batches=batches, drafts=args.drafts, iters=iters, repeats=args.repeats,
        graphs=use_graph, **{k: str(v) if k == "dtype" else v for k, v in asdict(layer).items()}))
    print(f"device={args.device} layer: {layer.heads} heads x {layer.head_dim} head dim x {layer.state} state, "
          f"G={layer.groups}, HIST={layer.hist}, {layer.dtype}, graphs={use_graph}; median of {args.repeats} runs "
          f"of {iters} calls")
    for drafts in args.drafts:
        rb, ib = layer.replay_state_bytes(), layer.intermediate_state_bytes(drafts + 1)
        print(f"k={drafts}: state bytes per request per layer: replay {rb / 2**20:.3f} MiB, intermediate "
              f"{ib / 2**20:.3f} MiB; beyond the checkpoint: replay {(rb - layer.ssm_bytes) / 2**10:.1f} KiB, "
              f"intermediate {(ib - layer.ssm_bytes) / 2**10:.1f} KiB ({(ib - layer.ssm_bytes) / (rb - layer.ssm_bytes):.1f}x)")
    bandwidth = copy_bandwidth(args.device)
    rec.extra("copy_gbs", bandwidth)
    print(f"measured device copy bandwidth (read + write): {bandwidth:.0f} GB/s")
    print(f"{'batch':>5} {'k':>2} {'replay ms':>10} {'interm. ms':>10} {'ratio':>6} {'folds':>6} "
          f"{'replay GB/s':>11} {'interm. GB/s':>12} {'decode ms':>10} {'decode GB/s':>11}")
    for drafts in args.drafts:
        for batch in batches:
            r = bench_case(layer, batch, drafts, args.device, iters, use_graph, args.profile, args.repeats)
            rec.add(op="mamba2", device=args.device, **r)
            print(f"{r['batch']:>5} {r['k']:>2} {r['replay_ms']:>10.3f} {r['inter_ms']:>10.3f} {r['ratio']:>5.2f}x "
                  f"{r['folds']:>6.2f} {r['replay_gbs']:>11.1f} {r['inter_gbs']:>12.1f} {r['decode_ms']:>10.3f} "
                  f"{r['decode_gbs']:>11.1f}")
    rec.close()


if __name__ == "__main__":
    main()
