"""Command line: `hybridcache run` (main job on the embedded default), `generate`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the main job on the embedded default model")
    args = parser.parse_args(argv)
    if args.command == "run":
        print("hybridcache: the engine is not built yet; see the open issues.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
