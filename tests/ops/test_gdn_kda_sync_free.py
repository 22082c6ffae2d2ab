"""GDN and KDA decode / verify / accept without host syncs: padding rows write nothing wherever they sit
(first row, every row), and on CUDA the ops run under sync-debug "error" and replay from a CUDA graph."""
import pytest
import torch

from hybridcache.ops.gdn import gdn_accept, gdn_decode, gdn_verify
from hybridcache.ops.gdn.naive import naive_gdn_decode, naive_gdn_verify
from hybridcache.ops.kda import kda_accept, kda_decode, kda_verify
from hybridcache.ops.kda.naive import naive_kda_decode, naive_kda_verify
from tests.ops import test_gdn_replay as gdn_t
from tests.ops import test_kda_verify as kda_t
from tests.ops.test_gdn import close
from tests.ops.test_gdn import inputs as gdn_inputs
from tests.ops.test_kda import inputs as kda_inputs

HIST, T, P = 8, 4, 3


def gdn_pools() -> dict:
    """Slot 3 folds (6 + 4 > 8), slot 0 appends, the rest belong to no row."""
    p = gdn_t.pools(HIST)
    p["pnat"] = torch.tensor([2, 5, 1, 6, 0, 3], dtype=torch.int32)
    return p


def gdn_inputs_on(device: str, B: int) -> list[torch.Tensor]:
    return [t.to(device) for t in gdn_inputs(B, T, gdn_t.H, gdn_t.HV, gdn_t.K, gdn_t.V, seed=3)]


def kda_inputs_on(device: str, B: int) -> list[torch.Tensor]:
    return [t.to(device) for t in kda_inputs(B, T, kda_t.H, kda_t.K, kda_t.V, seed=3)]


def gdn_step(p: dict, x: list, slots: torch.Tensor, fn=gdn_verify) -> torch.Tensor:
    """One verify (fn) + accept of inputs x on pools p (in place, all on slots' device); returns o."""
    o = fn(*x, *(p[r] for r in gdn_t.ROLES), p["pnat"], p["buf_idx"], slots, use_qk_l2norm_in_kernel=True)
    gdn_accept(p["pnat"], p["buf_idx"], slots, T, torch.full_like(slots, 2), HIST)
    return o


def kda_step(p: dict, x: list, slots: torch.Tensor, fn=kda_verify) -> torch.Tensor:
    o = fn(*x, *(p[r] for r in kda_t.ROLES), p["pend_n"], slots, use_qk_l2norm_in_kernel=True)
    kda_accept(p["pend_n"], slots, torch.full_like(slots, 2))
    return o


FAMILIES = {
    "gdn": (gdn_pools, gdn_inputs_on, gdn_step, naive_gdn_verify),
    "kda": (lambda: kda_t.pools(P), kda_inputs_on, kda_step, naive_kda_verify),
}


def decode_case(family: str, B: int, seed: int = 0) -> tuple:
    """(decode, its naive reference, inputs [B, 1, ...] on the CPU)."""
    if family == "gdn":
        return gdn_decode, naive_gdn_decode, gdn_inputs(B, 1, gdn_t.H, gdn_t.HV, gdn_t.K, gdn_t.V, seed=seed)
    return kda_decode, naive_kda_decode, kda_inputs(B, 1, kda_t.H, kda_t.K, kda_t.V, seed=seed)


def to(p: dict, device: str) -> dict:
    return {r: t.clone().to(device) for r, t in p.items()}


def assert_same(a: dict, b: dict) -> None:
    for r in a:
        assert torch.equal(a[r].cpu(), b[r].cpu()), r


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_verify_with_padding_first_matches_naive_and_leaves_other_slots(device, family):
    pools, inputs_on, step, naive = FAMILIES[family]
    ref = pools()
    before, fast = to(ref, "cpu"), to(ref, device)
    slots = torch.tensor([-1, 3, -1, 0])
    o_ref = step(ref, inputs_on("cpu", 4), slots, naive)
    o = step(fast, inputs_on(device, 4), slots.to(device))
    live = slots >= 0
    close(o.cpu()[live], o_ref[live])
    for r in ref:  # the reference ran the same (fast) accept
        close(fast[r].cpu().float(), ref[r].float())
    for r in ref:  # slots 1, 2, 4, 5 belong to no row: bit for bit untouched
        assert torch.equal(fast[r].cpu()[[1, 2, 4, 5]], before[r][[1, 2, 4, 5]]), r


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_all_padding_batch_writes_nothing(device, family):
    pools, inputs_on, step, _ = FAMILIES[family]
    p = to(pools(), device)
    before = to(p, "cpu")
    step(p, inputs_on(device, 3), torch.full((3,), -1, device=device))
    assert_same(p, before)
    decode, _, x = decode_case(family, 2)
    decode(*(t.to(device) for t in x), p["ssm"], torch.full((2,), -1, device=device))
    assert_same(p, before)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_with_padding_first_matches_naive(device, family):
    ssm = FAMILIES[family][0]()["ssm"]
    decode, naive, x = decode_case(family, 3, seed=4)
    slots = torch.tensor([-1, 4, 1])
    ref, fast = ssm.clone(), ssm.clone().to(device)
    o_ref = naive(*x, ref, slots, use_qk_l2norm_in_kernel=True)
    o = decode(*(t.to(device) for t in x), fast, slots.to(device), use_qk_l2norm_in_kernel=True)
    close(o.cpu()[1:], o_ref[1:]), close(fast.cpu(), ref)
    assert torch.equal(fast.cpu()[[0, 2, 3, 5]], ssm[[0, 2, 3, 5]])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_cuda_no_host_sync_and_graph_replay(cuda_only, family):
    """Under sync-debug "error" any host sync raises; a CUDA graph of the step replays the eager result."""
    pools, inputs_on, step, _ = FAMILIES[family]
    slots = torch.tensor([-1, 3, -1, 0], device="cuda")
    x = inputs_on("cuda", 4)
    decode, _, xd = decode_case(family, 4)
    xd = [t.cuda() for t in xd]

    def run(p: dict) -> torch.Tensor:
        o = step(p, x, slots)
        decode(*xd, p["ssm"], slots, use_qk_l2norm_in_kernel=True)
        return o

    eager, graphed, scratch = (to(pools(), "cuda") for _ in range(3))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o_eager = run(eager)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(scratch)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = run(graphed)
    graph.replay()
    torch.cuda.synchronize()
    live = (slots >= 0).cpu()
    close(o_graph.cpu()[live], o_eager.cpu()[live], 1e-5)
    for r in eager:
        close(graphed[r].float(), eager[r].float(), 1e-5)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_verify_accept_make_no_host_sync_call(family):
    """The CPU tripwire: what would synchronise on a GPU raises here, on every CI run."""
    from tests.ops.tripwire import no_host_sync

    pools, inputs_on, step, _ = FAMILIES[family]
    p = pools()
    x = inputs_on("cpu", 4)
    decode, _, xd = decode_case(family, 4)
    slots = torch.tensor([-1, 3, -1, 0])
    with no_host_sync():
        step(p, x, slots)
        decode(*xd, p["ssm"], slots, use_qk_l2norm_in_kernel=True)
