"""hybridcache command line.

  run       the main job: the embedded default model, a workload under memory pressure with speculative
            decoding, checked against an unconstrained run without speculation
  generate  prompts (text or token ids) against any checkpoint directory
  serve     an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)
  bench serve  a load generator for any OpenAI-compatible server: throughput, TTFT, TPOT, ITL, latency

A mistake in the input (an option out of range, a checkpoint that cannot load) ends in one line on stderr
and exit code 2; options are checked before any model loads.
"""
from __future__ import annotations

import sys

from .args import DTYPE_CHOICES, Parser, byte_count
from .bench import add_bench_command
from .errors import fail, user_errors
from .generate import add_generate_command
from .models import default_model_dir, ensure_default_model
from .run import add_run_command
from .serve import add_serve_command

__all__ = ["DTYPE_CHOICES", "byte_count", "default_model_dir", "ensure_default_model", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hybridcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)  # subparsers are Parsers too
    add_run_command(sub)
    add_generate_command(sub)
    add_serve_command(sub)
    add_bench_command(sub)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except user_errors() as e:  # a mistake in the input, said in one line; a bug keeps its traceback
        fail(str(e) or type(e).__name__)
    except KeyboardInterrupt:
        print("hybridcache: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
