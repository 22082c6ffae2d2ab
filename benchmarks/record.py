"""A benchmark's figures as JSON (`--json PATH`): the command that produced them, the machine, the
parameters and one row per measurement. The file is rewritten after every row, so a run cut short (a
timeout) keeps what it measured. `benchmarks/report.py` turns a folder of these into docs/benchmarks.md.

    {"benchmark": "swap_vs_reprefill", "command": "PYTHONPATH=. python benchmarks/swap_vs_reprefill.py ...",
     "machine": {"device": "NVIDIA H200", "torch": "2.11.0", ...}, "params": {...}, "extra": {...},
     "rows": [{"context": 512, "swap_in_ms": 0.2, ...}, ...], "complete": true}
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def add_json_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", metavar="PATH", help="write the figures (rows with their parameters) as JSON")


def command() -> str:
    """The command line that ran this process, as one would type it from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_arg = str(script.relative_to(ROOT))
    except ValueError:
        script_arg = sys.argv[0]
    return " ".join(["PYTHONPATH=. python", shlex.quote(script_arg), *map(shlex.quote, sys.argv[1:])])


def machine(device: str) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    dev = torch.device(device)
    if dev.type == "cuda":
        info["device"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    if "transformers" in sys.modules:
        info["transformers"] = sys.modules["transformers"].__version__
    return info


class Record:
    """Rows of one benchmark run, written to `path` (nothing written when `path` is None)."""

    def __init__(self, path: str | None, benchmark: str, device: str, params: dict) -> None:
        self.path = Path(path) if path else None
        self.data = {
            "benchmark": benchmark,
            "command": command(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(device),
            "params": params,
            "extra": {},
            "rows": [],
            "complete": False,
        }
        self._write()

    def add(self, **row) -> None:
        self.data["rows"].append(row)
        self._write()

    def extra(self, key: str, value) -> None:
        self.data["extra"][key] = value
        self._write()

    def close(self) -> None:
        self.data["machine"] = machine_refresh(self.data["machine"])
        self.data["complete"] = True
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)  # atomic: a kill mid-write leaves the previous rows


def machine_refresh(info: dict) -> dict:
    """Add library versions imported after the record was opened (transformers is imported lazily)."""
    if "transformers" not in info and "transformers" in sys.modules:
        info = {**info, "transformers": sys.modules["transformers"].__version__}
    return info
