"""docs/benchmarks.md's decode-step sections (`benchmarks/report.py`): the engine's steady step (step_profile.py)
against the weight-bandwidth limit, and one batch-1 step kernel by kernel (kernel_bandwidth.py)."""
from __future__ import annotations

from benchmarks.report_data import profiled_family
from benchmarks.report_format import provenance, table

WEIGHT_BANDWIDTH_TOK_S = {"nemotron_h": 2859, "qwen3_next": 3099, "kimi_linear": 5208}  # 1b at 4.2 TB/s (issue 9)
COPY_TB_S = {"H200": 4.2, "H100": 3.0}  # the copy bandwidth measured on each (benchmarks/ops_*.py print it)


def gpu_kind(data: dict) -> str | None:
    """The run's GPU as COPY_TB_S names it ("H200", "H100"), None for another device."""
    device = data.get("machine", {}).get("device", "")
    return next((name for name in COPY_TB_S if name in device), None)


def weight_bandwidth_limit(data: dict) -> float | None:
    """tok/s of a 1b checkpoint's bytes read once a step at the copy bandwidth of the run's GPU; None where
    neither applies."""
    tb_s = COPY_TB_S.get(gpu_kind(data))
    limit = WEIGHT_BANDWIDTH_TOK_S.get(data["params"]["family"]) if data["params"]["size"] == "1b" else None
    return limit * tb_s / 4.2 if limit and tb_s else None


def step_section(files: list[dict], img: str | None) -> list[str]:
    out = ["## Decode step: host overlap and kernel launches", "",
           "One steady decode step of the whole engine (`LLM.step()`, every request decoding): wall time, GPU kernel "
           "time and its share of the wall time, kernels launched, and tokens/s. `graph`: CUDA graphs with "
           "asynchronous scheduling (the next step is planned and launched before this one's tokens are read back); "
           "`graph-sync`: CUDA graphs, the host plans while the device idles; `eager`: no graphs; `verify`: every step "
           "a k=3 verify under graphs whose drafts the model does not pick (synchronous: the host drafts from the "
           "tokens read back), tok/s of the committed tokens; `spec-idle`: the speculative engine with every row "
           "backing off for good (what zero acceptance mostly runs; runs of 2026-12-06 and before: one-token steps chained on "
           "the verify steps in flight; since, plain steps after one read); `spec-chain`: every row held in a short back-off "
           "(one-token steps chained on the verify steps in flight, what pauses up to 8 steps run). *replay ms*: the step's graph replayed back to back "
           "alone; *host share* = 1 - replay / wall. The weight-bandwidth limit is the checkpoint's bytes read once "
           "per step at the GPU's copy bandwidth (H200 4.2 TB/s, H100 3.0 TB/s). Where a family's runs measured different modes or batches, each (batch, mode) "
           "shows its newest run, and the row names its file.", ""]
    for data in files:
        p = data["params"]
        device = data.get("machine", {}).get("device", "?")
        out += [f"### {p['family']} {p['size']} on {device} ({p['dtype']}, prompt {p['prompt_len']}, mean of "
                f"{p['steps']} steps)", ""]
        sources = data.get("sources", [data])
        for src in sources:
            out += provenance(src) + [""]
            if src.get("extra", {}).get("note"):
                out += [src["extra"]["note"], ""]
        limit = weight_bandwidth_limit(data)
        replays = any(r.get("replay_ms") for r in data["rows"])
        named = len(sources) > 1  # rows from several runs: each names its file
        rows = [[str(r["batch"]), r["mode"], f"{r['wall_ms']:.2f}", f"{r['gpu_ms']:.2f}", f"{r['gpu_ms'] / r['wall_ms']:.0%}",
                 f"{r['launches']:.0f}", f"{r['tok_s']:,.0f}",
                 f"{r['tok_s'] / limit:.0%}" if limit and r["batch"] == 1 and r["mode"] != "verify" else "-"]
                + ([f"{r['replay_ms']:.2f}", f"{1 - r['replay_ms'] / r['wall_ms']:.0%}"] if r.get("replay_ms") else ["-", "-"]
                   if replays else []) + ([f"`{r['file']}`"] if named else []) for r in data["rows"]]
        out += table(["batch", "mode", "wall ms", "GPU ms", "GPU busy", "launches", "tok/s",
                      "bs1 of weight-bandwidth limit"] + (["replay ms", "host share"] if replays else [])
                     + (["file"] if named else []), rows) + [""]
    return out


def gpu_pair_section(files: list[dict]) -> list[str]:
    """Each family's newest batch-1 `graph` row on an H100 and on an H200 side by side: a step bound by reading its
    weights would replay in the ratio of the two copy bandwidths."""
    rows = []
    for family in dict.fromkeys(d["params"]["family"] for d in files):
        pair = {}
        for data in files:
            gpu = gpu_kind(data)
            row = next((r for r in data["rows"] if r["batch"] == 1 and r["mode"] == "graph" and r.get("replay_ms")),
                       None)
            if data["params"]["family"] == family and gpu and row:
                pair[gpu] = (row, row.get("file", data.get("file", "?")))
        if len(pair) == 2:
            (h100, f100), (h200, f200) = pair["H100"], pair["H200"]
            rows.append([family, f"{h100['replay_ms']:.3f}", f"{h200['replay_ms']:.3f}",
                         f"{h100['replay_ms'] / h200['replay_ms']:.2f}x", f"`{f100}`", f"`{f200}`"])
    if not rows:
        return []
    bandwidth = COPY_TB_S["H200"] / COPY_TB_S["H100"]
    return ["## The batch-1 step on an H100 and an H200", "",
            f"Each family's batch-1 CUDA-graph step replayed alone (*replay ms* above), newest run on each GPU. The "
            f"H200 copies {bandwidth:.2f}x as fast as the H100 ({COPY_TB_S['H200']} against {COPY_TB_S['H100']} "
            "TB/s): a step bound by reading its weights would replay that much faster there; a step bound by its "
            "chain of dependent launches (the section below) replays in about the same time on both. The two runs "
            "may be of different commits: their files name their dates.", ""] + table(
        ["family", "H100 replay ms", "H200 replay ms", "H100 / H200", "H100 file", "H200 file"], rows) + [""]


def kernel_bandwidth_section(files: list[dict]) -> list[str]:
    out = ["## Decode step, kernel by kernel", "",
           "Nsight Compute on one batch-1 CUDA-graph decode step (`benchmarks/gpu/bs1_kernels.sh`): each kernel of the "
           "step alone, caches flushed before it, its time and DRAM bytes; per kernel name the launches, time, bytes, "
           "GB/s and its share of the copy bandwidth, and *over us*: the time beyond what its bytes take at that "
           "bandwidth, the largest first. Kernels one after another take longer than the step's graph replay (each "
           "pays its launch and a cold start here, where the graph under PDL overlaps them); the over column shows "
           "where a step's time goes beyond reading its bytes once.", ""]
    for data in files:
        p, rows = data["params"], data["rows"]
        device = data.get("machine", {}).get("device", "?")
        out += [f"### {profiled_family(p)}, batch {p.get('batch', 1)}, on {device}", ""] + provenance(data) + [""]
        launches, us, mb = (sum(r[k] for r in rows) for k in ("launches", "us", "mb"))
        floor = data.get("extra", {}).get("floor_us")
        out += [f"{launches} launches, {us:,.1f} us one after another, {mb:,.1f} MB from DRAM: "
                f"{mb / p['copy_gbs'] * 1e3:,.1f} us at the copy bandwidth ({p['copy_gbs']:,.0f} GB/s, read + write)"
                + (f"; a launch that moves almost nothing takes {floor:.2f} us (the median under 200 kB), and "
                   "*beyond us* is a kernel's time beyond that a launch and its bytes." if floor else "."), ""]
        beyond = floor is not None
        header = ["kernel", "launches", "us", "MB", "GB/s", "of copy bandwidth", "over us"] + ["beyond us"] * beyond
        out += table(header, [[f"`{r['kernel'][:60]}`", str(r["launches"]), f"{r['us']:.1f}", f"{r['mb']:.2f}",
                               f"{r['gbs']:,.0f}", f"{r['share']:.0%}", f"{r['over_us']:.1f}"]
                              + ([f"{r['beyond_us']:.1f}"] if beyond else []) for r in rows]) + [""]
    return out


def launch_floor_section(files: list[dict]) -> list[str]:
    out = ["## What a launch costs inside the step's graph", "",
           "`benchmarks/launch_floor.py`: chains of N dependent launches captured in one CUDA graph, each launch's "
           "input the one before's output, replayed; microseconds a launch, with programmatic dependent launch (PDL, "
           "the engine's default) and without. *empty* takes only PDL's wait; *norm* is the RMSNorm of one 2,048-wide "
           "row; *gemv* a one-row product with its own 2,048 x 2,048 bf16 weight (8.4 MB, no weight twice in L2); "
           "*gemv-merged* the same weights as one launch; *gemv-l2* the chain on one weight, read again each launch "
           "(from L2 after the first; where the run has it). gemv minus gemv-merged is what a chain of weight reads "
           "costs beyond its bytes: the time each launch takes to fill the memory pipe and drain it; gemv minus "
           "gemv-l2 the most a weight in L2 before its launch could save; *gemv-side-A* the gemv chain with, on a "
           "second stream of the graph forked after each gemv, an L2 prefetch of the weight A launches ahead; "
           "*gemv-persistent-A* the chain as one launch, one program an SM holding its rows of the weights A gemvs "
           "ahead, a grid-wide barrier between gemvs (where the run has them).", ""]
    for data in files:
        p = data["params"]
        out += provenance(data) + ["", f"{p['launches']} launches a chain; copy bandwidth {p['copy_gbs']:,.0f} GB/s "
                                   "(read + write).", ""]
        by = {(r["chain"], r["pdl"]): r for r in data["rows"]}
        rows = []
        for chain in ("empty", "norm", "gemv", "gemv-merged", "gemv-l2", "gemv-side-1", "gemv-side-2", "gemv-side-4",
                      "gemv-persistent-1", "gemv-persistent-2"):
            cells = [by.get((chain, pdl)) for pdl in (True, False)]
            if not any(cells):
                continue
            rows.append([chain] + [f"{c['us_per_launch']:.2f}" if c else "-" for c in cells]
                        + [f"{c['gbs']:,.0f}" if c and c["bytes_per_launch"] else "-" for c in cells])
        for pdl in (True, False):
            if ("gemv", pdl) in by and ("gemv-merged", pdl) in by:
                extra = by[("gemv", pdl)]["us_per_launch"] - by[("gemv-merged", pdl)]["us_per_launch"]
                rows.append([f"gemv's chain adds ({'PDL' if pdl else 'plain'})", f"{extra:.2f}", "", "", ""])
        out += table(["chain", "us a launch, PDL", "us a launch, plain", "GB/s, PDL", "GB/s, plain"], rows) + [""]
    return out
