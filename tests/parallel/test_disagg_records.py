"""The hand-over itself, in one process: a request taken from a prefill LLM (`take_prefilled`) and added to
another (`add_prefilled`) is SUSPENDED there and resumes with its live state bit for bit, whatever the
receiving slot's previous owner wrote; bad records or a full host tier raise and change nothing."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.cache import HostTierFullError, LayoutError, Status
from tests.models import helpers as nemotron

KW = {"max_model_len": 64, "page_size": 4, "speculative": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)}
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))[0]


def test_a_handed_over_request_resumes_bit_for_bit(path):
    a, b = LLM(path, **KW), LLM(path, **KW)
    b.generate([[3, 4, 5, 6, 7, 8]], PARAMS)  # the slot and pages it lands in held another request's bytes
    rid = a.add_request(PROMPT, PARAMS)
    assert a.take_prefilled(rid) is None  # not prefilled yet
    a.step()
    want = a.manager.live_state(rid)
    handed = a.take_prefilled(rid)
    assert a.manager.requests() == [] and a.take_prefilled(rid) is None
    a.manager.check_integrity()
    got_id = b.add_prefilled(handed)
    assert b.manager.status(got_id) == Status.SUSPENDED
    b.manager.check_integrity()
    b.manager.resume([got_id])
    got = b.manager.live_state(got_id)
    assert sorted(got) == sorted(want)
    for role in want:
        assert torch.equal(got[role], want[role]), role


def test_bad_records_or_a_full_host_tier_change_nothing(path):
    a = LLM(path, **KW)
    rid = a.add_request(PROMPT, PARAMS)
    a.step()
    handed = a.take_prefilled(rid)
    b = LLM(path, **KW)
    with pytest.raises(LayoutError, match="do not fit"):
        b.add_prefilled(dataclasses.replace(handed, page_records=handed.page_records[:-1]))
    assert b.manager.requests() == [] and not b.has_unfinished()
    b.manager.check_integrity()
    full = LLM(path, host_cache_bytes=1, **KW)
    with pytest.raises(HostTierFullError):
        full.add_prefilled(handed)
    assert full.manager.requests() == [] and not full.has_unfinished()
    full.manager.check_integrity()
    assert b.generate([PROMPT], PARAMS)[0].token_ids == LLM(path, **KW).generate([PROMPT], PARAMS)[0].token_ids
