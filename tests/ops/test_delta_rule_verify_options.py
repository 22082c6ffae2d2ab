"""The verify kernels' launch options against their defaults, on the same pools and inputs: GDN's state products
in bf16 or tf32 (against the reference, within its tolerances) and GDN's register cap (the same bits). Pools, slots, NaN fill and tolerances as in tests/ops/test_delta_rule_verify_triton.py, whose helpers
and cases these tests use.
"""
import pytest
import torch

from hybridcache.ops.triton_support import HAS_TRITON, interpreting, triton_testable

if not HAS_TRITON:
    pytest.skip("triton is not installed", allow_module_level=True)
if not triton_testable(torch.empty(0, device="cpu" if interpreting() or not torch.cuda.is_available() else "cuda")):
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 for Triton's CPU interpreter", allow_module_level=True)

from hybridcache.ops.gdn import triton_verify as gdn_triton_verify  # noqa: E402
from hybridcache.ops.gdn.triton_verify import gdn_verify_triton  # noqa: E402
from tests.ops import test_delta_rule_verify_triton as verify_cases  # noqa: E402
from tests.ops.test_delta_rule_verify_triton import (  # noqa: E402
    DEVICE, GDN_ROLES, HV, SLOTS, copies, gdn_pools, gdn_run, qk_inputs)


@pytest.mark.parametrize("bf16_state", [False, True])
def test_gdn_state_products_in_either_precision_match_naive(monkeypatch, bf16_state):
    """`BF16_STATE` (16-bit inputs: the closed form's state blocks multiplied on bf16 operands, the default) and
    its tf32 form: the 64-wide bf16 case of test_gdn_verify_matches_torch_and_naive, against the reference and the
    torch path within the same tolerances."""
    from hybridcache.ops.gdn import triton_verify_chunked

    monkeypatch.setattr(triton_verify_chunked, "BF16_STATE", bf16_state)
    verify_cases.test_gdn_verify_matches_torch_and_naive(4, 20, 64, 64, torch.bfloat16, True, None, None)


def test_gdn_register_cap_changes_no_value():
    """`max_registers` (Triton's maxnreg) is a launch option of the closed form: outputs and every role the same
    bits as the launch without a cap (on CUDA the capped kernel may spill; its arithmetic is the same)."""
    T, hist, K, V, dtype = 4, 20, 64, 64, torch.bfloat16
    before = gdn_pools(T, hist, K, V, dtype)
    plain, capped = copies(before, DEVICE), copies(before, DEVICE)
    x = [t.to(DEVICE) for t in qk_inputs(len(SLOTS), T, HV, K, V, (HV,), dtype, seed=3, norm_in_kernel=True)]
    slots = torch.tensor(SLOTS, device=DEVICE)
    o = gdn_run(gdn_verify_triton, x, plain, slots, use_qk_l2norm_in_kernel=True, max_registers=0)
    o_capped = gdn_run(gdn_verify_triton, x, capped, slots, use_qk_l2norm_in_kernel=True, max_registers=168)
    assert torch.equal(o, o_capped)
    for r in GDN_ROLES:
        assert torch.equal(plain[r].nan_to_num(), capped[r].nan_to_num()), r


def test_gdn_register_cap_from_sixteen_programs_an_sm(monkeypatch):
    """The closed form is capped at MAX_REGISTERS only where the grid is CAP_FROM programs an SM deep, and
    never off CUDA (the interpreter has no registers)."""
    monkeypatch.setattr(gdn_triton_verify, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    assert gdn_triton_verify.register_cap(16 * 32 * 2, cuda) == 0  # batch 16, 32 value heads, 2 value blocks
    assert gdn_triton_verify.register_cap(16 * 132 - 1, cuda) == 0
    assert gdn_triton_verify.register_cap(16 * 132, cuda) == 168
    assert gdn_triton_verify.register_cap(64 * 32 * 2, cuda) == 168  # batch 64
    assert gdn_triton_verify.register_cap(10 ** 6, torch.device("cpu")) == 0
