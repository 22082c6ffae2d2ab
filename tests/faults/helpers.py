"""What the fault tests share: tiny checkpoints of each family, one workload, faults that fire on the Nth call,
a Ctrl-C that lands at a chosen moment, and the checks every fault test ends with (integrity, no leaked ids,
the undisturbed run's tokens)."""
from __future__ import annotations

import _thread
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine.request import RequestOutput
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
FAMILIES = sorted(SAVERS)
SPEC = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)
PAGE_SIZE = 4
MAX_TOKENS = 10
# repeats, so that the n-gram drafter proposes and some drafts are accepted
PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3, 4],
    [9, 10, 11, 9, 10, 11, 9],
    [20, 21, 22, 23, 24, 25],
    [30, 31, 30, 31, 30, 31, 30, 31, 30, 31, 30],
    [5, 60, 5, 61, 5, 60],
]


class Injected(RuntimeError):
    """The fault a test injects (never raised by the library)."""


def greedy_and_sampled(n: int = len(PROMPTS)) -> list[SamplingParams]:
    """Greedy and seeded temperature sampling, alternating."""
    return [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.9 if i % 2 else 0.0, seed=i)
            for i in range(n)]


def sampled(n: int = len(PROMPTS)) -> list[SamplingParams]:
    """Seeded temperature sampling for every request."""
    return [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.9, seed=i) for i in range(n)]


class FailOnCall:
    """`fn` that raises `exc` on its `n`th call (1-based) and on the `times - 1` calls after it (`times` None:
    every call from the `n`th on); with `after` the failing call runs `fn` first, so whatever it writes is
    written. Every other call is `fn`'s."""

    def __init__(self, fn: Callable[..., Any], n: int, exc: type[BaseException] = Injected, after: bool = False,
                 times: int | None = 1) -> None:
        self.fn, self.n, self.exc, self.after, self.times = fn, n, exc, after, times
        self.calls = 0
        self.fired = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        fire = self.calls >= self.n and (self.times is None or self.calls < self.n + self.times)
        if not fire:
            return self.fn(*args, **kwargs)
        if self.after:
            self.fn(*args, **kwargs)
        self.fired += 1
        raise self.exc(f"injected fault on call {self.calls}")


class CtrlCOnCall:
    """`fn` that, on its `n`th call, runs and then sends this process a SIGINT, as Ctrl-C does: where SIGINT is
    held (the engine's bookkeeping) the KeyboardInterrupt comes when the hold ends, elsewhere at once."""

    def __init__(self, fn: Callable[..., Any], n: int) -> None:
        self.fn, self.n, self.calls = fn, n, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        out = self.fn(*args, **kwargs)
        if self.calls == self.n:
            signal.raise_signal(signal.SIGINT)
        return out


def build(path: Path, speculative: SpeculativeConfig | None, pressure: bool = False, max_num_seqs: int = 4,
          host_requests: float = 4.0, fixed_split: bool = True, **kw: Any) -> LLM:
    """An LLM over `path` with 4-token pages and 16-token context chunks (so steps mix context and generation
    rows). With `pressure`: a slot for each of `max_num_seqs` requests but pages for about 1.6 requests at full
    length, and a host tier for `host_requests`, so that requests are suspended, resumed and re-prefilled; with
    `fixed_split` the split never changes (no rebalance, so only suspends and resumes copy)."""
    base = dict(max_num_seqs=max_num_seqs, speculative=speculative, page_size=PAGE_SIZE, max_num_batched_tokens=16,
                max_model_len=64)
    if not pressure:
        return LLM(path, **base, **kw)
    probe = LLM(path, max_num_seqs=1, speculative=speculative, device_cache_bytes=1 << 20, page_size=PAGE_SIZE)
    longest = max(map(len, PROMPTS)) + MAX_TOKENS + (speculative.num_draft_tokens + 1 if speculative else 1)
    slot, per = probe.sizing.bytes_per_slot, probe.device_bytes_needed(longest)
    device = max_num_seqs * slot + int((per - slot) * 1.6)
    return LLM(path, **base, device_cache_bytes=device, host_cache_bytes=int(per * host_requests),
               num_slots=max_num_seqs if fixed_split else None, **kw)


def assert_clean(llm: LLM) -> None:
    """Integrity holds and nothing is held: no request is known, no id of either tier is owned."""
    mgr = llm.manager
    mgr.check_integrity()
    assert not mgr.has_pending_step
    assert mgr.requests() == [] and not llm.has_unfinished()
    p = mgr.planner
    owned = [p.slot_pool.num_owned, p.page_pool.num_owned, p.host_slot_pool.num_owned, p.host_page_pool.num_owned]
    assert owned == [0, 0, 0, 0], f"owned device slots, pages, host slots, pages: {owned}"


def assert_queued_once(llm: LLM, unfinished: list[int]) -> None:
    """Each unfinished request is in exactly one of the scheduler's queues, and the cache knows it."""
    s = llm.scheduler
    queued = [r.req_id for r in s.waiting + s.running + s.suspended]
    assert sorted(queued) == sorted(unfinished)
    assert sorted(llm.manager.requests()) == sorted(unfinished)


def add_all(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[int]:
    return [llm.add_request(p, sp) for p, sp in zip(prompts, params)]


def step_until_raises(llm: LLM, outputs: dict[int, list[int]], exc: type[BaseException] = Injected,
                      max_steps: int = 500) -> None:
    """Step, collecting finished outputs, until a step raises `exc` (which must happen before the run ends);
    `check_integrity()` after every step."""
    for _ in range(max_steps):
        assert llm.has_unfinished(), "the run ended before the fault fired"
        try:
            finished = llm.step()
        except exc:
            return
        llm.manager.check_integrity()
        for out in finished:
            outputs[out.request_id] = out.token_ids
    raise AssertionError("no step raised")


def step_to_end(llm: LLM, outputs: dict[int, list[int]], max_steps: int = 500) -> None:
    """Step until every request finished, with `check_integrity()` after every step."""
    for _ in range(max_steps):
        if not llm.has_unfinished():
            return
        for out in llm.step():
            outputs[out.request_id] = out.token_ids
        llm.manager.check_integrity()
    raise AssertionError(f"still unfinished after {max_steps} steps")


def tokens(outs: list[RequestOutput]) -> list[list[int]]:
    return [o.token_ids for o in outs]


def interrupt_during(call: Callable[[], Any], delay: float) -> tuple[Any, bool]:
    """Run `call()` with a Ctrl-C (`_thread.interrupt_main`) arriving `delay` seconds after it starts, perhaps
    after it returned. Returns (its result, or None; whether the interrupt reached `call`). A late interrupt is
    waited for and swallowed here, so it never lands in the caller."""
    timer = threading.Timer(delay, _thread.interrupt_main)
    result, hit = None, False
    try:
        try:
            timer.start()
            result = call()
        except KeyboardInterrupt:
            hit = True
        finally:
            timer.join()  # a late interrupt is pending or delivered by now; the handler runs at a bytecode boundary
            time.sleep(0.01)
    except KeyboardInterrupt:
        pass
    return result, hit
