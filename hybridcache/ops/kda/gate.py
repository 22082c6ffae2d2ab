"""KDA's per-channel log-decay from the model's raw gate projection, and the raw gate (`KDARawGate`) that
decode and verify can fuse."""
from typing import NamedTuple

import torch


def kda_gate(
    g_raw: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """g_raw [..., H, K] (the f_b_proj output viewed per head); A_log (H elements); dt_bias (H·K elements).

    Without lower_bound, as transformers' `KimiLinearForgetGate`: `-exp(A_log)·softplus(g_raw + dt_bias)`,
    softplus taken as the identity above 20. With lower_bound (fla's `fused_kda_gate` option):
    `lower_bound·sigmoid(exp(A_log)·(g_raw + dt_bias))`. Returns the fp32 log-decay [..., H, K].
    """
    H, K = g_raw.shape[-2:]
    x = g_raw.float() + dt_bias.float().view(H, K)
    rate = A_log.float().view(H, 1).exp()
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(rate * x)
    return -rate * torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x)))


class KDARawGate(NamedTuple):
    """The gate's inputs, for an op to compute g and beta itself: fused into the kernel on CUDA, `values()`
    first on the torch path. g_raw [B, T, H, K] (the f_b_proj output viewed per head), b [B, T, H] (the raw
    beta logits; any dtype, a unit last stride is read in place); A_log (H elements); dt_bias (H·K elements).
    No lower_bound: the mixer does not use it."""

    g_raw: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(g fp32 [B, T, H, K], beta = sigmoid(b) in b's dtype [B, T, H]), as the mixer computes them."""
        return kda_gate(self.g_raw, self.A_log, self.dt_bias), torch.sigmoid(self.b)
