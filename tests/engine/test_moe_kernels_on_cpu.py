"""Each family's MoE layers through a whole model on the fused kernels (`ops/moe`, run by Triton's interpreter)
against the same model on the torch paths. Only the experts' and routers' dispatch is switched (their modules'
`runs_triton`), every other op keeps its torch path, so any difference is the MoE kernels'.

nemotron_h: non-gated relu2 `Experts` behind a sigmoid `TopKRouter` (one group); qwen3_next: silu
`GatedExperts` behind a `SoftmaxTopKRouter`, beside a shared expert; kimi_linear (its grouped config): silu
`GatedExperts` behind a `TopKRouter` keeping 1 of 2 expert groups, top 3. A prefill of three prompts (36 tokens:
72 or 108 pairs, over MAX_PAIRS: the sorted kernels) and greedy decode steps of all three (6 or 9 pairs: the
one-pair-a-program kernels): logits within 2e-5 (fp32; the kernels sum
dot products in another order: ~1e-6 seen), the same greedy tokens, the manager's integrity after each step.
"""
from __future__ import annotations

import pytest
import torch

from hybridcache.models import load_model
from hybridcache.models.layers import experts, routers
from hybridcache.ops.triton_support import HAS_TRITON, interpreting
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

pytestmark = pytest.mark.skipif(not (HAS_TRITON and interpreting()) or torch.cuda.is_available(),
                                reason="needs triton in its CPU interpreter (TRITON_INTERPRET=1, no GPU)")

KIMI_GROUPED = next(c for name, c in kimi.CONFIGS.items() if "grouped router" in name)
SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny,
          "kimi_linear": lambda path: kimi.save_tiny(path, **KIMI_GROUPED)}
ROUTER = {"nemotron_h": "_group_topk_kernel", "qwen3_next": "_softmax_topk_kernel", "kimi_linear": "_group_topk_kernel"}
PROMPTS = {"a": [5, 17, 3, 40, 22, 9, 61, 7, 30], "b": [11, 2, 73, 8, 19],
           "c": [4, 33, 8, 21, 50, 6, 12, 71, 3, 28, 45, 9, 14, 60, 2, 37, 18, 25, 44, 10, 66, 31]}
DECODE_STEPS = 3


@pytest.fixture
def launched(monkeypatch) -> set[str]:
    """The names of the Triton kernels the interpreter runs during the test."""
    from triton.runtime.interpreter import InterpretedFunction

    names: set[str] = set()
    run = InterpretedFunction.run

    def spy(self, *args, **kwargs):
        names.add(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", spy)
    return names


@pytest.mark.parametrize("family", sorted(SAVERS))
def test_moe_kernels_give_the_torch_paths_logits(family, tmp_path, monkeypatch, launched):
    path, _ = SAVERS[family](tmp_path)
    drivers = {on: nemotron.Driver(load_model(path)) for on in (False, True)}

    def step(on: bool, call) -> list[torch.Tensor]:
        monkeypatch.setattr(experts, "runs_triton", lambda t: on)
        monkeypatch.setattr(routers, "runs_triton", lambda t: on)
        return call(drivers[on])

    def compare(ref: list[torch.Tensor], out: list[torch.Tensor], what: str) -> None:
        for r, a, b in zip(PROMPTS, ref, out):
            torch.testing.assert_close(b, a, rtol=0, atol=2e-5, msg=lambda m: f"{what}, request {r}: {m}")
            assert torch.equal(b.argmax(-1), a.argmax(-1)), f"{what}, request {r}: greedy tokens differ"

    ref = step(False, lambda d: d.prefill(PROMPTS))
    assert not launched
    compare(ref, step(True, lambda d: d.prefill(PROMPTS)), "prefill")
    sorted_kernels = {"_sort_pairs_kernel", "_sorted_up_kernel", "_sorted_down_kernel", "_sorted_sum_kernel"}
    assert launched == sorted_kernels | {ROUTER[family]}, sorted(launched)
    launched.clear()
    for i in range(DECODE_STEPS):
        rows = [(r, [int(logits[-1].argmax())]) for r, logits in zip(PROMPTS, ref)]
        outs = []
        for on in (False, True):
            outs.append(step(on, lambda d: d.step([], rows)))
            drivers[on].accept([1] * len(rows))
        compare(*outs, f"decode step {i}")
        ref = outs[0]
    assert {"_up_kernel", "_down_kernel"} <= launched and "_sorted_up_kernel" not in launched, sorted(launched)
