"""What a decode or verify graph replays, run on the CPU: `DecodeGraphs` with the CUDA capture replaced by
a stand-in that reruns the captured forward into the same static outputs at each replay. Everything
around the capture is the real code: the static inputs, the warm-up with every slot -1 (no state may be
touched), `_Graph.load` (repeated inputs copied only when they change), and for greedy verify steps the
tail inside the graph (`greedy_verify_choice`, the state modules' accept hooks through
`CacheStore.accept_on_device`) whose packed output `AsyncVerify` copies back. The tokens must equal the
synchronous speculative engine's and plain decode's, for the three families (Mamba2 and GDN replay
bookkeeping, KDA pending drafts), with the cache intact after every step. On CUDA the real graphs run the
same body (tests/engine/test_cuda_async_verify.py). Batches here are 1, 2 or 4 rows (whole buckets): a
padding row (no pages) is CUDA's alone, where the attention kernels skip it; the CPU attention refuses a
token with no page (`PageTableError`)."""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine import graphs
from tests.engine.test_async_scheduling import assert_idle_and_empty, checkpoint, outputs  # noqa: F401
from tests.engine.test_async_verify import KW, SPEC, repetitive


class Rerun:
    """Stands in for a captured CUDA graph: `replay()` runs the forward again into the static outputs."""

    def __init__(self, run) -> None:
        self.replay = run


class EagerGraphs(graphs.DecodeGraphs):
    def _capture(self, input_ids, batch, bucket, choice_inputs):
        ids, static = graphs.padded_inputs(input_ids, batch, bucket)
        inputs = graphs.padded_choice_inputs(choice_inputs, bucket)
        outs = self._forward(ids, static, inputs)  # the warm-up: every slot -1, no state touched

        def rerun() -> None:
            for static_out, out in zip(outs, self._forward(ids, static, inputs)):
                if static_out is not None:
                    static_out.copy_(out)

        self.num_captured += 1
        return graphs._Graph(Rerun(rerun), ids, static, outs[0], rows=bucket, choice_inputs=inputs, choice=outs[1],
                             counts=outs[2])


def with_eager_graphs(llm: LLM) -> LLM:
    llm.runner.graphs = EagerGraphs(llm.runner.model, llm.manager.store)
    return llm


def test_greedy_verify_graphs_choose_and_accept_as_the_eager_step(checkpoint):
    prompts = repetitive(3, 2)  # two rows, then one: their accepted drafts differ, so they finish apart
    params = [SamplingParams(max_tokens=28 + 5 * i, temperature=0.0, ignore_eos=True) for i in range(2)]
    plain = outputs(LLM(checkpoint, **KW), prompts, params)
    sync = LLM(checkpoint, speculative=SPEC, async_scheduling=False, **KW)
    assert outputs(sync, prompts, params) == plain
    llm = with_eager_graphs(LLM(checkpoint, speculative=SPEC, async_scheduling=True, **KW))
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == plain
    g = llm.runner.graphs
    assert g.num_choices > 0 and g.num_padding_rows == 0
    assert (llm.stats.num_accepted_tokens, llm.stats.num_draft_tokens) == (sync.stats.num_accepted_tokens,
                                                                           sync.stats.num_draft_tokens)
    assert llm.stats.num_accepted_tokens > 0 and llm.manager.planner.unsettled == []
    assert_idle_and_empty(llm)


def test_backed_off_rows_chain_one_token_graphs(checkpoint, monkeypatch):
    """Drafts that always miss: most steps are one-token steps chained on the verify in flight, each a
    greedy graph of width 1 (counts 1, the accept hooks run with no draft to keep)."""
    prompts = repetitive(9, 2)
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * 2
    plain = outputs(LLM(checkpoint, **KW), prompts, params)
    llm = with_eager_graphs(LLM(checkpoint, speculative=SpeculativeConfig(num_draft_tokens=3, backoff_max_steps=8),
                                async_scheduling=True, **KW))
    vocab = llm.vocab_size

    def wrong(history, lengths):
        last = history.gather(1, (lengths - 1)[:, None])
        return (last + 1 + torch.arange(3, device=last.device)) % vocab, torch.full_like(lengths, 3)

    monkeypatch.setattr(llm.drafter, "propose_on_device", wrong)
    widths = []
    run = llm.runner.graphs.run_verify_choice
    monkeypatch.setattr(llm.runner.graphs, "run_verify_choice", lambda ids, batch, proposed, sampling: (
        widths.append(batch.generation_tokens), run(ids, batch, proposed, sampling))[1])
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == plain
    assert widths.count(1) > widths.count(4) > 0, widths
    assert llm.stats.num_accepted_tokens == 0
    assert_idle_and_empty(llm)


def test_sampled_verify_graphs_draw_as_the_eager_step(checkpoint):
    """A greedy row beside a sampled one: the graph's tail is the device sampler's draft rejection and draws
    (counter-based: a replay draws what an eager step would), the sampling parameters static inputs, the
    output positions chained on the device; the tokens equal the synchronous speculative engine's."""
    prompts = repetitive(5, 2)
    params = [SamplingParams(max_tokens=30 + 4 * i, temperature=0.8 * i, top_p=0.9, seed=7 + i, ignore_eos=True)
              for i in range(2)]
    sync = LLM(checkpoint, speculative=SPEC, async_scheduling=False, **KW)
    want = outputs(sync, prompts, params)
    llm = with_eager_graphs(LLM(checkpoint, speculative=SPEC, async_scheduling=True, **KW))
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == want
    tails = {key[-1] for key in llm.runner.graphs._graphs}
    assert llm.runner.graphs.num_choices > 0 and "sampled" in tails
    assert llm.stats.num_accepted_tokens == sync.stats.num_accepted_tokens > 0
    assert_idle_and_empty(llm)


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_plain_decode_graphs_give_the_eager_tokens(checkpoint, greedy, overlap):
    """No speculation. Asynchronous decode replays the forward-only graphs and samples outside them (the
    tokens stay on the device for the next step); a synchronous step's graph chooses its tokens itself
    (a verify tail of width 1). Both give the eager engine's tokens."""
    prompts = repetitive(4, 4)
    params = [SamplingParams(max_tokens=12, temperature=0.0 if greedy else 0.8, seed=i, ignore_eos=True)
              for i in range(4)]
    plain = outputs(LLM(checkpoint, async_scheduling=False, **KW), prompts, params)
    llm = with_eager_graphs(LLM(checkpoint, async_scheduling=overlap, **KW))
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == plain
    g = llm.runner.graphs
    assert g.num_replays > 0 and (g.num_choices == 0 if overlap else g.num_choices > 0)


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "prefix caching"])
def test_synchronous_verify_graphs_choose_as_the_eager_step(checkpoint, prefix):
    """Speculation with synchronous steps (as prefix caching runs them): generation-only steps choose and
    accept in their graph, greedy and sampled rows; the tokens and accept counts are the eager engine's."""
    prompts = repetitive(11, 2)
    params = [SamplingParams(max_tokens=24 + 4 * i, temperature=0.7 * i, seed=3 + i, ignore_eos=True)
              for i in range(2)]
    kw = dict(KW, speculative=SPEC, async_scheduling=False, enable_prefix_caching=prefix)
    eager = LLM(checkpoint, **kw)
    want = outputs(eager, prompts, params)
    llm = with_eager_graphs(LLM(checkpoint, **kw))
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == want
    assert llm.runner.graphs.num_choices > 0 and {key[-1] for key in llm.runner.graphs._graphs} >= {"sampled"}
    assert llm.stats.num_accepted_tokens == eager.stats.num_accepted_tokens > 0
    if prefix:  # the cache keeps the turns' pages and snapshots
        assert llm.manager.requests() == [] and llm.manager.planner.prefix.stats == eager.manager.planner.prefix.stats
    else:
        assert_idle_and_empty(llm)


def test_a_tail_that_cannot_be_captured_keeps_the_forward_graph(checkpoint, monkeypatch):
    """Where a verify graph's tail is refused (as a capture that meets a host sync is), the step replays the
    forward-only graph and chooses eagerly: the same tokens, and no step runs the model eagerly."""
    prompts = repetitive(6, 2)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * 2
    want = outputs(LLM(checkpoint, speculative=SPEC, async_scheduling=False, **KW), prompts, params)
    llm = with_eager_graphs(LLM(checkpoint, speculative=SPEC, async_scheduling=True, **KW))
    capture = llm.runner.graphs._capture
    monkeypatch.setattr(llm.runner.graphs, "_capture", lambda ids, batch, bucket, inputs: None if inputs else
                        capture(ids, batch, bucket, inputs))
    eager, in_graph = [], []
    forward, graph_forward = llm.runner.model.forward, llm.runner.graphs._forward

    def replayed(*args):
        in_graph.append(True)
        try:
            return graph_forward(*args)
        finally:
            in_graph.pop()

    monkeypatch.setattr(llm.runner.graphs, "_forward", replayed)
    monkeypatch.setattr(llm.runner.model, "forward", lambda ids, batch: (
        eager.append(batch.num_context_rows == 0 and not in_graph), forward(ids, batch))[1])
    llm.step_hook = llm.manager.check_integrity
    assert outputs(llm, prompts, params) == want
    g = llm.runner.graphs
    assert g.num_choices == 0 and g.num_replays > 0 and eager.count(False) > 0 and not any(eager)
