"""`hybridcache serve --role prefill|decode`: one side of a disaggregated prefill/decode pair."""
from __future__ import annotations

import argparse
from typing import Any, Callable


def serve_pair_side(args: argparse.Namespace, llm: Any, serve: Callable[..., None], default_name: str) -> int:
    """`serve --role prefill`: serve one decode server over the link until it ends the pair (no HTTP).
    `serve --role decode`: the front door, prefilling at the prefill server."""
    from ..disagg import KVTransferConfig
    from ..disagg.remote import PrefillServer, RemotePrefill

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
