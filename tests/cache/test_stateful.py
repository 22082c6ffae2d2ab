"""Random lifecycles against a shadow copy: after every rule the pools are consistent and every live or
suspended request's state equals what the test itself wrote, transformed by the documented bookkeeping."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hybridcache.cache import (
    BudgetTooSmallError,
    HostTierFullError,
    OutOfDeviceMemoryError,
    Status,
)

from .factory import KINDS, make_manager


def _rand_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, generator=gen).to(t.dtype)
    return torch.randint(0, 1 << 20, t.shape, generator=gen).to(t.dtype)


class Lifecycle(RuleBasedStateMachine):
    kind = "mamba2"

    def __init__(self) -> None:
        super().__init__()
        self.mgr = make_manager(self.kind, num_slots=4, num_pages=24, host_requests=3)
        self.module = self.mgr.states[0]
        self.gen = torch.Generator().manual_seed(0)
        self.shadow: dict[str, dict[str, torch.Tensor]] = {}
        self.counter = 0
        self.mgr.add_dummy("pad")

    # -- helpers -----------------------------------------------------------------------------------
    def ids(self, *statuses: Status) -> list[str]:
        return sorted(r for r in self.mgr.requests() if r != "pad" and self.mgr.status(r) in statuses)

    def write_full(self, req: str, bookkeeping: bool) -> dict[str, torch.Tensor]:
        """Write random bytes into the whole slot (both halves) and all held pages; return what was written
        as `{role: [layers, *shape]}` and `{page role: [layers, pages, ...]}`."""
        e = self.mgr.entry(req)
        written = {}
        for name, t in self.mgr.state_tensors(self.module).items():
            full = f"{self.module.name}.{name}"
            if name == "pnat":
                val = torch.randint(0, self.module.hist + 1, (1,), generator=self.gen).to(t.dtype)
            elif name == "buf_idx":
                val = torch.randint(0, 2, (1,), generator=self.gen).to(t.dtype)
            elif name == "pend_n":
                val = torch.randint(0, self.module.num_draft_tokens + 1, (1,), generator=self.gen).to(t.dtype)
            else:
                val = _rand_like(t[:, e.slot], self.gen)
            if name in ("pnat", "buf_idx", "pend_n") and not bookkeeping:
                val = torch.zeros_like(val)  # prefill never touches the bookkeeping
            t[:, e.slot] = val
            written[full] = val.clone()
        for name, t in self.mgr.page_tensors().items():
            idx = torch.tensor(e.pages, dtype=torch.long)
            val = _rand_like(t[:, idx], self.gen)
            t[:, idx] = val
            written[name] = val.clone()
        return written

    def live_of(self, written: dict[str, torch.Tensor], num_tokens: int) -> dict[str, torch.Tensor]:
        """The live view of a full write, as `live_state` returns it."""
        out = {}
        for r in self.mgr.slot_roles:
            val = written[r.name]
            if r.buffered_by:
                half = int(written[r.buffered_by][0])
                val = val.select(1 + r.buffer_dim, half)
            out[r.name] = val.clone()
        npages = -(-num_tokens // self.mgr.page_size)
        for r in self.mgr.page_roles:
            out[r.name] = written[r.name][:, :npages].clone()
        return out

    def after_accept(self, written: dict[str, torch.Tensor], tokens: int, valid: int) -> dict[str, torch.Tensor]:
        """What the state module's accept hook must leave, computed independently."""
        w = {k: v.clone() for k, v in written.items()}
        m, name = self.module, self.module.name
        if m.num_draft_tokens:
            if f"{name}.pnat" in w:
                p = int(w[f"{name}.pnat"][0])
                fold = p + tokens > m.hist
                w[f"{name}.pnat"][0] = valid if fold else p + valid
                if fold:
                    w[f"{name}.buf_idx"][0] = 1 - int(w[f"{name}.buf_idx"][0])
            if f"{name}.pend_n" in w:
                w[f"{name}.pend_n"][0] = valid - 1
            width = m.conv_kernel - 1
            conv = w[f"{name}.conv"]
            conv[..., :width] = written[f"{name}.conv"][..., valid - 1 : valid - 1 + width]
        return w

    # -- rules -------------------------------------------------------------------------------------
    @rule()
    def add(self) -> None:
        self.counter += 1
        self.mgr.add_request(f"r{self.counter}")

    @precondition(lambda self: self.ids(Status.WAITING, Status.CONTEXT))
    @rule(data=st.data(), chunk=st.integers(1, 7), finish=st.booleans())
    def context_step(self, data, chunk: int, finish: bool) -> None:
        req = data.draw(st.sampled_from(self.ids(Status.WAITING, Status.CONTEXT)))
        fresh = self.mgr.status(req) == Status.WAITING
        try:
            self.mgr.prepare_step([req], [chunk])
        except OutOfDeviceMemoryError:
            return
        if fresh:
            state = self.mgr.live_state(req)
            assert all(not t.any() for k, t in state.items() if k.startswith(self.module.name))
        written = self.write_full(req, bookkeeping=False)
        self.mgr.accept()
        self.shadow[req] = self.live_of(written, self.mgr.entry(req).num_tokens)
        if finish:
            self.mgr.start_generation(req)

    @precondition(lambda self: self.ids(Status.GENERATION))
    @rule(data=st.data(), with_dummy=st.booleans())
    def verify_step(self, data, with_dummy: bool) -> None:
        gen_ids = self.ids(Status.GENERATION)
        rows = data.draw(st.lists(st.sampled_from(gen_ids), min_size=1, max_size=len(gen_ids), unique=True))
        tokens = self.module.num_draft_tokens + 1
        try:
            self.mgr.prepare_step(rows + (["pad"] if with_dummy else []), tokens)
        except OutOfDeviceMemoryError:
            return
        written = {r: self.write_full(r, bookkeeping=True) for r in rows}
        if with_dummy:  # a padding row scribbles over its own permanent slot only
            for t in self.mgr.state_tensors(self.module).values():
                t[:, self.mgr.entry("pad").slot] = 1
        valid = [data.draw(st.integers(1, tokens)) for _ in rows]
        self.mgr.accept(valid + ([1] if with_dummy else []))
        for r, v in zip(rows, valid):
            self.shadow[r] = self.live_of(self.after_accept(written[r], tokens, v), self.mgr.entry(r).num_tokens)

    @precondition(lambda self: self.ids(Status.GENERATION))
    @rule(data=st.data())
    def suspend(self, data) -> None:
        gen_ids = self.ids(Status.GENERATION)
        rows = data.draw(st.lists(st.sampled_from(gen_ids), min_size=1, max_size=len(gen_ids), unique=True))
        try:
            self.mgr.suspend(rows)
        except HostTierFullError:
            assert all(self.mgr.status(r) == Status.GENERATION for r in rows)

    @precondition(lambda self: self.ids(Status.SUSPENDED))
    @rule(data=st.data())
    def resume(self, data) -> None:
        ids = self.ids(Status.SUSPENDED)
        rows = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True))
        try:
            self.mgr.resume(rows)
        except OutOfDeviceMemoryError:
            assert all(self.mgr.status(r) == Status.SUSPENDED for r in rows)

    @precondition(lambda self: self.ids(Status.CONTEXT, Status.GENERATION, Status.SUSPENDED))
    @rule(data=st.data())
    def reprefill(self, data) -> None:
        req = data.draw(st.sampled_from(self.ids(Status.CONTEXT, Status.GENERATION, Status.SUSPENDED)))
        self.mgr.reprefill(req)
        self.shadow.pop(req, None)

    @precondition(lambda self: self.ids(*Status))
    @rule(data=st.data())
    def free(self, data) -> None:
        req = data.draw(st.sampled_from(self.ids(*Status)))
        self.mgr.free(req)
        self.shadow.pop(req, None)

    @rule(num_slots=st.integers(1, 6))
    def rebalance(self, num_slots: int) -> None:
        try:
            self.mgr.rebalance(num_slots)
        except (OutOfDeviceMemoryError, BudgetTooSmallError):
            pass  # the live requests or the slots alone do not fit; the invariant checks nothing moved

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        self.mgr.check_integrity()
        for req, expected in self.shadow.items():
            got = self.mgr.live_state(req)
            for k, v in expected.items():
                assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), f"{req}: role {k} differs"


@pytest.mark.parametrize("kind", KINDS)
def test_lifecycle(kind):
    machine = type(f"Lifecycle_{kind}", (Lifecycle,), {"kind": kind})
    machine.TestCase.settings = settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()
