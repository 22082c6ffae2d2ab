"""The whole engine through the Triton kernels' glue without a GPU: each family's tiny model generates with
every op dispatched to its Triton kernel (run by Triton's interpreter, `kernels_on_cpu`) and gives the
tokens of the torch paths, plain and with n-gram speculation (replay verify, accept), with the state moved
What this checks that the kernels' own tests cannot: the mixers' views and strides
into the kernels, the fused gate and norms, the accept rule between steps. Prefill keeps the torch paths
(fla runs on CUDA only). fp32, greedy; the kernels sum in another order than torch, so a token could in
principle flip on a near-tie: the tiny models' LM heads are widened (tests/models helpers) to keep margins.
"""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.models.layers import experts
from hybridcache.ops import linear
from hybridcache.ops.mamba2 import triton_verify as mamba2_verify
from hybridcache.ops.triton_support import HAS_TRITON, interpreting, kernels_on_cpu
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

pytestmark = pytest.mark.skipif(not (HAS_TRITON and interpreting()) or torch.cuda.is_available(),
                                reason="needs triton in its CPU interpreter (TRITON_INTERPRET=1, no GPU)")

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny,
          # a shared expert twice a routed one's width (as the 1B's 4x): it runs inside the experts' kernels
          "qwen3_next-wide-shared": lambda path: qwen.save_tiny(path, shared_expert_intermediate_size=32)}
PROMPTS = [[3 + (7 * i + j) % 11 for j in range(5 + 3 * i)] for i in range(3)]
# kernels every family's steps must have launched (their Python names), beside the family's own
COMMON = {"_update_kernel", "_prefill_kernel", "_rms_norm_kernel"}  # conv1d update and prefill, the norms
# (the delta rules' prefill reads and writes its slots' states in one launch each: `_read_kernel`, `_write_kernel`)
FAMILY = {"nemotron_h": {"_decode_kernel", "_attend_kernel", "_relu2_kernel"},
          "qwen3_next": {"_delta_rule_decode_kernel", "_attend_kernel", "_read_kernel", "_write_kernel",
                         "_silu_mul_kernel", "_sigmoid_gated_add_kernel",  # the shared expert's glue
                         "_sigmoid_mul_kernel"},  # the attention output's gate
          "kimi_linear": {"_delta_rule_decode_kernel", "_read_kernel", "_write_kernel",
                          "_silu_mul_kernel"}}  # layer 0's dense gated MLP
SHARED_GLUE = {"_silu_mul_kernel", "_sigmoid_gated_add_kernel"}  # qwen3_next's shared expert run on its own
# ops/moe: the router's selection and the experts (nemotron_h's 'E' layer: non-gated relu2 Experts behind a TopKRouter)
MOE = {"nemotron_h": {"_group_topk_kernel", "_up_kernel", "_down_kernel"},
       "qwen3_next": {"_softmax_topk_kernel", "_up_kernel", "_down_kernel"},
       "kimi_linear": {"_group_topk_kernel", "_up_kernel", "_down_kernel"}}
# nemotron_h's verify: the one-head kernel on one row, the heads form (ops/mamba2/triton_verify_heads.py) on two,
# with the heads form's least rows (HEADS_FROM) set to 2 here
VERIFY = {"nemotron_h": {"_verify_kernel", "_heads_kernel", "_fold_kernel", "_accept_kernel"},
          "qwen3_next": {"_gdn_verify_kernel", "_accept_kernel"}, "kimi_linear": {"_kda_verify_kernel"}}
# attention glue (ops/attention): the K/V or latent page write, plain and verify steps alike
ATTENTION = {"nemotron_h": {"_write_pair_kernel", "_attend_kernel"},
             "qwen3_next": {"_norm_rope_kernel", "_write_pair_kernel", "_attend_kernel"},
             "kimi_linear": {"_write_pair_kernel", "_mla_kernel"}}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, path


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


def run(path, mode: str, kernels: bool) -> list[list[int]]:
    """mode: "plain", "ngram" (synchronous verify) or "async-ngram" (asynchronous verify, drafted on the device)."""
    llm = LLM(path, device="cpu", dtype="float32", max_num_seqs=2, page_size=4, max_model_len=64,
              speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3) if mode != "plain" else None,
              async_scheduling=mode == "async-ngram")
    params = [SamplingParams(max_tokens=7, ignore_eos=True) for _ in PROMPTS]
    if kernels:
        with kernels_on_cpu():
            outs = llm.generate(PROMPTS, params)
    else:
        outs = llm.generate(PROMPTS, params)
    llm.manager.check_integrity()
    return [o.token_ids for o in outs]


# the longest cases (about a minute each on a 2-core CI machine, timed at 10 tokens a prompt), in the slow suite:
# the wide shared expert's speculative steps (its plain steps stay; qwen3_next's speculative steps run with the
# narrow one); and the synchronous verify of qwen3_next and kimi_linear (46 and 32 s on 2 workers at 10 tokens):
# their verify kernels run in the asynchronous cases, and nemotron_h's synchronous case stays
SLOW_CASES = ("[qwen3_next-wide-shared-ngram]", "[qwen3_next-wide-shared-async-ngram]", "[qwen3_next-ngram]",
              "[kimi_linear-ngram]")


@pytest.mark.parametrize("mode", ["plain", "ngram", "async-ngram"])
def test_kernels_give_the_torch_paths_tokens(checkpoint, mode, launched, monkeypatch):
    family, path = checkpoint
    # the wide shared expert folded at every token count (by default it folds in the one-pair kernels and from
    # FOLD_SORTED_FROM tokens: tests/ops/test_moe_triton.py), so the sorted kernels run it too
    monkeypatch.setattr(experts, "FOLD_SORTED_FROM", 0)
    monkeypatch.setattr(mamba2_verify, "HEADS_FROM", 2)
    monkeypatch.setattr(linear, "BATCHED_GEMV", True)  # MLA's absorbed products at one row, off by default
    torch_paths = run(path, mode, kernels=False)
    assert not launched
    assert run(path, mode, kernels=True) == torch_paths
    family, folded = family.split("-")[0], family.endswith("wide-shared")
    steps = FAMILY[family] if mode == "plain" else VERIFY[family]
    if folded:  # the shared expert's own GEMMs and glue never run: it is two more pairs a token
        steps = steps - SHARED_GLUE
        assert not launched & SHARED_GLUE, f"launched: {sorted(launched & SHARED_GLUE)}"
    if mode == "async-ngram":  # the drafter's device search and the history append (ops/ngram_triton.py)
        steps = steps | {"_ngram_kernel", "_append_kernel"}
    expected = COMMON | steps | MOE[family] | ATTENTION[family]
    assert expected <= launched, f"not launched: {sorted(expected - launched)}"
