"""The Triton conv-window accept (`ops/conv1d/triton_shift.py`) against the torch rule it replaces on
CUDA: every entry of the pool bit for bit, fp32 and bf16, a strided role (one module's view of a wider
pool), padding rows, v = 1 (an identity) up to v = T, and windows wider than v - 1 (reads and writes of a
row overlap). Runs on CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops.conv1d.fast import shift_conv_window
from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.conv1d.triton_shift import shift_conv_window_triton  # noqa: E402


def torch_rule(conv: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor, width: int) -> None:
    """The CPU torch path (it takes live rows only)."""
    live = slots >= 0
    shift_conv_window(conv, slots[live], valid[live], width)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width, k", [(3, 3), (3, 1), (1, 4), (5, 2)])
def test_triton_shift_equals_the_torch_rule(dtype, width, k):
    g = torch.Generator().manual_seed(width * 10 + k)
    wide = torch.randn(3, 7, 2, 37, width + k, generator=g).to(dtype)  # [L, S, modules, C, W + k]
    slots = torch.tensor([4, -1, 0, 6, 2])
    valid = torch.tensor([1, 3, k + 1, 2, k + 1]).clamp(max=k + 1)
    want = wide.clone()
    torch_rule(want[:, :, 1], slots, valid, width)
    got = wide.clone().to(DEVICE)
    shift_conv_window_triton(got[:, :, 1], slots.to(DEVICE), valid.to(DEVICE), width)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    assert torch.equal(got.cpu().view(bits), want.view(bits))
    assert not torch.equal(want, wide)  # some row moved


def test_no_rows_and_no_window_write_nothing():
    conv = torch.randn(2, 3, 4, 6, device=DEVICE)
    before = conv.clone()
    shift_conv_window_triton(conv, torch.empty(0, dtype=torch.long, device=DEVICE),
                             torch.empty(0, dtype=torch.int32, device=DEVICE), 3)
    shift_conv_window_triton(conv, torch.tensor([1], device=DEVICE), torch.tensor([3], device=DEVICE), 0)
    assert torch.equal(conv, before)
