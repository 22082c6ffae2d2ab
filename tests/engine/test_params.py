"""SamplingParams and SpeculativeConfig refuse bad fields at construction; every value they accept samples."""
import itertools
import math

import numpy as np
import pytest
import torch

from hybridcache.engine.params import InvalidParamsError, SamplingParams, SpeculativeConfig
from hybridcache.engine.sampler import choose

NAN, INF = math.nan, math.inf

# (field, bad value, a fragment the message must hold)
BAD_SAMPLING = [
    ("temperature", NAN, "temperature must be finite, got nan"),
    ("temperature", INF, "temperature must be finite, got inf"),
    ("temperature", -INF, "temperature must be finite, got -inf"),
    ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
    ("temperature", -1, "temperature must be >= 0, got -1.0"),
    ("temperature", 1e-3, "got 0.001; use 0 for greedy"),
    ("temperature", 0.00999, "got 0.00999; use 0 for greedy"),
    ("temperature", 5e-324, "got 5e-324; use 0 for greedy"),
    ("temperature", True, "temperature must be a number, got True (bool)"),
    ("temperature", False, "temperature must be a number, got False (bool)"),
    ("temperature", "0.7", "temperature must be a number, got '0.7' (str)"),
    ("temperature", None, "temperature must be a number, got None (NoneType)"),
    ("top_k", -1, "top_k must be >= 1, or 0 to disable, got -1"),
    ("top_k", -7, "top_k must be >= 1, or 0 to disable, got -7"),
    ("top_k", 2.5, "top_k must be an int, got 2.5 (float)"),
    ("top_k", 2.0, "top_k must be an int, got 2.0 (float)"),
    ("top_k", True, "top_k must be an int, got True (bool)"),
    ("top_k", "5", "top_k must be an int, got '5' (str)"),
    ("top_k", None, "top_k must be an int, got None (NoneType)"),
    ("top_p", 0, "top_p must be in (0, 1], got 0.0"),
    ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
    ("top_p", -0.1, "top_p must be in (0, 1], got -0.1"),
    ("top_p", 1.0000001, "top_p must be in (0, 1], got 1.0000001"),
    ("top_p", 2, "top_p must be in (0, 1], got 2.0"),
    ("top_p", NAN, "top_p must be finite, got nan"),
    ("top_p", INF, "top_p must be finite, got inf"),
    ("top_p", True, "top_p must be a number, got True (bool)"),
    ("top_p", "0.9", "top_p must be a number, got '0.9' (str)"),
    ("max_tokens", 0, "max_tokens must be >= 1, got 0"),
    ("max_tokens", -3, "max_tokens must be >= 1, got -3"),
    ("max_tokens", 2.5, "max_tokens must be an int, got 2.5 (float)"),
    ("max_tokens", 16.0, "max_tokens must be an int, got 16.0 (float)"),
    ("max_tokens", True, "max_tokens must be an int, got True (bool)"),
    ("max_tokens", "16", "max_tokens must be an int, got '16' (str)"),
    ("max_tokens", None, "max_tokens must be an int, got None (NoneType)"),
    ("seed", True, "seed must be an int, got True (bool)"),
    ("seed", "7", "seed must be an int, got '7' (str)"),
    ("seed", 7.0, "seed must be an int, got 7.0 (float)"),
    ("seed", 1.5, "seed must be an int, got 1.5 (float)"),
    ("seed", -1, "seed must be None or an int in [0, 2**64), got -1"),
    ("seed", 2**64, f"seed must be None or an int in [0, 2**64), got {2**64}"),
    ("stop_token_ids", (True,), "stop_token_ids entry must be an int, got True (bool)"),
    ("stop_token_ids", (1, 2.0), "stop_token_ids entry must be an int, got 2.0 (float)"),
    ("stop_token_ids", ["3"], "stop_token_ids entry must be an int, got '3' (str)"),
    ("stop_token_ids", (4, None), "stop_token_ids entry must be an int, got None (NoneType)"),
    ("stop_token_ids", (5, -1), "stop_token_ids must be >= 0, got -1 in (5, -1)"),
    ("stop_token_ids", 5, "stop_token_ids must be a sequence of ints, got 5 (int)"),
    ("stop_token_ids", "12", "stop_token_ids must be a sequence of ints, got '12' (str)"),
    ("stop_token_ids", None, "stop_token_ids must be a sequence of ints, got None (NoneType)"),
    ("ignore_eos", "no", "ignore_eos must be a bool, got 'no' (str)"),
    ("ignore_eos", 1, "ignore_eos must be a bool, got 1 (int)"),
    ("ignore_eos", None, "ignore_eos must be a bool, got None (NoneType)"),
]

BAD_SPECULATIVE = [
    ("method", "eagle", "unknown speculative method 'eagle'; supported: 'ngram'"),
    ("method", None, "unknown speculative method None"),
    ("num_draft_tokens", 0, "num_draft_tokens must be >= 1, got 0"),
    ("num_draft_tokens", -2, "num_draft_tokens must be >= 1, got -2"),
    ("num_draft_tokens", 2.5, "num_draft_tokens must be an int, got 2.5 (float)"),
    ("num_draft_tokens", 3.0, "num_draft_tokens must be an int, got 3.0 (float)"),
    ("num_draft_tokens", True, "num_draft_tokens must be an int, got True (bool)"),
    ("max_ngram", 0, "need 1 <= min_ngram <= max_ngram, got min_ngram=1, max_ngram=0"),
    ("max_ngram", 1.5, "max_ngram must be an int, got 1.5 (float)"),
    ("max_ngram", True, "max_ngram must be an int, got True (bool)"),
    ("min_ngram", 0, "need 1 <= min_ngram <= max_ngram, got min_ngram=0, max_ngram=4"),
    ("min_ngram", 5, "need 1 <= min_ngram <= max_ngram, got min_ngram=5, max_ngram=4"),
    ("min_ngram", True, "min_ngram must be an int, got True (bool)"),
    ("min_ngram", "1", "min_ngram must be an int, got '1' (str)"),
]


def _ids(cases):
    return [f"{name}={value!r}" for name, value, _ in cases]


def _refuses(cls, name, value, fragment):
    with pytest.raises(InvalidParamsError) as info:
        cls(**{name: value})
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "value", "fragment"), BAD_SAMPLING, ids=_ids(BAD_SAMPLING))
def test_sampling_params_refuse_a_bad_field(name, value, fragment):
    _refuses(SamplingParams, name, value, fragment)


@pytest.mark.parametrize(("name", "value", "fragment"), BAD_SPECULATIVE, ids=_ids(BAD_SPECULATIVE))
def test_speculative_config_refuses_a_bad_field(name, value, fragment):
    _refuses(SpeculativeConfig, name, value, fragment)


def test_the_error_is_a_value_error_and_the_engine_exports_it():
    from hybridcache.engine import errors

    assert issubclass(InvalidParamsError, ValueError)
    assert errors.InvalidParamsError is InvalidParamsError
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_accepted_fields_are_normalised_to_plain_python_types():
    p = SamplingParams(max_tokens=np.int64(3), temperature=1, top_p=np.float32(0.5), top_k=np.int32(2),
                       seed=np.uint64(2**64 - 1), stop_token_ids=[np.int64(7), 0])
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop_token_ids) == (3, 1.0, 0.5, 2, 2**64 - 1, (7, 0))
    assert [type(v) for v in (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, *p.stop_token_ids)] == [
        int, float, float, int, int, int, int]
    assert SamplingParams(stop_token_ids=range(3)).stop_token_ids == (0, 1, 2)
    assert SamplingParams(stop_token_ids={4}).stop_token_ids == (4,)
    s = SpeculativeConfig(num_draft_tokens=np.int64(2), max_ngram=np.int8(3), min_ngram=np.int16(2))
    assert (s.num_draft_tokens, s.max_ngram, s.min_ngram) == (2, 3, 2)
    assert {type(v) for v in (s.num_draft_tokens, s.max_ngram, s.min_ngram)} == {int}


@pytest.mark.parametrize("seed", [None, 0, 1, 2**63, 2**64 - 1])
@pytest.mark.parametrize("max_tokens", [1, 2**40])
def test_edge_seeds_and_lengths_pass_and_seed_a_generator(seed, max_tokens):
    p = SamplingParams(max_tokens=max_tokens, seed=seed, temperature=0.5)
    assert (p.max_tokens, p.seed) == (max_tokens, seed)
    if seed is not None:  # the engine seeds each request's generator with it
        torch.Generator().manual_seed(p.seed)


V = 7
TEMPERATURES = [0, 0.0, -0.0, 1e-2, 0.5, 1, 1e6]
TOP_KS = [0, 1, 2, V, V + 1, 10**9]
TOP_PS = [1e-300, 1e-9, 0.5, 1, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 1e3], ids=["unit", "large"])
def test_every_accepted_edge_value_samples(dtype, scale):
    """Validation is the whole guard: anything it lets through must not make `choose` raise."""
    gen = torch.Generator().manual_seed(0)
    for t, k, p in itertools.product(TEMPERATURES, TOP_KS, TOP_PS):
        params = SamplingParams(temperature=t, top_k=k, top_p=p)
        assert params.greedy == (t == 0)
        for num_drafts in range(4):
            logits = (torch.randn(num_drafts + 1, V, generator=gen) * scale).to(dtype)
            argmax = logits.float().argmax(-1).tolist()
            for drafts in (argmax[:num_drafts], torch.randint(V, (num_drafts,), generator=gen).tolist()):
                out = choose(logits, drafts, params, gen)
                assert 1 <= len(out) <= num_drafts + 1, (t, k, p, out)
                assert all(0 <= tok < V for tok in out), (t, k, p, out)


def test_a_top_p_below_fp32_keeps_the_likeliest_token():
    """fp32 rounds 1e-300 to 0, so a plain `mass ahead >= top_p` cut would drop every token."""
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0, top_p=1e-300)
    assert choose(logits, [0], params, torch.Generator().manual_seed(0)) == [1]
    assert choose(logits, [1], params, torch.Generator().manual_seed(0)) == [1, 0]
