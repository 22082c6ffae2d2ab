"""Which benchmark JSON files docs/benchmarks.md shows: where a folder holds several files for the same thing
(a family, an op, a context sweep) on the same kind of device, the newest wins; step_profile files of a family
merge by (batch, mode), newer over older, each row naming its file. Runs on different GPUs are different
subjects, each shown."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


MERGED = {"step_profile"}  # a run of some modes leaves the other modes' rows of older runs standing


def load(folder: Path) -> dict[str, list[dict]]:
    """The newest file per (benchmark, subject, device), grouped by benchmark (MERGED benchmarks: `merge_rows`)."""
    files: dict[tuple, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            print(f"skipping {path}: not JSON")
            continue
        if not isinstance(data, dict) or "benchmark" not in data or "rows" not in data:
            continue
        data["file"] = path.name
        files[(data["benchmark"], subject(data), data.get("machine", {}).get("device"))].append(data)
    out: dict[str, list[dict]] = defaultdict(list)
    for (bench, *_), group in sorted(files.items(), key=lambda kv: (kv[0][0], str(kv[0][1:]))):
        group.sort(key=lambda d: d.get("created", ""))  # stable: of equal times the later name is the newest
        out[bench].append(merge_rows(group) if bench in MERGED else group[-1])
    return out


def merge_rows(group: list[dict]) -> dict:
    """The newest of `group` (oldest first) with the rows of older files whose (batch, mode) it lacks, each row
    marked with its file; `sources`: the files that gave rows, newest first."""
    rows: dict[tuple, dict] = {}
    for data in reversed(group):
        for r in data["rows"]:
            rows.setdefault((r["batch"], r["mode"]), dict(r, file=data["file"]))
    modes = list(dict.fromkeys(mode for _, mode in rows))  # as the newest file orders them, then older ones
    sources = [d for d in reversed(group) if any(r["file"] == d["file"] for r in rows.values())]
    return dict(group[-1], rows=sorted(rows.values(), key=lambda r: (r["batch"], modes.index(r["mode"]))),
                sources=sources)


def subject(data: dict) -> tuple:
    p = data.get("params", {})
    if data["benchmark"] == "spec_decode":  # a run of other batch sizes is another subject
        return (p.get("family"), p.get("size"), p.get("dtype"), p.get("device"), p.get("backoff", 0),
                tuple(r["batch"] for r in data["rows"]))
    if data["benchmark"] in ("engine_throughput", "swap_vs_reprefill", "step_profile"):
        return (p.get("family"), p.get("size"), p.get("dtype"), p.get("device"), p.get("backoff", 0))
    if data["benchmark"] == "prefix_cache":  # a budget sweep is another subject than the run
        return (p.get("size"), p.get("device"), tuple(p.get("workloads", ())), tuple(p.get("cache_scale", ())),
                p.get("host_scale"))
    if data["benchmark"] == "ops_kernels":  # a decode sweep, a prefill-only rerun and one of a few rows differ
        return (tuple(sorted({str(r.get("kind")) for r in data["rows"]})), tuple(p.get("prefill_ops", ())),
                tuple(p.get("prefill_shapes", ())))
    if data["benchmark"] == "kernel_bandwidth":
        return (profiled_family(p), p.get("batch", 1))
    return (p.get("op"), p.get("device"))


def profiled_family(params: dict) -> str:
    """A kernel_bandwidth run's family: its --family, else (runs before that was recorded) the name of
    bs1_kernels.sh's CSV, ncu-<family>-bs<batch>.csv."""
    return params.get("family") or Path(params.get("csv", "?")).stem.removeprefix("ncu-").rsplit("-bs", 1)[0]
