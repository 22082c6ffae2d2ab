"""`--parallel-verify`: the recurrent verify kernels (GDN, KDA, Mamba2) in their parallel form for the whole
run (`ops/delta_rule_verify_triton.py`, `ops/mamba2/triton_verify.py`), to time it against the default."""
from __future__ import annotations

import argparse


def add_verify_form_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parallel-verify", action="store_true",
                    help="the verify kernels in their parallel form (default: the sequential form)")


def apply_verify_form(args: argparse.Namespace) -> None:
    from hybridcache.ops import delta_rule_verify_triton
    from hybridcache.ops.mamba2 import triton_verify

    delta_rule_verify_triton.PARALLEL = triton_verify.PARALLEL = bool(args.parallel_verify)
