"""Qwen3-Next's Gated DeltaNet layer over the pool's conv window, state checkpoint and replay history."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.conv1d import causal_conv1d_prefill, causal_conv1d_update
from ...ops.gdn import gdn_decode, gdn_prefill, gdn_verify
from ..batch import ForwardBatch
from .mlp import Linear
from .params import param
from .norm import GatedRMSNorm

STATE_NAME = "gdn"
REPLAY_ROLES = ("replay_u", "replay_k", "replay_G", "replay_beta")


class DepthwiseConvWeight(nn.Module):
    """Causal depthwise conv weight as checkpoints store it, `[C, 1, W]`, no bias."""

    def __init__(self, channels: int, kernel: int, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(channels, 1, kernel, device=device, dtype=dtype)


class GatedDeltaNetMixer(nn.Module):
    """H key heads of width K, HV = H*r value heads of width V.

    in_proj_qkvz `[H*(2K + 2rV), D]`: per key head its q `[K]`, k `[K]`, v `[r*V]`, z `[r*V]` (value head
    h*r + j belongs to key head h); in_proj_ba `[2*HV, D]`: per key head b `[r]`, a `[r]`.
    Causal conv + silu over cat(q, k, v) `[C = 2HK + HV*V]`; beta = sigmoid(b),
    g = -exp(A_log) * softplus(a + dt_bias); gated delta rule with q/k l2-normalised in the kernel;
    per-head gated RMSNorm with z; out_proj `[D, HV*V]`.

    `index` is this layer's position among the model's GDN layers (its layer in every `gdn` role).
    Context rows run the chunked prefill; generation rows `[Bg, T]` run plain decode (T = 1) or the replay
    verify (`batch.speculative`).
    """

    def __init__(self, index: int, hidden: int, num_key_heads: int, num_value_heads: int, key_dim: int,
                 value_dim: int, conv_kernel: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.index, self.H, self.HV, self.K, self.V = index, num_key_heads, num_value_heads, key_dim, value_dim
        self.r = num_value_heads // num_key_heads
        self.conv_dim = 2 * num_key_heads * key_dim + num_value_heads * value_dim
        self.in_proj_qkvz = Linear(hidden, num_key_heads * (2 * key_dim + 2 * self.r * value_dim), False, device, dtype)
        self.in_proj_ba = Linear(hidden, 2 * num_value_heads, False, device, dtype)
        self.conv1d = DepthwiseConvWeight(self.conv_dim, conv_kernel, device, dtype)
        self.dt_bias = param(num_value_heads, device=device, dtype=dtype)
        self.A_log = param(num_value_heads, device=device, dtype=dtype)
        self.norm = GatedRMSNorm(value_dim, eps, device, dtype)
        self.out_proj = Linear(num_value_heads * value_dim, hidden, False, device, dtype)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, D] -> qkv [N, C] (conv input), z [N, HV, V], b, a [N, HV]."""
        n, H, K, rV = x.shape[0], self.H, self.K, self.r * self.V
        q, k, v, z = self.in_proj_qkvz(x).view(n, H, 2 * K + 2 * rV).split([K, K, rV, rV], dim=-1)
        b, a = self.in_proj_ba(x).view(n, H, 2 * self.r).split([self.r, self.r], dim=-1)
        qkv = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1)
        return qkv, z.reshape(n, self.HV, self.V), b.reshape(n, self.HV), a.reshape(n, self.HV)

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., C] -> q, k [..., H, K], v [..., HV, V]."""
        hk = self.H * self.K
        q, k, v = qkv.split([hk, hk, self.HV * self.V], dim=-1)
        lead = qkv.shape[:-1]
        return q.reshape(*lead, self.H, self.K), k.reshape(*lead, self.H, self.K), v.reshape(*lead, self.HV, self.V)

    def forward(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """hidden: [N, D] -> [N, D]; updates this layer's conv / ssm / replay roles of the batch's slots."""
        roles = batch.states[STATE_NAME]
        i = self.index
        conv, ssm = roles["conv"][i], roles["ssm"][i]
        qkv, z, b, a = self._project(hidden)
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        weight = self.conv1d.weight[:, 0]
        nc, bc, bg = batch.num_context_tokens, batch.num_context_rows, batch.num_generation_rows
        outs = []
        if bc:
            slots, has_initial, cu = batch.context_rows
            q, k, v = self._split_qkv(causal_conv1d_prefill(qkv[:nc], weight, None, conv, slots, has_initial, cu, "silu"))
            outs.append(gdn_prefill(q, k, v, g[:nc], beta[:nc], cu, ssm, slots, has_initial,
                                    use_qk_l2norm_in_kernel=True))
        if bg:
            steps, slots = batch.generation_tokens, batch.slots[bc:]
            qkv_g = causal_conv1d_update(qkv[nc:].reshape(bg, steps, self.conv_dim), weight, None, conv, slots, "silu")
            q, k, v = self._split_qkv(qkv_g)
            g_g, beta_g = g[nc:].reshape(bg, steps, self.HV), beta[nc:].reshape(bg, steps, self.HV)
            if batch.speculative:
                replay = [roles[name][i] for name in REPLAY_ROLES]
                o = gdn_verify(q, k, v, g_g, beta_g, ssm, *replay, roles["pnat"][0], roles["buf_idx"][0], slots,
                               use_qk_l2norm_in_kernel=True)
            else:
                o = gdn_decode(q, k, v, g_g, beta_g, ssm, slots, batch.has_initial[bc:], use_qk_l2norm_in_kernel=True)
            outs.append(o.reshape(bg * steps, self.HV, self.V))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self.out_proj(self.norm(o, z).reshape(hidden.shape[0], -1))
