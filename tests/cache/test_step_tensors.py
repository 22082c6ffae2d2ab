"""`cache.step.StepTensors`: each step's index tensors equal its plan, whatever came before (aborted steps,
speculative jumps, new layouts); a steady decode step uploads nothing; a tensor handed out is never written
afterwards (a graph step skips copying the ones it has seen, `engine.graphs`)."""
from __future__ import annotations

import numpy as np
import torch

from hybridcache.cache.plans import StepPlan, frozen
from hybridcache.cache.step import StepTensors


class Counting(StepTensors):
    uploads = 0

    def upload(self, a):
        self.uploads += 1
        return super().upload(a)


def plan(version: int, cached, new, writes=((), (), ()), width: int = 4, fresh=None) -> StepPlan:
    b = len(cached)
    arr = lambda x, dt=np.int64: frozen(np.array(x, dtype=dt))  # noqa: E731
    return StepPlan(
        req_ids=tuple(range(b)), version=version, slots=arr(np.arange(b) + 10), generation=arr([True] * b, bool),
        cached_lens=arr(cached), num_new=arr(new), fresh=arr(fresh or [False] * b, bool), table_width=width,
        table_writes=tuple(arr(w) for w in writes), dummy=arr([False] * b, bool),
    )


def check(ix, p: StepPlan, table: np.ndarray) -> None:
    assert ix.cached_lens.tolist() == p.cached_lens.tolist()
    assert ix.num_new.tolist() == p.num_new.tolist()
    assert ix.cu_seqlens.tolist() == [0, *np.cumsum(p.num_new).tolist()]
    assert ix.slots.tolist() == p.slots.tolist()
    assert ix.has_initial.tolist() == (~p.fresh).tolist()
    assert ix.page_table[:, : table.shape[1]].tolist() == table.tolist()


def test_indices_follow_the_plans_and_nothing_handed_out_changes():
    st = Counting(torch.device("cpu"))
    table = np.full((2, 4), -1)
    table[0, :2], table[1, :1] = [3, 7], [5]
    first = plan(1, [0, 0], [20, 9], writes=([0, 0, 1], [0, 1, 0], [3, 7, 5]), fresh=[True, True])
    ix = st.update(first)
    check(ix, first, table)
    handed = [ix]

    steady = plan(1, [20, 9], [1, 1])
    st.uploads = 0
    ix = st.update(steady)  # the lengths are the step before's ends: added on the device
    assert st.uploads == 2  # num_new changed (20, 9 -> 1, 1), and its offsets; nothing else
    check(ix, steady, table)
    assert ix.page_table is handed[-1].page_table
    handed.append(ix)

    again = plan(1, [21, 10], [1, 1])
    st.uploads = 0
    ix = st.update(again)
    assert st.uploads == 0  # a steady decode step uploads nothing
    check(ix, again, table)
    assert ix.slots is handed[-1].slots and ix.cu_seqlens is handed[-1].cu_seqlens
    assert ix.has_initial is handed[-1].has_initial and ix.page_table is handed[-1].page_table
    handed.append(ix)

    snapshot = [(h.page_table.clone(), h.cached_lens.clone()) for h in handed]
    table[1, 1] = 8  # a row crosses into its second page: the table is written as a new tensor
    crossing = plan(1, [22, 11], [1, 1], writes=([1], [1], [8]))
    ix = st.update(crossing)
    check(ix, crossing, table)
    assert ix.page_table is not handed[-1].page_table
    handed.append(ix)

    aborted = plan(1, [22, 11], [4, 4])  # the step before was aborted: its ends never came
    check(st.update(aborted), aborted, table)
    jumped = plan(1, [25, 12], [4, 4])  # a verify step accepted 3 and 1 of its 4
    check(st.update(jumped), jumped, table)
    for h, (t, c) in zip(handed, snapshot):
        assert torch.equal(h.page_table, t) and torch.equal(h.cached_lens, c)

    other = plan(2, [0, 29, 0], [5, 1, 2], writes=([0, 1, 2], [0, 0, 0], [1, 2, 4]), fresh=[True, False, True])
    new_table = np.array([[1, -1, -1, -1], [2, -1, -1, -1], [4, -1, -1, -1]])
    check(st.update(other), other, new_table)
    grown = plan(2, [5, 30, 2], [1, 1, 1], writes=([1], [4], [6]), width=8)  # the table widens
    new_table = np.pad(new_table, ((0, 0), (0, 4)), constant_values=-1)
    new_table[1, 4] = 6
    check(st.update(grown), grown, new_table)


def test_chained_lengths_are_the_step_befores_plus_its_device_counts():
    """A plan with `lens_on_device` (its host lengths are upper bounds) takes the step before's committed
    lengths plus the counts `chain` gave, uploading no lengths, through a new layout of the same rows too;
    one without a chained step before it is refused."""
    from dataclasses import replace

    import pytest

    st = Counting(torch.device("cpu"))
    st.update(plan(1, [8, 5], [4, 4], writes=([0, 1], [0, 0], [3, 5])))
    st.chain(torch.tensor([2, 4], dtype=torch.int32))
    st.uploads = 0
    ix = st.update(replace(plan(1, [12, 9], [4, 4]), lens_on_device=True))  # upper bounds: 8 + 4, 5 + 4
    assert ix.cached_lens.tolist() == [10, 9] and ix.lens_on_device and st.uploads == 0
    st.chain(torch.tensor([1, 3], dtype=torch.int32))
    ix = st.update(replace(plan(2, [16, 13], [4, 4], writes=([0, 1], [0, 0], [3, 5])), lens_on_device=True))
    assert ix.cached_lens.tolist() == [11, 12]  # a new layout version of the same rows keeps the chain
    ix = st.update(plan(2, [11, 12], [4, 4]))  # settled: the host lengths again
    assert ix.cached_lens.tolist() == [11, 12] and not ix.lens_on_device
    with pytest.raises(RuntimeError, match="no chained step"):
        st.update(replace(plan(2, [15, 16], [4, 4]), lens_on_device=True))
