"""What the TP worker and PP stage failure tests share: a peer process that dies or hangs reaches the
caller as TensorParallelError within the group timeout, then every step is refused at once."""
from __future__ import annotations

import os
import signal
import time

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.parallel import TensorParallelError
from tests.models import helpers as nemotron

TIMEOUT_S = 5.0
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))[0]


def check_a_failed_peer_is_reported(llm: LLM, how: str, match: str) -> None:
    """Serve PROMPTS, then kill (how="killed") or stop (how="hung") `llm`'s one peer process: the next
    step raises TensorParallelError matching `match` within TIMEOUT_S + 5 s, the one after at once, the
    failed requests are aborted, and close() ends the peer."""
    (peer,) = llm.workers.processes
    try:
        assert len(llm.generate(PROMPTS, PARAMS)) == 2
        os.kill(peer.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match=match):
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < TIMEOUT_S + 5
        start = time.monotonic()
        with pytest.raises(TensorParallelError):  # at once, without touching the group again
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < 1
        assert llm.manager.requests() == []  # the failed requests were aborted
    finally:
        if how == "hung":
            os.kill(peer.pid, signal.SIGKILL)
        llm.close()
    assert peer.exitcode is not None
