"""The replay accept rule's Triton launch against the torch rule: padding rows, per-row and shared token
counts, folding and appending rows, slots the batch does not list left bit for bit."""
import pytest
import torch

from hybridcache.ops.replay_accept import replay_accept
from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.replay_accept_triton import replay_accept_triton  # noqa: E402


@pytest.mark.parametrize("per_row", [False, True])
def test_accept_matches_the_torch_rule(per_row):
    gen = torch.Generator().manual_seed(int(per_row))
    hist, T, S = 8, 4, 300
    pnat = torch.randint(0, hist + 1, (S,), generator=gen, dtype=torch.int32)
    buf = torch.randint(0, 2, (S,), generator=gen, dtype=torch.int32)
    slots = torch.randperm(S, generator=gen)[:200]
    slots[[3, 150]] = -1  # padding rows: write nothing
    valid = torch.randint(1, T + 1, (200,), generator=gen)
    tokens = torch.randint(1, T + 1, (200,), generator=gen) if per_row else T
    ref_p, ref_b = pnat.clone(), buf.clone()
    replay_accept(ref_p, ref_b, slots, tokens, valid, hist)  # CPU: the torch rule
    p, b = pnat.to(DEVICE, copy=True), buf.to(DEVICE, copy=True)
    replay_accept_triton(p, b, slots.to(DEVICE), tokens.to(DEVICE) if per_row else T, valid.to(DEVICE), hist)
    assert torch.equal(p.cpu(), ref_p) and torch.equal(b.cpu(), ref_b)
    assert not torch.equal(ref_p, pnat), "the case must change something"
