"""A failure inside rank 0's own part of a step — its forward, or its store's execution of the plan — while the
peers (TP workers, PP stages, or both) are inside the same step's collectives: the caller gets TensorParallelError
(the original exception chained; a Ctrl-C as itself) at once, the peers' waits end at once (not after
`parallel_timeout_s`; under PP x TP rank 0's stage group goes too), the LLM refuses every later step (the failed
step touched every rank's state), and close() returns."""
from __future__ import annotations

import time

import pytest

from hybridcache import LLM
from hybridcache.parallel import TensorParallelError
from tests.parallel.failure import PARAMS, PROMPTS, checkpoint  # noqa: F401 (a fixture)

SLOW_TIMEOUT_S = 60.0  # the group timeout: far above what a prompt failure takes, so waiting for it shows


class Injected(RuntimeError):
    pass


def fail_once(owner: object, name: str, error: type[BaseException] = Injected) -> None:
    """Make `owner.name(...)` raise `error` on its next call only (an attribute on the instance)."""
    real = getattr(owner, name)

    def failing(*args, **kwargs):
        setattr(owner, name, real)
        raise error(f"injected failure in rank 0's {name}")

    setattr(owner, name, failing)


TP, PP = {"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}
CASES = [pytest.param(sizes, where, id=f"{name}-{where}") for name, sizes in (("tp", TP), ("pp", PP))
         for where in ("forward", "store")]
CASES += [pytest.param(TP, "interrupt", id="tp-interrupt"),
          pytest.param({**PP, **TP}, "forward", id="pp_x_tp-forward", marks=pytest.mark.slow)]


@pytest.mark.parametrize("sizes, where", CASES)
def test_a_failure_on_rank_0_mid_step_fails_the_group_at_once(checkpoint, sizes, where):
    llm = LLM(checkpoint, max_model_len=32, page_size=4, parallel_timeout_s=SLOW_TIMEOUT_S, **sizes)
    peers = llm.workers.processes
    try:
        assert len(llm.generate(PROMPTS, PARAMS)) == 2
        if where == "store":  # rank 0's store executes the plan after the peer received it
            fail_once(llm.manager.store.local, "execute")
        else:  # rank 0's last layer: the peers are in that layer's all-reduce (TP) or a recv (PP)
            fail_once(llm.model.trunk.layers[-1], "residual", KeyboardInterrupt if where == "interrupt" else Injected)
        if where == "interrupt":
            with pytest.raises(KeyboardInterrupt):
                llm.generate(PROMPTS, PARAMS)
        else:
            with pytest.raises(TensorParallelError, match="failed on rank 0") as raised:
                llm.generate(PROMPTS, PARAMS)
            assert isinstance(raised.value.__cause__, Injected)
        for peer in peers:
            peer.join(SLOW_TIMEOUT_S / 3)  # its wait ended with the group, not with the group timeout
        assert all(peer.exitcode is not None for peer in peers)
        start = time.monotonic()
        with pytest.raises(TensorParallelError):  # refused at once: the failed step touched every rank's state
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < 1
        assert llm.manager.requests() == []  # the failed requests were aborted
    finally:
        llm.close()
    assert all(peer.exitcode is not None for peer in peers)
