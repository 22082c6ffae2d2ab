"""Speculative decoding cost and gain, as ratios to plain decode measured in one run (issue 9 targets):

  zero acceptance: every row proposes k tokens the model never picks (the verify costs, nothing is gained)
  full acceptance: an oracle proposes the speculative engine's own greedy continuation (every draft passes;
                   `self_consistent` says why that is not plain decode's in 16-bit)

Decode tok/s (the ratios' basis) = the tokens delivered after every request has its first token / the
time they take (`time_decode_phase`, the engine stepped from here): the steady rate, without the prefill
and the first token, which speculation does not touch. The three engines run interleaved and each ratio is the median of one round's ratios
(`paired_rates`); the whole call's ratio is printed beside it. With asynchronous scheduling (the
CUDA default) greedy verify steps draft on the device: both drafters propose there too.

    python benchmarks/spec_decode.py --family nemotron_h --size 1b --device cuda --dtype bfloat16
    python benchmarks/spec_decode.py --size tiny                                     # CPU smoke test
"""
from __future__ import annotations

import argparse
import os

import torch

from benchmarks.families import add_model_args, checkpoint
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import median, time_decode_phase

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class OracleDrafter:
    """Proposes the next `k` tokens of each request's reference continuation (matched by its prompt), on
    the host (`propose`) and on the device (`propose_on_device`, for asynchronous verify steps)."""

    def __init__(self, refs: dict[tuple[int, ...], list[int]], k: int) -> None:
        self.refs, self.k = refs, k
        self.prompt_len = len(next(iter(refs)))  # the prompts are of one length: a dict lookup per row
        longest = max(map(len, refs.values()))
        table = [list(p) + c + [-1] * (longest - len(c)) for p, c in refs.items()]
        self.table = torch.tensor(table, dtype=torch.long)  # [N, prompt + continuation], -1 past its end
        self.steps = torch.arange(k)
        self.matched: tuple[torch.Tensor, torch.Tensor] | None = None  # (a history tensor, its rows' table rows)

    def propose(self, tokens: list[int]) -> list[int]:
        cont = self.refs.get(tuple(tokens[: self.prompt_len]))
        n = len(tokens) - self.prompt_len
        return cont[n : n + self.k] if cont is not None and n >= 0 else []

    def propose_on_device(self, history: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`propose` per row of history [R, W], padded to k by repeating the last token; and how many are
        the reference's [R]."""
        if self.table.device != history.device:
            self.table = self.table.to(history.device)
            self.steps = torch.arange(self.k, device=history.device)
        if self.matched is None or self.matched[0] is not history:  # a row's prompt holds while its history lives
            P = self.prompt_len
            which = (history[:, None, :P] == self.table[None, :, :P]).all(-1).float().argmax(-1)  # [R]
            self.matched = (history, which[:, None])
        at = (lengths[:, None] + self.steps).clamp(max=self.table.shape[1] - 1)
        drafts = self.table[self.matched[1], at]
        real = drafts >= 0
        last = history.gather(1, (lengths - 1)[:, None])
        return torch.where(real, drafts, last), real.sum(-1)


class WrongDrafter:
    """Proposes `k` tokens that are never the greedy choice (the reference's next token plus one)."""

    def __init__(self, oracle: OracleDrafter, vocab: int) -> None:
        self.oracle, self.vocab = oracle, vocab

    def propose(self, tokens: list[int]) -> list[int]:
        return [(t + 1) % self.vocab for t in self.oracle.propose(tokens)] or [0] * self.oracle.k

    def propose_on_device(self, history: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        drafts, _ = self.oracle.propose_on_device(history, lengths)
        return (drafts + 1) % self.vocab, torch.full_like(lengths, self.oracle.k)


def self_consistent(spec, prompts, params, refs: dict, k: int, max_rounds: int = 12) -> tuple[dict, int]:
    """The speculative engine's own greedy continuations, for an oracle whose every draft it accepts; and
    the rounds that took. In 16-bit a verify step's GEMMs round differently from a decode step's, so on a
    random checkpoint (near-tied logits) the speculative greedy tokens drift from plain decode's, and an
    oracle of plain's tokens is then rejected from the first drift on. Each round proposes the previous
    round's outputs: they agree up to the first drift, where the state is the same as last round's, so
    that token is accepted too and the agreeing prefix grows every round until nothing changes."""
    for rounds in range(1, max_rounds + 1):
        use(OracleDrafter(refs, k), spec)
        out = {tuple(p): o.token_ids for p, o in zip(prompts, spec.generate(prompts, params))}
        if out == refs:
            break
        refs = out
    return refs, rounds


def use(drafter, llm) -> None:
    """Make `drafter` the speculative engine's, on the host and on the device."""
    llm.drafter.propose, llm.drafter.propose_on_device = drafter.propose, drafter.propose_on_device


def paired_rates(arms: dict, prompts, params, device: str, repeat: int) -> dict[str, dict]:
    """Per arm (name -> (engine, drafter or None)): the median decode tok/s and whole-call tok/s, and the
    medians of their ratios to the first arm's. The arms run interleaved, one run each a round, after one
    untimed round: a drift of the machine's speed over the run lands on every arm alike, and each ratio
    compares runs of one round."""
    b, n = len(prompts), params.max_tokens
    rounds = {name: [] for name in arms}
    for i in range(repeat + 1):
        for name, (llm, drafter) in arms.items():
            if drafter is not None:
                use(drafter, llm)
            run = time_decode_phase(llm, prompts, params, device)
            if i:
                rounds[name].append((run.decode_rate, b * n / run.call_s))
    base = next(iter(rounds.values()))
    return {name: dict(decode=median([d for d, _ in rs]), call=median([c for _, c in rs]),
                       decode_ratio=median([d / bd for (d, _), (bd, _) in zip(rs, base)]),
                       call_ratio=median([c / bc for (_, c), (_, bc) in zip(rs, base)]))
            for name, rs in rounds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backoff", type=int, default=None,
                    help="SpeculativeConfig.backoff_max_steps of the speculative engine (default: the config's; "
                         "0: it drafts at every step)")
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                    help="LLM(async_scheduling=...) for both engines (default: the LLM's, on for CUDA)")
    add_json_arg(ap)
    args = ap.parse_args()
    from hybridcache import LLM, SamplingParams, SpeculativeConfig
    from hybridcache.workload import make_prompts

    path = checkpoint(args)
    if args.backoff is None:
        args.backoff = SpeculativeConfig().backoff_max_steps
    rec = Record(args.json, "spec_decode", args.device, dict(family=args.family, size=args.size, dtype=args.dtype,
                                                           k=args.k, backoff=args.backoff, prompt_len=args.prompt_len,
                                                           max_tokens=args.max_tokens, repeats=args.repeat))
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rec.extra("decode_timing", "span")  # time_decode_phase: from the last first token's delivery on
    kw = dict(device=args.device, dtype=args.dtype, max_num_seqs=max(args.batch), max_num_batched_tokens=8192,
              max_model_len=args.prompt_len + args.max_tokens + args.k + 16, async_scheduling=args.async_scheduling)
    plain = LLM(path, **kw)
    spec = LLM(path, speculative=SpeculativeConfig(num_draft_tokens=args.k, backoff_max_steps=args.backoff), **kw)
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; k={args.k}, back-off {args.backoff}; prompt {args.prompt_len}, "
          f"{args.max_tokens} new tokens; median of {args.repeat}; decode tok/s (whole-call ratio in brackets)")
    print(f"{'batch':>5} {'plain':>9} {'zero-accept':>12} {'ratio':>15} {'full-accept':>12} {'ratio':>15}"
          "   targets: zero-accept >= 0.87x from bs16; full-accept >= 2.5x at bs1")
    for b in args.batch:
        prompts = make_prompts(b, plain.vocab_size, seed=b, min_len=args.prompt_len, max_len=args.prompt_len)
        refs = {tuple(p): o.token_ids for p, o in zip(prompts, plain.generate(prompts, params))}
        own, rounds = self_consistent(spec, prompts, params, refs, args.k)
        arms = {"plain": (plain, None), "zero": (spec, WrongDrafter(OracleDrafter(refs, args.k), plain.vocab_size)),
                "full": (spec, OracleDrafter(own, args.k))}
        m = paired_rates(arms, prompts, params, args.device, args.repeat)
        same = sum(own[tuple(p)] == refs[tuple(p)] for p in prompts)
        use(OracleDrafter(own, args.k), spec)
        accepted = sum(o.token_ids == own[tuple(p)] for p, o in zip(prompts, spec.generate(prompts, params)))
        zero, full = m["zero"], m["full"]
        rec.add(batch=b, plain_tok_s=m["plain"]["decode"], zero_accept_tok_s=zero["decode"],
                full_accept_tok_s=full["decode"], outputs_equal=same, oracle_rounds=rounds,
                oracle_fully_accepted=accepted, plain_call_tok_s=m["plain"]["call"], zero_accept_call_tok_s=zero["call"],
                full_accept_call_tok_s=full["call"], zero_accept_ratio=zero["decode_ratio"],
                zero_accept_call_ratio=zero["call_ratio"], full_accept_ratio=full["decode_ratio"],
                full_accept_call_ratio=full["call_ratio"])
        print(f"{b:>5} {m['plain']['decode']:>9.1f} {zero['decode']:>12.1f} {zero['decode_ratio']:>6.2f}x "
              f"({zero['call_ratio']:.2f}x) {full['decode']:>12.1f} {full['decode_ratio']:>6.2f}x ({full['call_ratio']:.2f}x)"
              f"   (outputs equal to plain: {same}/{b}; oracle after {rounds} rounds fully accepted: {accepted}/{b})")
    rec.close()


if __name__ == "__main__":
    main()
