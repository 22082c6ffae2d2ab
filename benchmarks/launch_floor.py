"""What a launch costs inside a batch-1 decode step's CUDA graph beyond its bytes: chains of N dependent launches
captured in one graph, replayed, timed per launch, with programmatic dependent launch (PDL) on and off.

    empty        a Triton kernel that only takes PDL's wait and returns (no loads)
    norm         rms_norm_triton of a [1, D] row, each launch normalising the one before's output
    gemv         gemv_triton of a [1, D] row by a [D, D] bf16 weight, a fresh weight each launch (the chain's
                 weights pass L2 many times over), each launch's row the one before's output
    gemv-merged  the same weights as one [N·D, D] weight: one launch reads the chain's bytes, no chain
    gemv-l2      the gemv chain on one weight, every launch reading it again (8.4 MB: from L2 after the first)

    gemv-side-A  the gemv chain, and on a second stream of the graph forked after each gemv i, bulk L2 prefetches
                 (`cp.async.bulk.prefetch.L2`, one small launch, no PDL) of the weight gemv i + A will read: off the
                 chain, running while gemvs i + 1, ... stream theirs

    gemv-persistent-A  the gemv chain as one launch: one program an SM, each holding its 16 rows of a weight in
                 registers; between gemvs a grid-wide barrier (an atomic counter the programs spin on), and each
                 program loads its rows of the weight A gemvs ahead between its arrival there and its wait

`gemv` minus `gemv-merged` a launch is what the chain adds to a weight read: what a step of N such launches would
save as one kernel; `gemv` minus `gemv-l2`, what a launch would save if its weight were in L2 before it starts (the
most any prefetch ahead of it could give). A batch-1 decode step of a 1B-class checkpoint is 120 to 150 launches,
about a third of them gemvs of this size (benchmarks/gpu/bs1_kernels.sh gives them per kernel name).

    PYTHONPATH=. python benchmarks/launch_floor.py --launches 64 --json launch_floor.json

H100 (session 53), us a gemv: launched 5.08 (PDL), merged 2.66, in L2 3.93; side-stream prefetch 6.6 (it slows the
chain); persistent 4.30 with the weight one or two gemvs ahead alike. So a dependent step costs about 1.5 us beyond
its bytes even inside one launch, where nothing waits for a launch and every weight is already in flight: the
output's store, the barrier's fence and flag, and the next input's load are three trips through L2.
"""
from __future__ import annotations

import argparse
import torch
import triton
import triton.language as tl

from benchmarks.ops_gdn import copy_bandwidth
from benchmarks.ops_mamba2 import timed
from benchmarks.record import Record, add_json_arg
from hybridcache.ops import pdl_triton
from hybridcache.ops.gemv_triton import gemv_triton
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.rms_norm_triton import rms_norm_triton


@triton.jit
def _empty_kernel(x_ptr, PDL: tl.constexpr):
    pdl_entry(PDL)


def empty(x: torch.Tensor) -> torch.Tensor:
    _empty_kernel[(1,)](x, **pdl_launch(x))
    return x


CHUNK = 1 << 11  # bytes a thread's one bulk prefetch asks for (a multiple of 16)
SIDE = None  # the prefetches' stream (made on first use)
FORKED = False  # whether the chain being captured forked SIDE


@triton.jit
def _l2_prefetch_kernel(base, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Program pid asks L2 for bytes [pid·LANES·CHUNK, (pid + 1)·LANES·CHUNK) of base's nbytes, a chunk a lane."""
    start = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - start, CHUNK)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base + start, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def side_prefetch(weight: torch.Tensor) -> None:
    """Fork a second stream off the current one and ask L2 for `weight`'s bytes there (one launch)."""
    global SIDE, FORKED
    SIDE, FORKED = SIDE or torch.cuda.Stream(), True
    SIDE.wait_stream(torch.cuda.current_stream())
    nbytes, lanes = weight.numel() * weight.element_size() // 16 * 16, 32
    with torch.cuda.stream(SIDE):
        _l2_prefetch_kernel[(triton.cdiv(nbytes, lanes * CHUNK),)](weight.view(-1).view(torch.int8), nbytes,
                                                                   CHUNK=CHUNK, LANES=lanes, num_warps=1)


@triton.jit
def _arrive(bar_ptr):
    """A program reaches the grid barrier: its stores before are visible to whoever sees the count after."""
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(bar_ptr, target):
    """Until the grid has arrived `target` times in all (programs arrive once each a barrier)."""
    while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < target:
        pass


@triton.jit
def _persistent_gemv_kernel(x_ptr, w_ptr, y_ptr, bar_ptr, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            AHEAD: tl.constexpr):
    """y[i] = W[i]·y[i - 1] (y[-1] = x) for i < N, W [N, D, D], y [N, D]; program pid takes rows [pid·BLOCK_N,
    (pid + 1)·BLOCK_N) of every output, its rows of the weights AHEAD (1 or 2) gemvs ahead in registers. Every
    program must be resident at once (one an SM). bar_ptr [2] int32, zeros at entry and at exit: the barrier's
    count, and the programs that have left."""
    pid, G = tl.program_id(0), tl.num_programs(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    ok = (rows < D)[:, None] & (cols < D)[None, :]
    slab = rows.to(tl.int64)[:, None] * D + cols[None, :]
    w = tl.load(w_ptr + slab, mask=ok, other=0.0)
    w_next = w
    if AHEAD == 2:
        w_next = tl.load(w_ptr + tl.minimum(1, N - 1).to(tl.int64) * D * D + slab, mask=ok, other=0.0)
    src = x_ptr
    for i in range(N):
        x = tl.load(src + cols, mask=cols < D, other=0.0, cache_modifier=".cg").to(tl.float32)
        y = tl.sum(w.to(tl.float32) * x[None, :], 1)
        tl.store(y_ptr + i * D + rows, y.to(y_ptr.dtype.element_ty), mask=rows < D)
        # arrive, then load a later weight's rows, then wait: a release waits for every memory operation before
        # it, so weight loads issued before the arrival would delay it by their whole read
        _arrive(bar_ptr)
        later = tl.load(w_ptr + tl.minimum(i + AHEAD, N - 1).to(tl.int64) * D * D + slab, mask=ok, other=0.0)
        _wait(bar_ptr, (i + 1) * G)
        if AHEAD == 2:
            w, w_next = w_next, later
        else:
            w = later
        src = y_ptr + i * D
    if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:  # the last to leave resets both
        tl.atomic_xchg(bar_ptr, 0, sem="release", scope="gpu")
        tl.atomic_xchg(bar_ptr + 1, 0, sem="release", scope="gpu")


def persistent_gemvs(x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, bar: torch.Tensor,
                     ahead: int = 1) -> torch.Tensor:
    """weights [N, D, D], x [1, D] -> out [N, D] (each output the next input), one launch of one program an SM,
    each holding its rows of the weights `ahead` (1, 2) gemvs ahead."""
    n, d = weights.shape[0], weights.shape[1]
    programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    block_n = triton.next_power_of_2(triton.cdiv(d, programs))
    _persistent_gemv_kernel[(triton.cdiv(d, block_n),)](x, weights, out, bar, n, d, BLOCK_N=block_n,
                                                        BLOCK_D=triton.next_power_of_2(d), AHEAD=ahead,
                                                        num_warps=16 if ahead == 1 else 8)  # no spills
    return out[-1:]


def replay_us(chain, x: torch.Tensor, launches: int, replays: int, repeats: int) -> float:
    """Microseconds a launch of `chain(i, x) -> x` captured `launches` times into one graph: the median of
    `repeats` timings of `replays` back-to-back replays."""
    def body():
        global FORKED
        FORKED, y = False, x
        for i in range(launches):
            y = chain(i, y)
        if FORKED:  # a forked stream rejoins before the capture ends
            torch.cuda.current_stream().wait_stream(SIDE)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # compiles the kernels before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return timed(graph.replay, "cuda", replays, repeats) * 1e6 / launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=64, help="launches a chain (N)")
    ap.add_argument("--hidden", type=int, default=2048, help="the row's width D")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    add_json_arg(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_floor times CUDA graphs: it needs a GPU")
    n, d = args.launches, args.hidden
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, d, device=dev, generator=gen).to(torch.bfloat16)
    norm_w = torch.ones(d, device=dev, dtype=torch.bfloat16)
    weights = torch.randn(n * d, d, device=dev, generator=gen).mul_(d ** -0.5).to(torch.bfloat16)
    parts = weights.view(n, d, d)
    gemv_bytes = d * d * 2
    copy_gbs = copy_bandwidth("cuda", 1 << 30)
    rec = Record(args.json, "launch_floor", "cuda", dict(launches=n, hidden=d, copy_gbs=copy_gbs))
    chain_out = torch.empty(n, d, device=dev, dtype=torch.bfloat16)
    bar = torch.zeros(2, device=dev, dtype=torch.int32)
    chains = {
        "empty": (lambda i, y: empty(y), 0),
        "norm": (lambda i, y: rms_norm_triton(y, norm_w, 1e-6), 4 * d),
        "gemv": (lambda i, y: gemv_triton(y, parts[i]), gemv_bytes),
        "gemv-l2": (lambda i, y: gemv_triton(y, parts[0]), gemv_bytes),
    }

    def gemv_side(i: int, y: torch.Tensor, ahead: int) -> torch.Tensor:
        y = gemv_triton(y, parts[i])
        if i + ahead < n:
            side_prefetch(parts[i + ahead])
        return y

    for ahead in (1, 2, 4):
        chains[f"gemv-side-{ahead}"] = (lambda i, y, a=ahead: gemv_side(i, y, a), gemv_bytes)
    y = x
    for i in range(n):
        y = gemv_triton(y, parts[i])
    for ahead in (1, 2):
        persistent_gemvs(x, parts, chain_out, bar, ahead)
        diff = (chain_out[-1].float() - y[0].float()).abs().max().item()
        print(f"the persistent chain ({ahead} ahead): its last output against the launched chain's, max |difference| "
              f"{diff:.3g} (max |y| {y.float().abs().max().item():.3g})")
    print(f"copy bandwidth (read + write) {copy_gbs:,.0f} GB/s; {n} launches a chain, D {d}; a gemv reads "
          f"{gemv_bytes / 1e6:.1f} MB, {gemv_bytes / copy_gbs / 1e3:.2f} us of it")
    print(f"{'chain':>12} {'PDL':>5} {'us a launch':>12} {'GB/s':>7}")
    for pdl in (True, False):
        pdl_triton.ENABLED = pdl
        results = {}
        for name, (chain, nbytes) in chains.items():
            results[name] = replay_us(chain, x, n, args.replays, args.repeats)
        merged = replay_us(lambda i, y: gemv_triton(y, weights), x, 1, args.replays, args.repeats) / n
        results["gemv-merged"] = merged
        if pdl:  # one launch: PDL changes nothing
            for ahead in (1, 2):
                results[f"gemv-persistent-{ahead}"] = replay_us(
                    lambda i, y, a=ahead: persistent_gemvs(y, parts, chain_out, bar, a), x, 1, args.replays,
                    args.repeats) / n
        for name, us in results.items():
            nbytes = chains[name][1] if name in chains else gemv_bytes
            gbs = nbytes / us / 1e3 if nbytes else 0.0
            print(f"{name:>12} {str(pdl):>5} {us:>12.2f} {gbs:>7,.0f}")
            rec.add(chain=name, pdl=pdl, us_per_launch=us, bytes_per_launch=nbytes, gbs=gbs)
        print(f"{'gemv chain adds':>12} {str(pdl):>5} {results['gemv'] - merged:>12.2f} us a launch over one "
              f"merged read")
    pdl_triton.ENABLED = True
    rec.close()


if __name__ == "__main__":
    main()
