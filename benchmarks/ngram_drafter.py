"""The n-gram drafter's host cost per row and step: `NgramDrafter.propose` (words searched with bytes.rfind)
against the plain scan it replaced (`drafter.scan_propose`, same answers), on one machine in one run.
Histories of random tokens: a 32,000-token vocabulary (no match: every suffix length is searched to the
start) and a 50-token one (matches everywhere).

    PYTHONPATH=. python benchmarks/ngram_drafter.py
"""
from __future__ import annotations

import argparse
import random

from benchmarks.record import Record, add_json_arg
from benchmarks.timing import median, time_runs
from hybridcache import SpeculativeConfig
from hybridcache.engine.drafter import NgramDrafter, scan_propose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[176, 1000, 4000, 16000])
    ap.add_argument("--k", type=int, default=3)
    add_json_arg(ap)
    args = ap.parse_args()
    config = SpeculativeConfig(num_draft_tokens=args.k)
    drafter = NgramDrafter(config)
    rec = Record(args.json, "ngram_drafter", "cpu", dict(k=args.k, max_ngram=config.max_ngram, min_ngram=config.min_ngram))
    print(f"k={args.k}, n-grams {config.max_ngram}..{config.min_ngram}; microseconds per proposal, median of 5")
    print(f"{'tokens':>7} {'vocabulary':>10} {'propose':>9} {'scan':>9} {'scan / propose':>15}")
    for n in args.lengths:
        for vocab in (32000, 50):
            rng = random.Random(n + vocab)
            tokens = [rng.randrange(vocab) for _ in range(n)]
            assert drafter.propose(tokens) == scan_propose(tokens, args.k, config.max_ngram, config.min_ngram)
            inner = max(1, 20000 // n)
            ours = median(time_runs(lambda: drafter.propose(tokens), "cpu", inner=inner)) * 1e6
            scan = median(time_runs(lambda: scan_propose(tokens, args.k, config.max_ngram, config.min_ngram), "cpu",
                                    inner=max(1, inner // 10))) * 1e6
            rec.add(tokens=n, vocabulary=vocab, propose_us=ours, scan_us=scan)
            print(f"{n:>7} {vocab:>10} {ours:>9.1f} {scan:>9.1f} {scan / ours:>14.1f}x")
    rec.close()


if __name__ == "__main__":
    main()
