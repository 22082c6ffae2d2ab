"""Each kernel of one batch-1 decode step against the copy bandwidth: where a step's time goes beyond reading
its bytes once. Two parts, run by benchmarks/gpu/bs1_kernels.sh on the GPU machine:

    ncu --profile-from-start off --graph-profiling node --print-units base --csv --page raw \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python benchmarks/kernel_bandwidth.py run --family kimi_linear > ncu.csv
    python benchmarks/kernel_bandwidth.py summarize ncu.csv --copy-gbs 3000

`run` builds the engine in steady CUDA-graph decode (step_profile.py's `steady_engine`) and replays the last
step's graph once inside cudaProfilerStart/Stop, so Nsight Compute sees that step's kernels and nothing else,
one at a time (no overlap between them, caches flushed before each: every byte comes from DRAM, as a 1B
checkpoint's weights do at batch 1). `summarize` reads its CSV and prints, per kernel name: launches, time,
DRAM bytes, GB/s and its share of the copy bandwidth, and the time over what its bytes take at that bandwidth,
the largest first, and beyond that a floor a launch (the median time of the launches that move almost nothing):
what a kernel loses beyond a launch and its bytes; `--json` keeps the rows.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict

from benchmarks.record import Record

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TIME, READ, WRITE = "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"


def run(args: argparse.Namespace) -> None:
    import torch

    from benchmarks.families import checkpoint
    from benchmarks.step_profile import steady_engine

    llm = steady_engine(checkpoint(args), args.device, args.dtype, args.batch, args.prompt_len, 1024, 0)
    graphs = llm.runner.graphs
    if graphs is None or graphs.last is None:
        sys.exit("no CUDA graph was captured: nothing to replay")
    graph = graphs.last.graph
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def kernel_rows(lines) -> list[dict]:
    """The kernels of ncu's `--csv --page raw --print-units base` output (other lines skipped): one dict a
    launch with `name`, `ns`, `bytes` (DRAM read + write)."""
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    if not rows:
        return []
    header, launches = rows[0], rows[1:]
    names = [n for n in ("Kernel Name", "Function Name", "Demangled Name") if n in header]
    missing = [m for m in (TIME, READ, WRITE) if m not in header]
    if not names or missing:
        raise ValueError(f"ncu's CSV lacks {missing or 'a kernel name column'}: its columns are {header}")
    col = {m: header.index(m) for m in (TIME, READ, WRITE)}
    name = header.index(names[0])
    out = []
    for r in launches:
        try:
            ns, read, write = (float(r[col[m]].replace(",", "")) for m in (TIME, READ, WRITE))
        except ValueError:  # the units row under the header
            continue
        out.append(dict(name=r[name], ns=ns, bytes=read + write))
    return out


SMALL_BYTES = 200_000  # a launch that moves less than this is all latency: the profile's cost of a launch


def launch_floor_us(launches: list[dict]) -> float | None:
    """What a launch costs under the profiler whatever it moves: the median time of the launches that move under
    SMALL_BYTES (norms, routers, conv updates, glue); None without any."""
    small = sorted(k["ns"] for k in launches if k["bytes"] < SMALL_BYTES)
    return (small[len(small) // 2] + small[(len(small) - 1) // 2]) / 2e3 if small else None


def summary(launches: list[dict], copy_gbs: float, floor_us: float | None = None) -> list[dict]:
    """Per kernel name: launches, us, MB, GB/s, share of `copy_gbs`, and `over_us` (the time beyond its bytes
    at `copy_gbs`), the largest `over_us` first; with `floor_us`, `beyond_us`: the time beyond its bytes and
    a floor a launch (what is the kernel's own beyond a launch and a read at the copy bandwidth)."""
    by_name = defaultdict(lambda: [0, 0.0, 0.0])
    for k in launches:
        entry = by_name[k["name"]]
        entry[0] += 1
        entry[1] += k["ns"]
        entry[2] += k["bytes"]
    rows = []
    for name, (count, ns, nbytes) in by_name.items():
        gbs = nbytes / ns if ns else 0.0  # bytes / ns = GB/s
        over_us = ns / 1e3 - nbytes / copy_gbs / 1e3
        rows.append(dict(kernel=name, launches=count, us=ns / 1e3, mb=nbytes / 1e6, gbs=gbs, share=gbs / copy_gbs,
                         over_us=over_us, **({} if floor_us is None else {"beyond_us": over_us - count * floor_us})))
    return sorted(rows, key=lambda r: -r["over_us"])


def summarize(args: argparse.Namespace) -> None:
    with open(args.csv) as f:
        launches = kernel_rows(f)
    if not launches:
        sys.exit(f"{args.csv}: no kernel rows (did ncu profile anything?)")
    import torch

    floor_us = launch_floor_us(launches)
    rows = summary(launches, args.copy_gbs, floor_us)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rec = Record(args.json, "kernel_bandwidth", device, dict(csv=args.csv, copy_gbs=args.copy_gbs, family=args.family,
                                                             batch=args.batch))
    rec.extra("floor_us", floor_us)
    total_us, total_mb = sum(r["us"] for r in rows), sum(r["mb"] for r in rows)
    print(f"{len(launches)} launches, {total_us:.1f} us one after another, {total_mb:.1f} MB from DRAM: "
          f"{total_mb / args.copy_gbs * 1e3:.1f} us at {args.copy_gbs:.0f} GB/s; a launch under "
          f"{SMALL_BYTES / 1e3:.0f} kB takes {floor_us or 0:.2f} us (median)")
    print(f"{'launches':>8} {'us':>8} {'MB':>8} {'GB/s':>7} {'share':>6} {'over us':>8} {'beyond':>7}  kernel")
    for r in rows:
        print(f"{r['launches']:>8} {r['us']:>8.1f} {r['mb']:>8.2f} {r['gbs']:>7.0f} {r['share']:>6.0%} "
              f"{r['over_us']:>8.1f} {r.get('beyond_us', 0.0):>7.1f}  {r['kernel'][:70]}")
        rec.add(**r)
    rec.close()


def main() -> None:
    from benchmarks.families import add_model_args
    from benchmarks.record import add_json_arg

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="one batch-1 graph step's kernels inside the profiler's window")
    add_model_args(r)
    r.set_defaults(size="1b", device="cuda", dtype="bfloat16")
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--prompt-len", type=int, default=128)
    s = sub.add_parser("summarize", help="per kernel: time, DRAM bytes, share of the copy bandwidth")
    s.add_argument("csv")
    s.add_argument("--copy-gbs", type=float, required=True, help="the device's copy bandwidth (read + write)")
    s.add_argument("--family", default=None, help="the profiled family, recorded for the report")
    s.add_argument("--batch", type=int, default=1, help="the profiled batch size, recorded for the report")
    add_json_arg(s)
    args = ap.parse_args()
    run(args) if args.what == "run" else summarize(args)


if __name__ == "__main__":
    main()
