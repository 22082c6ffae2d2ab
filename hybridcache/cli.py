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

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

# engine.llm.DTYPES and "auto" (the checkpoint's own); spelled out so that --help imports no torch
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


# ------------------------------------------------------------------------------ user mistakes
class UsageError(Exception):
    """A command line the CLI refuses before any model loads."""


class Parser(argparse.ArgumentParser):
    """Help with defaults and the raw module docstring; an error is one line on stderr and exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", prog=self.prog)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default, with or without help text; an unset default (None, off, empty) is
    left to the help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS
        if unset or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def fail(message: str, prog: str = "hybridcache") -> NoReturn:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


def user_errors() -> tuple[type[BaseException], ...]:
    """The library's typed errors that mean "your input is wrong", not "this is a bug"."""
    from .cache.errors import BudgetTooSmallError, LayoutError
    from .engine.errors import InvalidParamsError, InvalidRequestError, SchedulerStuckError
    from .models.errors import ModelLoadError
    from .disagg.errors import KVTransferError, TransferLayoutError
    from .parallel.errors import ShardingError

    return (UsageError, InvalidParamsError, InvalidRequestError, ModelLoadError, BudgetTooSmallError, LayoutError,
            SchedulerStuckError, ShardingError, KVTransferError, TransferLayoutError)


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def float_at_least(low: float, above: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if above else '>='} {low}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def probability(text: str) -> float:
    value = float_at_least(0.0, above=True)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def seed(text: str) -> int:
    value = int_at_least(0)(text)
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"must be < 2**64, got {value}")
    return value


def token_ids(text: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3]; anything but comma-separated non-negative ints is refused."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and p.isascii() for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids >= 0 like 1,2,3, got {text!r}")
    return [int(p) for p in parts]


BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(text: str) -> int:
    """`1048576`, `64M`, `2G`, `512KiB` -> bytes (binary units)."""
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = number[-1:] if number[-1:] in BYTE_UNITS else ""
    try:
        value = int(number[: len(number) - len(unit)]) * BYTE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count like 1048576, 64M or 2G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 byte, got {text!r}")
    return value


def check_device(name: str) -> None:
    """Refuse a device torch cannot parse, CUDA without a GPU, or a GPU index past the last."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {name!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    elif device.type != "cpu":
        raise UsageError(f"--device {name}: only cpu and cuda are supported")


def check_model(model_dir: Path | str) -> dict[str, Any]:
    """config.json read and its model_type known, before any weight loads; returns the config."""
    from .models import model_class
    from .models.checkpoint import read_config

    config = read_config(model_dir)
    model_class(config.get("model_type"))
    return config


def default_model_dir() -> Path:
    root = Path(os.environ.get("HYBRIDCACHE_HOME", Path.home() / ".cache" / "hybridcache"))
    return root / "default-nemotron-h"


def ensure_default_model(path: Path) -> Path:
    """Build the default checkpoint once; rebuild when its recipe (config, seed, tokenizer, versions) changes."""
    from .models import default

    recipe = default.recipe()
    stamp = path / "RECIPE"
    if not stamp.exists() or stamp.read_text() != recipe:
        default.build_default_checkpoint(path)
        stamp.write_text(recipe)
    return path


def cmd_run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from . import LLM, SamplingParams, SpeculativeConfig
    from .cache import sizing_of
    from .workload import make_prompts

    torch.manual_seed(0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    spec = SpeculativeConfig(method="ngram", num_draft_tokens=args.num_draft_tokens)
    check_device(args.device)
    model_dir = Path(args.model) if args.model else ensure_default_model(default_model_dir())
    check_model(model_dir)  # the LLM picks torch threads for a tiny model on the CPU
    reference = LLM(model_dir, device=args.device, max_num_seqs=args.num_requests, speculative=None,
                    max_num_batched_tokens=4096, tensor_parallel_size=args.tensor_parallel_size,
                    pipeline_parallel_size=args.pipeline_parallel_size)
    prompts = make_prompts(args.num_requests, reference.vocab_size, seed=args.seed)
    longest = max(map(len, prompts)) + args.max_tokens + args.num_draft_tokens + 1
    model = reference.model  # the speculative run's cache is sized from the same layers (this rank's), with drafts
    if reference.stages is not None:  # pipeline stages: the budget covers every stage's layers
        from .models.loader import model_on_meta
        model = model_on_meta(model_dir, reference.dtype)
    sizing = sizing_of(model.state_modules(args.num_draft_tokens), model.page_roles(16))
    # a slot for every sequence but pages for about a third of the batch at full length: growth forces
    # suspensions; a host tier of a few requests forces re-prefills too
    per_request = sizing.request_bytes(longest, 16)
    page_bytes = per_request - sizing.bytes_per_slot
    device_bytes = args.max_num_seqs * sizing.bytes_per_slot + int(page_bytes * max(2, args.max_num_seqs / 3))
    host_bytes = int(per_request * args.host_requests)
    llm = LLM(model_dir, device=args.device, max_num_seqs=args.max_num_seqs, speculative=spec,
              device_cache_bytes=device_bytes, host_cache_bytes=host_bytes, max_num_batched_tokens=256,
              num_slots=args.max_num_seqs, tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    bar = tqdm(total=len(prompts), desc="requests", unit="req", disable=args.quiet)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, progress=lambda done, total: bar.update(done - bar.n))
    elapsed = time.perf_counter() - t0
    bar.close()
    tokens = sum(len(o.token_ids) for o in outs)

    t0 = time.perf_counter()
    ref = reference.generate(prompts, params)
    ref_elapsed = time.perf_counter() - t0
    same = sum(o.token_ids == r.token_ids for o, r in zip(outs, ref))
    s = llm.stats
    rate = s.num_accepted_tokens / max(s.num_draft_tokens, 1)
    print(f"model               {model_dir}")
    print(f"device budget       {device_bytes / 1e6:.2f} MB ({llm.manager.num_slots} slots, {llm.manager.num_pages} pages); "
          f"host {host_bytes / 1e6:.2f} MB")
    print(f"requests            {len(outs)}")
    print(f"tokens              {tokens}")
    print(f"tokens/s            {tokens / elapsed:.1f}  ({elapsed:.2f} s, {s.num_steps} steps); unconstrained "
          f"without speculation {tokens / ref_elapsed:.1f} ({elapsed / ref_elapsed:.2f}x its time)")
    print(f"suspensions         {s.num_suspensions}")
    print(f"resumes             {s.num_resumes}")
    print(f"re-prefills         {s.num_reprefills}")
    print(f"moved               {s.bytes_to_host / 1e6:.2f} MB to host, {s.bytes_to_device / 1e6:.2f} MB to device")
    print(f"draft acceptance    {s.num_accepted_tokens}/{s.num_draft_tokens} = {rate:.1%}")
    print(f"equal to the unconstrained run without speculation: {same}/{len(outs)} "
          f"{'yes' if same == len(outs) else 'NO'}")
    llm.manager.check_integrity()
    return 0 if same == len(outs) else 1


def cmd_generate(args: argparse.Namespace) -> int:
    from . import LLM, SamplingParams, SpeculativeConfig

    # everything the command line says is checked before the model loads (seconds for a real checkpoint)
    if bool(args.token_ids) == bool(args.prompt):
        raise UsageError("give --prompt TEXT or --token-ids 1,2,3 (repeatable), not both")
    prompts: list = args.token_ids or args.prompt
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    spec = SpeculativeConfig(num_draft_tokens=args.num_draft_tokens) if args.num_draft_tokens else None
    check_device(args.device)
    model_dir = args.model or ensure_default_model(default_model_dir())
    config = check_model(model_dir)
    vocab = config.get("vocab_size")
    bad = [t for ids in args.token_ids for t in ids if isinstance(vocab, int) and t >= vocab]
    if bad:
        raise UsageError(f"--token-ids: {bad[0]} is outside the vocabulary [0, {vocab})")
    llm = LLM(model_dir, device=args.device, dtype=args.dtype, speculative=spec, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              device_cache_bytes=args.device_cache_bytes, host_cache_bytes=args.host_cache_bytes,
              page_size=args.page_size, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    try:
        for out in llm.generate(prompts, params):
            print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    finally:
        llm.close()  # stops tensor-parallel workers
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server.app import serve
    except ImportError as e:
        raise UsageError(f"serve needs the server extras (fastapi, uvicorn, prometheus_client): {e}") from None
    import logging

    from . import LLM

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


def serve_pair_side(args: argparse.Namespace, llm: Any, serve: Callable[..., None], default_name: str) -> int:
    """`serve --role prefill`: serve one decode server over the link until it ends the pair (no HTTP).
    `serve --role decode`: the front door, prefilling at the prefill server."""
    from .disagg import KVTransferConfig
    from .disagg.remote import PrefillServer, RemotePrefill

    logging = __import__("logging").getLogger("hybridcache.serve")
    if args.role == "prefill":
        link = KVTransferConfig("kv_producer", kv_ip=args.kv_ip, kv_port=args.kv_port, kv_timeout_s=args.kv_timeout_s)
        logging.info("prefill server: waiting for a decode server on %s:%d", args.kv_ip, args.kv_port)
        server = PrefillServer(llm, link)
        try:
            server.serve()
        finally:
            server.close()
            llm.close()
        return 0
    link = KVTransferConfig("kv_consumer", kv_ip=args.kv_ip, kv_port=args.kv_port, kv_timeout_s=args.kv_timeout_s)
    front = RemotePrefill(llm, link)
    try:
        serve(front, args.served_model_name or default_name, host=args.host, port=args.port, max_queued=args.max_queued)
    finally:
        front.close()
        llm.close()
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from .bench.serve import run_from_args

    return run_from_args(args)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hybridcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)  # subparsers are Parsers too

    run = sub.add_parser("run", help="the main job on the embedded default model")
    run.add_argument("--model", help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    run.add_argument("--num-requests", type=int_at_least(1), default=24, help="requests in the workload")
    run.add_argument("--max-tokens", type=int_at_least(1), default=48, help="tokens generated per request")
    run.add_argument("--max-num-seqs", type=int_at_least(1), default=8, help="requests running at once")
    run.add_argument("--num-draft-tokens", type=int_at_least(1), default=3, help="n-gram drafts per step")
    run.add_argument("--host-requests", type=float_at_least(0.0), default=3.0,
                     help="host tier size, in full-length requests")
    run.add_argument("--seed", type=seed, default=0, help="seed of the workload's prompts")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, metavar="N",
                     help="shard the model and cache over N ranks (worker processes started here; docs/parallel.md)")
    run.add_argument("--pipeline-parallel-size", type=int_at_least(1), default=1, metavar="N",
                     help="split the layers and their cache over N stages (processes started here; docs/parallel.md)")
    run.set_defaults(fn=cmd_run)

    gen = sub.add_parser("generate", help="generate from prompts against a checkpoint directory")
    gen.add_argument("--model", help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    gen.add_argument("--prompt", action="append", default=[], help="a text prompt (needs a tokenizer); repeatable")
    gen.add_argument("--token-ids", action="append", type=token_ids, default=[],
                     help="comma-separated token ids; repeatable")
    gen.add_argument("--max-tokens", type=int_at_least(1), default=32, help="tokens generated per prompt")
    gen.add_argument("--temperature", type=float_at_least(0.0), default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling; 1: off")
    gen.add_argument("--top-k", type=int_at_least(0), default=0, help="0: off")
    gen.add_argument("--seed", type=seed, default=None, help="default: one per request, from the engine seed")
    gen.add_argument("--ignore-eos", action="store_true", help="generate max-tokens even past eos")
    gen.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    gen.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="weights and activations")
    cache = gen.add_argument_group("cache and batching")
    cache.add_argument("--num-draft-tokens", type=int_at_least(0), default=0,
                       help="n-gram speculation with k drafts (0: off)")
    cache.add_argument("--max-num-seqs", type=int_at_least(1), default=8, help="requests running at once")
    cache.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=512, help="tokens per step")
    cache.add_argument("--max-model-len", type=int_at_least(1), default=None,
                       help="longest prompt + output (default: the config's max_position_embeddings)")
    cache.add_argument("--device-cache-bytes", type=byte_count, default=None,
                       help="device budget for slots and pages, e.g. 64M (default: max-num-seqs full-length requests)")
    cache.add_argument("--host-cache-bytes", type=byte_count, default=None,
                       help="host tier for suspended requests, e.g. 256M (default: as large as the device budget)")
    cache.add_argument("--page-size", type=int_at_least(1), default=16, help="tokens per attention page")
    cache.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    cache.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, metavar="N",
                       help="shard the model and cache over N ranks (worker processes started here; docs/parallel.md)")
    cache.add_argument("--pipeline-parallel-size", type=int_at_least(1), default=1, metavar="N",
                       help="split the layers and their cache over N stages (processes started here; docs/parallel.md)")
    gen.set_defaults(fn=cmd_generate)

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
    srv.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, metavar="N",
                     help="shard the model and cache over N ranks (worker processes started here; docs/parallel.md)")
    srv.add_argument("--pipeline-parallel-size", type=int_at_least(1), default=1, metavar="N",
                     help="split the layers and their cache over N stages (processes started here; docs/parallel.md)")
    srv.add_argument("--role", choices=("prefill", "decode"), default=None,
                     help="one side of a disaggregated pair (docs/parallel.md): decode is the front door (this API) "
                          "and sends prompts to the prefill server, which listens on --kv-ip:--kv-port; "
                          "without it the server does both")
    srv.add_argument("--kv-ip", default="127.0.0.1", help="where the prefill server of a pair listens")
    srv.add_argument("--kv-port", type=int_at_least(1), default=14579, help="the prefill server's port of a pair")
    srv.add_argument("--kv-timeout-s", type=float, default=60.0, help="link operations of a pair fail after this")
    srv.set_defaults(fn=cmd_serve)

    from .bench.serve import build_parser as bench_serve_flags  # stdlib only: --help stays fast

    bench = sub.add_parser("bench", help="client-side benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bench_serve = bench_sub.add_parser("serve", help="load-test an OpenAI-compatible server (like vllm bench serve)",
                                       description=sys.modules[bench_serve_flags.__module__].__doc__)
    bench_serve_flags(bench_serve).set_defaults(fn=cmd_bench_serve)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except user_errors() as e:  # a mistake in the input, said in one line; a bug keeps its traceback
        fail(str(e) or type(e).__name__)
    except KeyboardInterrupt:
        print("hybridcache: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
