"""Where a kernel's warps wait, from Nsight Compute's source page (`ncu -i REPORT --page source --csv
--print-source sass`, as benchmarks/gpu/stalls.sh writes it): the warp-stall samples by reason, the samples and
the executed instructions by opcode, then the instructions with the most samples and their two main reasons.

    python benchmarks/sass_stalls.py kda-sass.csv --top 20
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(path: Path) -> list[dict[str, str]]:
    """The SASS rows of the CSV (its header is the row that starts with "Address")."""
    rows = list(csv.reader(path.open()))
    start = next(i for i, row in enumerate(rows) if row and row[0] == "Address")
    header = rows[start]
    return [dict(zip(header, row)) for row in rows[start + 1:] if len(row) == len(header)]


def number(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("", "-") else 0.0


def opcode(source: str) -> str:
    """`@!P4 LDG.E.128 R12, ...` -> LDG."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def share(counts: Counter, total: float, top: int) -> str:
    return ", ".join(f"{name} {100 * value / total:.1f}%" for name, value in counts.most_common(top))


def summarize(rows: list[dict[str, str]], top: int) -> str:
    reasons = [name for name in rows[0] if name.startswith("stall_") and "Not Issued" not in name]
    samples = sum(number(r[SAMPLES]) for r in rows)
    executed = sum(number(r[EXECUTED]) for r in rows)
    by_reason = Counter({name[len("stall_"):]: sum(number(r[name]) for r in rows) for name in reasons})
    by_op_samples, by_op_executed = Counter(), Counter()
    for r in rows:
        by_op_samples[opcode(r["Source"])] += number(r[SAMPLES])
        by_op_executed[opcode(r["Source"])] += number(r[EXECUTED])
    lines = [f"{len(rows)} instructions, {samples:,.0f} stall samples, {executed:,.0f} warp instructions executed",
             f"samples by reason: {share(by_reason, sum(by_reason.values()), 8)}",
             f"samples by opcode: {share(by_op_samples, samples, 10)}",
             f"executed by opcode: {share(by_op_executed, executed, 10)}"]
    for r in sorted(rows, key=lambda r: -number(r[SAMPLES]))[:top]:
        main = sorted(((number(r[name]), name[len("stall_"):]) for name in reasons), reverse=True)[:2]
        why = ", ".join(f"{name} {value:.0f}" for value, name in main if value)
        lines.append(f"{r['Address'][-6:]:>6} {100 * number(r[SAMPLES]) / samples:5.1f}%  {r['Source'][:64]:64}  {why}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--top", type=int, default=15, help="instructions listed, the most samples first")
    args = ap.parse_args()
    print(summarize(read_rows(args.csv), args.top))


if __name__ == "__main__":
    main()
