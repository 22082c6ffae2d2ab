"""The fused input and output passes of Mamba2 prefill on fla's kernel against the torch arithmetic they
replace (`prefill.mamba2_prefill_fla`'s other branch).

Runs on CUDA, or on CPU tensors in Triton's interpreter; skipped otherwise. x, B and C are views of one
packed projection (as the mixer splits it), dt a strided column block; token counts that are not a
multiple of the kernels' token block, one group and several, with and without dt_bias, clamping limits.
q and k are copies: bit for bit. v, g and y: fp32 1e-6 relative (softplus and the products in another
order of rounding); bf16 outputs one rounding step apart at most (2^-7 relative: 7 stored mantissa bits).
"""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.mamba2.common import add_skip, heads_of_groups, process_dt  # noqa: E402
from hybridcache.ops.mamba2.triton_ssd_io import ssd_inputs_triton, ssd_output_triton  # noqa: E402

HEADS, HEAD_DIM, DSTATE = 4, 8, 16
TOL = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.bfloat16: dict(atol=1e-6, rtol=2 ** -7)}


def packed(n: int, groups: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """x [n, H, P], B, C [n, G, Ns] as views of one [n, H·P + 2·G·Ns + H + 3] projection; dt [n, H] from it."""
    gen = torch.Generator().manual_seed(seed)
    widths = [HEADS * HEAD_DIM, groups * DSTATE, groups * DSTATE, HEADS, 3]
    proj = (torch.randn(n, sum(widths), generator=gen) * 2).to(dtype).to(DEVICE)
    x, B, C, dt, _ = proj.split(widths, dim=-1)
    return (x.view(n, HEADS, HEAD_DIM), dt, B.view(n, groups, DSTATE), C.view(n, groups, DSTATE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,groups,bias,limit", [(45, 1, True, (0.0, float("inf"))), (33, 2, False, (0.05, 1.0)),
                                                 (1, 4, True, (0.1, 0.5)), (0, 2, True, (0.0, float("inf")))])
def test_inputs_match_the_torch_arithmetic(dtype, n, groups, bias, limit):
    x, dt, B, C = packed(n, groups, dtype, seed=n)
    gen = torch.Generator().manual_seed(1)
    A = (-torch.rand(HEADS, generator=gen) - 0.5).to(DEVICE)
    dt_bias = (torch.randn(HEADS, generator=gen)).to(dtype).to(DEVICE) if bias else None
    q, k, v, g = ssd_inputs_triton(x, dt, A, B, C, dt_bias, limit)

    dtp = process_dt(dt, dt_bias, limit)
    assert torch.equal(q, heads_of_groups(C, HEADS)) and torch.equal(k, heads_of_groups(B, HEADS))
    torch.testing.assert_close(v, (x.float() * dtp[..., None]).to(dtype), **TOL[dtype])
    torch.testing.assert_close(g, dtp * A, **TOL[torch.float32])
    assert g.dtype == torch.float32 and v.dtype == q.dtype == k.dtype == dtype
    assert v.shape == x.shape and q.shape == (n, HEADS, DSTATE) and g.shape == (n, HEADS)
    assert v.is_contiguous() and q.is_contiguous() and g.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [45, 1, 0])
def test_output_is_o_plus_d_x(dtype, n):
    x, *_ = packed(n, 1, dtype, seed=7)
    gen = torch.Generator().manual_seed(2)
    o = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    D = torch.randn(HEADS, generator=gen).to(dtype).to(DEVICE)
    y = ssd_output_triton(o, x, D)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, add_skip(o.float(), x, D).to(dtype), **TOL[dtype])


def test_groups_must_divide_heads():
    x, dt, B, C = packed(4, 3, torch.float32, seed=0)
    with pytest.raises(ValueError, match="multiple of ngroups"):
        ssd_inputs_triton(x, dt, torch.ones(HEADS, device=DEVICE), B, C, None)
