"""`hybridcache bench serve`: a load generator for any OpenAI-compatible server (throughput, TTFT, TPOT, ITL,
latency)."""
from __future__ import annotations

import argparse
import sys


def add_bench_command(sub: argparse._SubParsersAction) -> None:
    from ..bench.serve import build_parser as bench_serve_flags  # stdlib only: --help stays fast

    bench = sub.add_parser("bench", help="client-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bench_serve = bench_sub.add_parser("serve", help="load-test an OpenAI-compatible server (like vllm bench serve)",
                                       description=sys.modules[bench_serve_flags.__module__].__doc__)
    bench_serve_flags(bench_serve).set_defaults(fn=cmd_bench_serve)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from ..bench.serve import run_from_args

    return run_from_args(args)
