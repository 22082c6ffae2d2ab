"""The pieces every section of docs/benchmarks.md is made of (`benchmarks/report.py`): the command and machine
under a table, and the table itself."""
from __future__ import annotations

from benchmarks.report_plots import on_gpu


def provenance(data: dict) -> list[str]:
    m = data.get("machine", {})
    lines = [f"Command: `{data['command']}`  ", f"Machine: {m.get('device', '?')}, torch {m.get('torch', '?')}"
             + (f", transformers {m['transformers']}" if "transformers" in m else "")
             + f"; run {data.get('created', '?')}; file `{data['file']}`."]
    if not on_gpu(data):
        lines.append("")
        lines.append("**CPU run: a smoke test, not a benchmark figure.**")
    if not data.get("complete", False):
        lines.append("")
        lines.append(f"**Run cut short: only the {len(data['rows'])} rows it finished are here.**")
    return lines


def eager(params: dict) -> str:
    return ", no CUDA graphs (--enforce-eager)" if params.get("enforce_eager") else ""


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
