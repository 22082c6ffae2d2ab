"""`graphs._Graph.load` on the CPU: what a replay reads is always the step's inputs, whether the repeated ones
(the same objects again) are copied or skipped. The graph itself needs CUDA; loading is plain copies."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from hybridcache.engine.graphs import _REPEATED, _Graph

NAMES = ("positions", "cached_lens", "page_table", *_REPEATED)


class Counting:
    """A static input that records its copies."""

    def __init__(self, t: torch.Tensor, name: str, log: list[str]) -> None:
        self.t, self.name, self.log = t, name, log

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> None:
        self.log.append(self.name)
        self.t.copy_(src, non_blocking=non_blocking)


def step_inputs(seed: int) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(**{n: torch.randint(0, 100, (4, 3) if n == "page_table" else (4,), generator=g)
                              for n in NAMES})


def test_a_replay_always_reads_the_steps_inputs():
    copies: list[str] = []
    static = SimpleNamespace(**{n: Counting(t, n, copies) for n, t in vars(step_inputs(0)).items()})
    graph = _Graph(None, torch.zeros(4, dtype=torch.long), static, None)
    first = step_inputs(1)
    second = SimpleNamespace(**vars(first))  # a steady step: repeated inputs are the same objects
    second.positions, second.cached_lens = first.positions + 1, first.cached_lens + 1
    third = SimpleNamespace(**vars(second))
    third.slots = first.slots + 5  # a new layout: another object
    want = [sorted(NAMES), ["cached_lens", "page_table", "positions"], ["cached_lens", "page_table", "positions", "slots"]]
    for i, (step, copied) in enumerate(zip((first, second, third), want)):
        if i == 1:
            first.page_table[0, 0] += 1  # the page table is written in place between steps: copied every time
        copies.clear()
        graph.load(torch.arange(4) + i, step)
        assert sorted(copies) == copied
        for n in NAMES:
            assert torch.equal(getattr(static, n).t, getattr(step, n)), n
        assert torch.equal(graph.input_ids, torch.arange(4) + i)
