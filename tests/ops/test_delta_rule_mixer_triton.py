"""The one-launch GDN / KDA mixer decode (conv update, delta rule, gated norm) against the three launches it
replaces (`causal_conv1d_update_triton`, `delta_rule_decode_triton` with the raw gate, the gated norm) and
against the torch paths (the CPU reference: `causal_conv1d_update`, `gdn_decode` / `kda_decode`, the norms'
torch forwards).

Runs on CUDA, or on CPU tensors in Triton's interpreter; skipped otherwise. Pools are NaN except the windows
and states live rows start from, and a padding row's inputs are NaN, so any read of a slot a row must not
read, or a leak from a padding row, shows. Every pool element no live row owns stays bit for bit as it was.
Tolerances: conv windows bit for bit (copies); states 1e-5 (the same fp32 arithmetic, reductions possibly
in another order); outputs fp32 1e-5, bf16 2e-2 (a last-bit flip of a bf16 q, k or v or of o before the
norm moves the output by a few bf16 steps). Against the torch path in bf16 the states too are held to 2e-2:
the conv's output is rounded to bf16 before the recurrence, and Triton's interpreter truncates that cast
where torch (and the GPU) round to nearest, so q, k and v may differ by a bf16 step.
"""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.models.layers.norm import GatedRMSNorm, SigmoidGatedRMSNorm  # noqa: E402
from hybridcache.ops.conv1d import causal_conv1d_update  # noqa: E402
from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton  # noqa: E402
from hybridcache.ops.delta_rule_mixer_triton import delta_rule_mixer_decode_triton  # noqa: E402
from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton  # noqa: E402
from hybridcache.ops.gdn import RawGate, gdn_decode  # noqa: E402
from hybridcache.ops.kda import KDARawGate, kda_decode  # noqa: E402
from hybridcache.ops.rms_norm_triton import gated_rms_norm_triton, sigmoid_gated_rms_norm_triton  # noqa: E402

NAN = float("nan")
SLOTS = [5, 0, -1, 3]  # out of order, a padding row; slots 1, 2, 4 and 6 belong to no row
HAS_INITIAL = [True, False, True, True]  # row 1 starts from a NaN state (its window is read either way)
NUM_SLOTS, WIDTH, EPS = 7, 4, 1e-6
OUT_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
STATE_TOL = dict(atol=1e-5, rtol=1e-5)


class Case:
    """One mixer's decode inputs, B = len(slots) rows of one token, in `dtype`; `pools()` makes fresh
    two-layer conv and ssm pools [S, 2, ...] (layer 1 is the mixer's) holding the live rows' windows and
    states, NaN elsewhere."""

    def __init__(self, family: str, H: int, HV: int, K: int, V: int, dtype: torch.dtype, slots: list[int],
                 starts: list[bool] | None, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.family, self.H, self.HV, self.K, self.V, self.dtype = family, H, HV, K, V, dtype
        self.slots, self.starts = torch.tensor(slots), None if starts is None else torch.tensor(starts)
        B, self.C = len(slots), 2 * H * K + HV * V
        rand = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
        # the projection's output as the mixers slice it: qkv, then the gate's and the norm's inputs
        gate_cols = HV * 2 if family == "gdn" else H * K + H
        self.proj = rand(B, self.C + gate_cols + HV * V).to(dtype)
        self.proj[self.slots < 0] = NAN
        self.qkv = self.proj[:, : self.C]
        self.conv_weight = (rand(self.C, WIDTH) * 0.5).to(dtype)
        rest = self.proj[:, self.C:]
        if family == "gdn":
            a, b = rest[:, :HV], rest[:, HV : 2 * HV]
            self.gate = RawGate(a, b, rand(HV).to(dtype), rand(HV).to(dtype))
            self.norm = GatedRMSNorm(V, EPS, "cpu", dtype)
        else:
            g_raw, b = rest[:, : H * K].view(B, H, K), rest[:, H * K : H * K + H]
            self.gate = KDARawGate(g_raw, b, rand(1, 1, H, 1).to(dtype), rand(H * K))
            self.norm = SigmoidGatedRMSNorm(V, EPS, "cpu", dtype)
        self.norm_gate = rest[:, -HV * V :].view(B, HV, V)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * rand(V))
        self.windows, self.states = rand(NUM_SLOTS, self.C, WIDTH - 1).to(dtype), rand(NUM_SLOTS, HV, K, V)

    def pools(self) -> tuple[torch.Tensor, torch.Tensor]:
        conv = torch.full((NUM_SLOTS, 2, self.C, WIDTH - 1), NAN, dtype=self.dtype)
        ssm = torch.full((NUM_SLOTS, 2, self.HV, self.K, self.V), NAN)
        for i, slot in enumerate(self.slots.tolist()):
            if slot >= 0:
                conv[slot, 1] = self.windows[slot]
                if self.starts is None or self.starts[i]:
                    ssm[slot, 1] = self.states[slot]
        return conv, ssm

    def gate_on(self, device: str, tokens: bool):
        """The raw gate on `device`, with a T = 1 dimension where `tokens` (the decode kernels' form)."""
        fields = [t.to(device) for t in self.gate]
        if tokens:
            fields[0], fields[1] = fields[0][:, None], fields[1][:, None]
        return type(self.gate)(*fields)

    def fused(self, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        d = DEVICE
        return delta_rule_mixer_decode_triton(
            self.qkv.to(d), self.conv_weight.to(d), conv[:, 1], self.slots.to(d),
            None if self.starts is None else self.starts.to(d), ssm[:, 1], self.gate_on(d, False),
            self.norm_gate.to(d), self.norm.weight.to(d), EPS, self.H)

    def three_launches(self, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        d, B, H, K = DEVICE, len(self.slots), self.H, self.K
        y = causal_conv1d_update_triton(self.qkv.to(d)[:, None], self.conv_weight.to(d), None, conv[:, 1],
                                        self.slots.to(d), "silu")
        q, k, v = y[:, 0].split([H * K, H * K, self.HV * self.V], dim=-1)
        o = delta_rule_decode_triton(q.view(B, 1, H, K), k.view(B, 1, H, K), v.view(B, 1, self.HV, self.V),
                                     None, None, ssm[:, 1], self.slots.to(d),
                                     None if self.starts is None else self.starts.to(d),
                                     use_qk_l2norm_in_kernel=True, gate=self.gate_on(d, True))
        norm = gated_rms_norm_triton if self.family == "gdn" else sigmoid_gated_rms_norm_triton
        return norm(o[:, 0], self.norm_gate.to(d), self.norm.weight.to(d), EPS)

    def torch_path(self, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        B, H, K = len(self.slots), self.H, self.K
        y = causal_conv1d_update(self.qkv[:, None], self.conv_weight, None, conv[:, 1], self.slots, "silu")
        q, k, v = y[:, 0].split([H * K, H * K, self.HV * self.V], dim=-1)
        decode = gdn_decode if self.family == "gdn" else kda_decode
        g, beta = self.gate_on("cpu", True).values()
        if self.family == "kda":
            beta = beta.view(B, 1, H)
        o = decode(q.view(B, 1, H, K), k.view(B, 1, H, K), v.view(B, 1, self.HV, self.V), g, beta, ssm[:, 1],
                   self.slots, self.starts, use_qk_l2norm_in_kernel=True)
        return self.norm(o[:, 0], self.norm_gate)


def check(case: Case, against: str) -> None:
    conv0, ssm0 = case.pools()
    conv, ssm = (t.to(DEVICE) for t in case.pools())
    out = case.fused(conv, ssm).cpu()
    if against == "three_launches":
        conv_ref, ssm_ref = (t.to(DEVICE) for t in case.pools())
        ref = case.three_launches(conv_ref, ssm_ref).cpu()
        conv_ref, ssm_ref = conv_ref.cpu(), ssm_ref.cpu()
    else:
        conv_ref, ssm_ref = case.pools()
        ref = case.torch_path(conv_ref, ssm_ref)
    conv, ssm = conv.cpu(), ssm.cpu()
    live = case.slots >= 0
    assert out.dtype == case.dtype and out.shape == (len(case.slots), case.HV, case.V)
    torch.testing.assert_close(out[live], ref[live], **OUT_TOL[case.dtype])
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))
    owned = case.slots[live]
    assert torch.equal(conv[owned, 1], conv_ref[owned, 1])
    state_tol = OUT_TOL[case.dtype] if against == "torch_path" else STATE_TOL
    torch.testing.assert_close(ssm[owned, 1], ssm_ref[owned, 1], **state_tol)
    for pool, before in ((conv, conv0), (ssm, ssm0)):
        untouched = torch.ones(pool.shape, dtype=torch.bool)
        untouched[owned, 1] = False
        assert torch.equal(pool[untouched].view(torch.uint8), before[untouched].view(torch.uint8))


@pytest.mark.parametrize("against", ["three_launches", "torch_path"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family,H,HV,K,V", [("gdn", 2, 4, 16, 32), ("gdn", 1, 3, 16, 16), ("kda", 2, 2, 16, 16)],
                         ids=["gdn-grouped2", "gdn-grouped3", "kda"])
def test_matches_the_three_launches_and_the_torch_path(family, H, HV, K, V, dtype, against) -> None:
    """K != V; two and three value heads a key head; fresh and continued rows; slots out of order with a
    padding row; strided pool views and projection slices read in place."""
    check(Case(family, H, HV, K, V, dtype, SLOTS, HAS_INITIAL), against)


@pytest.mark.parametrize("family,H,HV", [("gdn", 1, 2), ("kda", 2, 2)], ids=["gdn", "kda"])
def test_dims_that_are_not_powers_of_two_and_no_has_initial(family: str, H: int, HV: int) -> None:
    """K = V = 24 pad to masked 32-wide tiles; has_initial None: every live row reads its slot's state."""
    check(Case(family, H, HV, 24, 24, torch.float32, SLOTS, None, seed=1), "three_launches")
