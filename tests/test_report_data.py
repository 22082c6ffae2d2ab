"""docs/benchmarks.md's file choice (`benchmarks/report_data.py`) and the decode step's weight-bandwidth limit:
runs of one subject on different GPUs are each shown, against their own GPU's copy bandwidth."""
from __future__ import annotations

import json

import pytest

from benchmarks.report_steps import gpu_pair_section, kernel_bandwidth_section, weight_bandwidth_limit
from benchmarks.report_data import load


def step_file(device: str, created: str, tok_s: float) -> dict:
    return {"benchmark": "step_profile", "created": created, "machine": {"device": device},
            "params": {"family": "nemotron_h", "size": "1b", "dtype": "bfloat16", "steps": 20, "prompt_len": 128},
            "rows": [{"batch": 1, "mode": "graph", "wall_ms": 1.0, "gpu_ms": 1.0, "launches": 1, "tok_s": tok_s}]}


def test_each_gpu_keeps_its_newest_run(tmp_path):
    files = {"h200-old": step_file("NVIDIA H200", "2026-12-01", 1.0),
             "h200-new": step_file("NVIDIA H200", "2026-12-02", 2.0),
             "h100": step_file("NVIDIA H100 80GB HBM3", "2026-12-03", 3.0)}
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    shown = load(tmp_path)["step_profile"]
    assert sorted((d["machine"]["device"], d["rows"][0]["tok_s"]) for d in shown) == [
        ("NVIDIA H100 80GB HBM3", 3.0), ("NVIDIA H200", 2.0)]


def test_weight_bandwidth_limit_follows_the_gpu():
    h200 = weight_bandwidth_limit(step_file("NVIDIA H200", "", 0.0))
    h100 = weight_bandwidth_limit(step_file("NVIDIA H100 80GB HBM3", "", 0.0))
    assert h200 == pytest.approx(2859) and h100 == pytest.approx(2859 * 3.0 / 4.2)
    assert weight_bandwidth_limit(step_file("cpu", "", 0.0)) is None


def test_the_gpu_pair_compares_each_gpus_newest_replay(tmp_path):
    """A family with a batch-1 graph replay on both GPUs gets a row (the newest run of each, H100 over H200); one
    with a replay on one GPU only gets none, and with no pair the section is left out."""
    h100 = "NVIDIA H100 80GB HBM3"
    runs = {"h100-old": (h100, "2026-12-01", 0.9), "h100": (h100, "2026-12-02", 0.6),
            "h200": ("NVIDIA H200", "2026-12-01", 0.5)}
    for name, (device, created, replay) in runs.items():
        data = step_file(device, created, 1.0)
        data["rows"][0]["replay_ms"] = replay
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    out = gpu_pair_section(load(tmp_path)["step_profile"])
    row = next(line for line in out if line.startswith("| nemotron_h"))
    assert "| 0.600 | 0.500 | 1.20x | `h100.json` | `h200.json` |" in row
    (tmp_path / "h200.json").unlink()
    assert gpu_pair_section(load(tmp_path)["step_profile"]) == []


def kernel_file(params: dict, created: str) -> dict:
    return {"benchmark": "kernel_bandwidth", "created": created, "machine": {"device": "NVIDIA H100 80GB HBM3"},
            "command": "kernel_bandwidth.py summarize", "complete": True, "params": dict(copy_gbs=3000.0, **params),
            "rows": [{"kernel": "_gemv_kernel", "launches": 2, "us": 9.0, "mb": 12.0, "gbs": 1333.3, "share": 0.444,
                      "over_us": 5.0}, {"kernel": "_rms_norm_kernel", "launches": 1, "us": 3.0, "mb": 0.01,
                                        "gbs": 3.3, "share": 0.001, "over_us": 3.0}]}


def test_kernel_profiles_are_one_subject_a_family_named_or_read_from_the_csv(tmp_path):
    files = {"old": kernel_file({"csv": "/out/ncu-kimi_linear-bs1.csv"}, "2026-12-01"),
             "new": kernel_file({"csv": "/out/x.csv", "family": "kimi_linear", "batch": 1}, "2026-12-02"),
             "other": kernel_file({"csv": "/out/ncu-nemotron_h-bs1.csv"}, "2026-12-01")}
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    shown = load(tmp_path)["kernel_bandwidth"]
    assert sorted(d["file"] for d in shown) == ["new.json", "other.json"]
    text = "\n".join(kernel_bandwidth_section(sorted(shown, key=lambda d: d["file"])))
    assert "### kimi_linear, batch 1, on NVIDIA H100" in text and "### nemotron_h, batch 1" in text
    assert "3 launches, 12.0 us one after another, 12.0 MB from DRAM: 4.0 us at the copy bandwidth" in text
    assert "beyond us" not in text  # runs before the floor was kept
    floored = dict(files["new"], extra={"floor_us": 2.5}, rows=[dict(r, beyond_us=r["over_us"] - 2.5 * r["launches"])
                                                                  for r in files["new"]["rows"]])
    text = "\n".join(kernel_bandwidth_section([dict(floored, file="new.json")]))
    assert "takes 2.50 us (the median under 200 kB)" in text and "| 0.0 |" in text  # 5.0 over, 2 launches
