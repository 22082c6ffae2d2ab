"""Asynchronous verify on the GPU (fp32, CUDA graphs): drafts proposed on the device, lengths chained there,
greedy and seeded sampled rows — the tokens equal the synchronous speculative engine's, for the three
families. GPU only."""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine import async_verify
from tests.engine.test_async_verify import wrong_on_device
from tests.engine.test_cuda_graphs import PROMPTS, checkpoint  # noqa: F401 (checkpoint is a fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                reason="needs a CUDA device of compute capability 9.0 (bf16 grouped GEMM for MoE)")


def test_async_verify_on_cuda_gives_the_synchronous_tokens(checkpoint, monkeypatch):
    _, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3),
              page_size=4, max_model_len=128)
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.9 * (i % 2), seed=i) for i in range(len(PROMPTS))]
    want = [o.token_ids for o in LLM(path, async_scheduling=False, **kw).generate(PROMPTS, params)]
    launches = [0]
    launch = async_verify.AsyncVerify.launch

    def counted(verify, step):
        launches[0] += 1
        return launch(verify, step)

    monkeypatch.setattr(async_verify.AsyncVerify, "launch", counted)
    llm = LLM(path, async_scheduling=True, **kw)
    llm.step_hook = llm.manager.check_integrity
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want
    assert launches[0] > 0 and llm.runner.graphs.num_replays > 0
    assert "sampled" in {key[-1] for key in llm.runner.graphs._graphs}  # greedy and sampled rows chose in a graph
    assert llm.manager.planner.unsettled == [] and llm.manager.requests() == []


def test_greedy_verify_steps_choose_inside_the_graph(checkpoint):
    """Every row greedy: the verify steps' graphs choose the tokens and run the accept hooks (argmax, draft
    check, counts, PNAT / pending drafts / conv window) on their static outputs; the tokens equal the
    synchronous engine's, which chooses and accepts eagerly, and every step leaves the cache intact."""
    _, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4, page_size=4, max_model_len=128,
              speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3))
    params = [SamplingParams(max_tokens=24, ignore_eos=True) for _ in PROMPTS]
    want = [o.token_ids for o in LLM(path, async_scheduling=False, **kw).generate(PROMPTS, params)]
    llm = LLM(path, async_scheduling=True, **kw)
    llm.step_hook = llm.manager.check_integrity
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want
    assert llm.runner.graphs.num_choices > 0 and llm.stats.num_accepted_tokens > 0
    assert llm.manager.planner.unsettled == [] and llm.manager.requests() == []


def test_long_back_offs_leave_the_chain_for_plain_graph_steps_on_cuda(checkpoint, monkeypatch):
    """Drafts that always miss, back-off up to 16 steps: chains of one-token verify steps, chains left for
    plain decode graphs of the speculative forward (`AsyncVerify.idles`) and rejoined; the tokens equal the
    plain engine's (fp32 greedy), and every step leaves the cache intact."""
    _, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4, page_size=4, max_model_len=128)
    params = [SamplingParams(max_tokens=48, ignore_eos=True) for _ in PROMPTS]
    want = [o.token_ids for o in LLM(path, **kw).generate(PROMPTS, params)]
    llm = LLM(path, async_scheduling=True, speculative=SpeculativeConfig(num_draft_tokens=3, backoff_max_steps=16),
              **kw)
    wrong_on_device(llm, monkeypatch)
    left, idles = [], async_verify.AsyncVerify.idles
    monkeypatch.setattr(async_verify.AsyncVerify, "idles",
                        lambda verify, rows: (left.append(idles(verify, rows)), left[-1])[1])
    llm.step_hook = llm.manager.check_integrity
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want
    assert left.count(True) > 0 and llm.runner.graphs.num_replays > 0, left
    assert llm.manager.planner.unsettled == [] and llm.manager.requests() == []
