"""One host sync per steady decode step (issue 9): once prefill is done and every request decodes, a step of
`LLM.step()` — plain or speculative, every family — waits for the device at most once, for the sampled
tokens' copy-back in `step_tokens.choose_tokens`. Counted with the CPU tripwire (tests/ops/tripwire.py), which sees the
Python-level calls that synchronise on a GPU; on CUDA, CUDA's sync-debug mode counts the rest as well."""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.ops.tripwire import HostSyncs, count_host_syncs

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
SPECULATIVE = {"plain": None, "ngram": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3), "async": None}
NUM_REQUESTS = 4


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return path


def steady_steps(llm: LLM, num_steps: int) -> list[HostSyncs]:
    """Prefill NUM_REQUESTS requests, step until all of them decode, then count each of `num_steps` steps."""
    for i in range(NUM_REQUESTS):  # repetitive prompts: the n-gram drafter proposes, and some drafts pass
        prompt = [3 + (7 * i + j) % 11 for j in range(5 + 3 * i)] * 3
        llm.add_request(prompt, SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.9 * (i % 2), seed=i))
    for _ in range(3):
        llm.step()
    counts = []
    for _ in range(num_steps):
        generated = llm.stats.num_generated_tokens
        with count_host_syncs(cuda=llm.device.type == "cuda") as syncs:
            finished = llm.step()
        assert not finished
        assert llm.stats.num_generated_tokens - generated >= NUM_REQUESTS, "not every request decoded"
        llm.manager.check_integrity()
        counts.append(syncs)
    return counts


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_steady_decode_step_makes_at_most_one_host_sync(checkpoint, spec: str, device: str) -> None:
    # CUDA runs bf16: its MoE is one grouped GEMM (compute capability 9.0 and above); the per-expert fallback
    # (fp32 on CUDA) reads each MoE layer's run lengths back
    if device == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the grouped GEMM of the MoE layers needs compute capability 9.0")
    dtype = "bfloat16" if device == "cuda" else "float32"
    # eager steps: a graph capture synchronises once per new shape (test_cuda_graphs counts replayed steps)
    llm = LLM(checkpoint, device=device, dtype=dtype, max_num_seqs=NUM_REQUESTS, speculative=SPECULATIVE[spec],
              max_model_len=128, page_size=4, enforce_eager=True, async_scheduling=spec == "async")
    for syncs in steady_steps(llm, 6):
        assert syncs.count <= 1, syncs
        assert all(site.rsplit(":", 1)[0].endswith("hybridcache/engine/step_tokens.py") for _, site in syncs.calls), syncs
    if spec == "ngram" and device == "cpu":
        assert llm.stats.num_accepted_tokens > 0  # the verify steps took the accept paths too
