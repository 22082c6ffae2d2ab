"""`hybridcache serve`: an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)."""
from __future__ import annotations

import argparse
from pathlib import Path

from .args import DTYPE_CHOICES, add_parallel_flags, byte_count, int_at_least
from .errors import UsageError
from .models import check_device, check_model, default_model_dir, ensure_default_model
from .serve_pair import serve_pair_side


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (FastAPI + uvicorn) with /metrics")
    srv.add_argument("model", nargs="?", default=None,
                     help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    srv.add_argument("--port", type=int_at_least(0), default=8000, help="port to listen on")
    srv.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the dir name)")
    srv.add_argument("--max-queued", type=int_at_least(1), default=256,
                     help="unfinished requests held at once; more are answered 503")
    srv.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    srv.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="weights and activations")
    srv.add_argument("--max-num-seqs", type=int_at_least(1), default=8, help="requests running at once")
    srv.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=512, help="tokens per step")
    srv.add_argument("--max-model-len", type=int_at_least(1), default=None,
                     help="longest prompt + output (default: the config's max_position_embeddings)")
    srv.add_argument("--device-cache-bytes", type=byte_count, default=None, help="device budget, e.g. 64M")
    srv.add_argument("--host-cache-bytes", type=byte_count, default=None, help="host tier, e.g. 256M")
    srv.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    srv.add_argument("--enable-prefix-caching", action="store_true",
                     help="reuse cached prompt prefixes: shared attention pages and recurrent-state snapshots")
    add_parallel_flags(srv)
    srv.add_argument("--role", choices=("prefill", "decode"), default=None,
                     help="one side of a disaggregated pair (docs/parallel.md): decode is the front door (this API) "
                          "and sends prompts to the prefill server, which listens on --kv-ip:--kv-port; "
                          "without it the server does both")
    srv.add_argument("--kv-ip", default="127.0.0.1", help="where the prefill server of a pair listens")
    srv.add_argument("--kv-port", type=int_at_least(1), default=14579, help="the prefill server's port of a pair")
    srv.add_argument("--kv-timeout-s", type=float, default=60.0, help="link operations of a pair fail after this")
    srv.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..server.app import serve
    except ImportError as e:
        raise UsageError(f"serve needs the server extras (fastapi, uvicorn, prometheus_client): {e}") from None
    import logging

    from .. import LLM

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    check_device(args.device)
    model_dir = args.model or ensure_default_model(default_model_dir())
    check_model(model_dir)
    llm = LLM(model_dir, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              device_cache_bytes=args.device_cache_bytes, host_cache_bytes=args.host_cache_bytes,
              enforce_eager=args.enforce_eager, enable_prefix_caching=args.enable_prefix_caching,
              tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    if args.role is not None:
        return serve_pair_side(args, llm, serve, Path(model_dir).resolve().name)
    name = args.served_model_name or Path(model_dir).resolve().name
    serve(llm, name, host=args.host, port=args.port, max_queued=args.max_queued)
    return 0
