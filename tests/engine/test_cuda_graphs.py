"""CUDA-graph decode and verify steps (hybridcache/engine/graphs.py) give the eager steps' tokens, through
suspensions, resumes and rebalances; a replayed steady step waits for the device once. GPU only."""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.ops.tripwire import count_host_syncs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                reason="needs a CUDA device of compute capability 9.0 (bf16 grouped GEMM for MoE)")

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
GRAPHED = set(SAVERS)  # every family's decode / verify forward is capturable
SPECULATIVE = {"plain": None, "ngram": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3)}
PROMPTS = [[3 + (7 * i + j) % 11 for j in range(5 + 3 * i)] * 3 for i in range(6)]


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, path


def params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.9 * (i % 2), seed=i) for i in range(len(PROMPTS))]


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_graph_steps_give_the_eager_tokens(checkpoint, spec):
    family, path = checkpoint
    kw = dict(device="cuda", dtype="bfloat16", max_num_seqs=4, speculative=SPECULATIVE[spec], page_size=4,
              max_model_len=128)
    eager = LLM(path, enforce_eager=True, **kw).generate(PROMPTS, params())
    llm = LLM(path, **kw)
    graphed = llm.generate(PROMPTS, params())
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    graphs = llm.runner.graphs
    if family in GRAPHED:
        assert graphs.num_captured > 0 and graphs.num_replays > 0
    else:
        assert graphs.num_replays == 0


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_programmatic_dependent_launch_gives_the_same_tokens(checkpoint, spec, monkeypatch):
    """PDL on (`pdl_triton.ENABLED`, the default; HYBRIDCACHE_PDL=0 clears it: every Triton kernel launched with
    PDL, waiting at its entry) changes no token against plain launches, eager or captured in graphs, and the
    launches do take PDL."""
    from hybridcache.ops import pdl_triton
    _, path = checkpoint
    kw = dict(device="cuda", dtype="bfloat16", max_num_seqs=4, speculative=SPECULATIVE[spec], page_size=4,
              max_model_len=128)
    monkeypatch.setattr(pdl_triton, "ENABLED", False)
    plain = LLM(path, **kw).generate(PROMPTS, params())
    monkeypatch.setattr(pdl_triton, "ENABLED", True)
    assert pdl_triton.pdl_launch(torch.zeros(1, device="cuda")) == {"PDL": True, "launch_pdl": True}
    for eager in (True, False):
        llm = LLM(path, enforce_eager=eager, **kw)
        assert [o.token_ids for o in llm.generate(PROMPTS, params())] == [o.token_ids for o in plain]


def test_speculative_gives_the_plain_greedy_tokens_in_fp32(checkpoint):
    """n-gram speculation (verify steps of 4 tokens a row: the MoE families' experts on the sorted kernels,
    6 rows x 4 x k pairs) gives plain decode's greedy tokens (one-pair-a-program kernels, 6 x k pairs), in fp32
    on CUDA graphs, where the two paths' different kernels differ by ulps, not by a token."""
    _, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=6, page_size=4, max_model_len=128)
    greedy = [SamplingParams(max_tokens=24, ignore_eos=True) for _ in PROMPTS]
    plain = LLM(path, **kw).generate(PROMPTS, greedy)
    llm = LLM(path, speculative=SPECULATIVE["ngram"], **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == [o.token_ids for o in plain]
    assert llm.stats.num_accepted_tokens > 0 and llm.runner.graphs.num_replays > 0


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_padded_graph_steps_give_the_eager_tokens(checkpoint, spec):
    """Batches that shrink from 6 rows to 1 as requests finish replay graphs of 8, 4, 2 and 1 rows, the rest
    padding (fp32: a padded GEMM may round differently in bf16)."""
    family, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=6, speculative=SPECULATIVE[spec], page_size=4,
              max_model_len=128)
    ps = [SamplingParams(max_tokens=6 + 5 * i, ignore_eos=True, temperature=0.9 * (i % 2), seed=i) for i in range(6)]
    eager = LLM(path, enforce_eager=True, **kw).generate(PROMPTS, ps)
    llm = LLM(path, **kw)
    graphed = llm.generate(PROMPTS, ps)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    graphs = llm.runner.graphs
    assert graphs.num_padding_rows > 0
    assert {key[0] for key in graphs._graphs} <= {1, 2, 4, 8}


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_graphs_through_suspensions_and_rebalances(checkpoint, spec):
    """The same pressured schedule, eager and graphed, gives the same tokens (bf16 results depend on the batch
    a row runs in, so the reference is the eager run of the same schedule, not an unconstrained one)."""
    family, path = checkpoint
    kw = dict(device="cuda", dtype="bfloat16", speculative=SPECULATIVE[spec], page_size=4, max_model_len=128)
    per = LLM(path, enforce_eager=True, **kw).device_bytes_needed(max(map(len, PROMPTS)) + 24 + 4)

    def pressured(enforce_eager: bool) -> tuple[list[list[int]], LLM]:
        llm = LLM(path, max_num_seqs=4, device_cache_bytes=int(2.5 * per), host_cache_bytes=8 * per,
                  max_num_batched_tokens=32, enforce_eager=enforce_eager, **kw)
        llm.step_hook = llm.manager.check_integrity
        ids = [llm.add_request(p, s) for p, s in zip(PROMPTS, params())]
        outputs, steps = {}, 0
        while llm.has_unfinished():
            steps += 1
            if steps % 7 == 0:
                try:
                    llm.rebalance(3 + steps % 2)
                except ValueError:
                    pass
            for out in llm.step():
                outputs[out.request_id] = out.token_ids
        return [outputs[i] for i in ids], llm

    expected, _ = pressured(enforce_eager=True)
    got, llm = pressured(enforce_eager=False)
    assert got == expected
    assert llm.stats.num_suspensions > 0 and llm.stats.num_rebalances > 0, llm.stats
    if family in GRAPHED:
        assert llm.runner.graphs.num_replays > 0


def test_a_replayed_steady_step_syncs_once(checkpoint):
    family, path = checkpoint
    if family not in GRAPHED:
        pytest.skip("runs eagerly")
    llm = LLM(path, device="cuda", dtype="bfloat16", max_num_seqs=4, page_size=64, max_model_len=256)
    for p in PROMPTS[:4]:
        llm.add_request(p, SamplingParams(max_tokens=64, ignore_eos=True))
    for _ in range(4):
        llm.step()
    replays = llm.runner.graphs.num_replays
    for _ in range(5):
        with count_host_syncs(cuda=True) as syncs:
            llm.step()
        assert syncs.count <= 1, syncs
    assert llm.runner.graphs.num_replays == replays + 5
