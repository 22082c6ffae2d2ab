"""The three model families as tiny checkpoints: `SAVERS` and a module-scoped `checkpoint` fixture
parametrized over them (import it into a test module to use it)."""
from __future__ import annotations

import pytest

from hybridcache import SpeculativeConfig
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
SPEC = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    """The path of one family's tiny checkpoint, saved once per test module."""
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return path
