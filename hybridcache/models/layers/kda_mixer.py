"""Kimi Delta Attention mixer over the pool's `kda` slot roles: conv window, state, pending-draft caches."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.conv1d import causal_conv1d_prefill, causal_conv1d_update
from ...ops.kda import KDARawGate, kda_decode, kda_gate, kda_prefill, kda_verify
from ...ops.triton_support import runs_triton
from ..batch import ForwardBatch
from .mlp import Linear
from .norm import SigmoidGatedRMSNorm
from .params import param

STATE_NAME = "kda"
PENDING_ROLES = ("pend_k", "pend_g", "pend_v", "pend_beta")


class KDAMixer(nn.Module):
    """q/k/v_proj `[H*K, D]` -> one causal depthwise conv (+ silu) over cat(q, k, v) -> l2-normalised q, k;
    per-channel log-decay `kda_gate(f_b_proj(f_a_proj(x)), A_log, dt_bias)`, beta = sigmoid(b_proj(x));
    KDA; sigmoid-gated RMSNorm per head with `g_b_proj(g_a_proj(x))`; o_proj `[D, H*K]`.

    Checkpoint names (`self_attn.` prefix): the three conv kernels `q_conv1d.weight`, `k_conv1d.weight`,
    `v_conv1d.weight` `[H*K, 1, W+1]` are views of one `[3*H*K, W+1]` weight, so the cache's one conv window
    covers the three equal sections. `A_log` `[1, 1, H, 1]`, `dt_bias` `[H*K]` (fp32).

    Likewise `q_proj.weight`, `k_proj.weight`, `v_proj.weight` `[H*K, D]` are row slices (views) of one
    `qkv_weight` `[3*H*K, D]`, so one linear gives the conv input cat(q, k, v) `[N, 3*H*K]` (one GEMM in
    place of three and a cat). The views are made here, at construction, not by a copy in a `finish_load`:
    the loader fills them name for name and the fused weight holds the checkpoint's values with nothing
    more to do, so there is no state in which the fused weight is stale (no "before finish_load" to guard,
    no second call to refuse). They are tensors of `checkpoint_tensors`, not Linear modules, so that the
    parameter walk lists each weight once; replacing (not filling) one of them, e.g. `Module.to`, would
    break the sharing — load with `load_model` on the target device and dtype.

    `index` is this layer's position among the model's KDA layers (its layer in every `kda` role). Context
    rows run the chunked prefill; generation rows `[Bg, T]` run plain decode (T = 1) or the pending-draft
    verify (`batch.speculative`). On CUDA the generation rows' kernels compute their gate from the raw
    f_b_proj and b_proj outputs (`KDARawGate`); g and beta are computed here for the context rows only.
    """

    def __init__(self, index: int, hidden: int, num_heads: int, head_dim: int, conv_kernel: int, eps: float,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.index, self.num_heads, self.head_dim = index, num_heads, head_dim
        self.width = num_heads * head_dim
        self.qkv_weight = param(3 * self.width, hidden, device=device, dtype=dtype)
        self.conv_weight = param(3 * self.width, conv_kernel, device=device, dtype=dtype)
        self.f_a_proj = Linear(hidden, head_dim, False, device, dtype)
        self.f_b_proj = Linear(head_dim, self.width, False, device, dtype)
        self.A_log = param(1, 1, num_heads, 1, device=device, dtype=dtype)
        self.dt_bias = param(self.width, device=device, dtype=torch.float32)
        self.b_proj = Linear(hidden, num_heads, False, device, dtype)
        self.g_a_proj = Linear(hidden, head_dim, False, device, dtype)
        self.g_b_proj = Linear(head_dim, self.width, False, device, dtype)
        self.o_norm = SigmoidGatedRMSNorm(head_dim, eps, device, dtype)
        self.o_proj = Linear(self.width, hidden, False, device, dtype)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        q, k, v = self.conv_weight.split(self.width)
        wq, wk, wv = self.qkv_weight.split(self.width)
        return {"q_conv1d.weight": q[:, None], "k_conv1d.weight": k[:, None], "v_conv1d.weight": v[:, None],
                "q_proj.weight": wq, "k_proj.weight": wk, "v_proj.weight": wv,
                "A_log": self.A_log, "dt_bias": self.dt_bias}

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, D] -> qkv [N, 3*H*K] (the conv input), g_raw [N, H, K] (f_b_proj's output), b [N, H]
        (the raw beta logits)."""
        n = x.shape[0]
        return (F.linear(x, self.qkv_weight), self.f_b_proj(self.f_a_proj(x)).view(n, self.num_heads, self.head_dim),
                self.b_proj(x))

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] -> [N, D]; updates this layer's conv / ssm (/ pending) roles of the batch's slots."""
        roles = batch.states[STATE_NAME]
        i, n, H, K = self.index, x.shape[0], self.num_heads, self.head_dim
        conv, ssm = roles["conv"][i], roles["ssm"][i]
        qkv, g_raw, b = self._project(x)
        nc, bc, bg = batch.num_context_tokens, batch.num_context_rows, batch.num_generation_rows
        fused = runs_triton(x)  # the generation rows' kernels then compute their own gate (KDARawGate)
        rows = nc if fused else n  # the rows whose g [rows, H, K] fp32 and beta [rows, H] are computed here
        g, beta = (kda_gate(g_raw[:rows], self.A_log, self.dt_bias), torch.sigmoid(b[:rows])) if rows else (None, None)
        outs = []
        if bc:
            slots, has_initial, cu = batch.context_rows
            mixed = causal_conv1d_prefill(qkv[:nc], self.conv_weight, None, conv, slots, has_initial, cu, "silu")
            q, k, v = (t.view(nc, H, K) for t in mixed.split(self.width, dim=-1))
            outs.append(kda_prefill(q, k, v, g[:nc], beta[:nc], cu, ssm, slots, has_initial,
                                    use_qk_l2norm_in_kernel=True))
        if bg:
            steps, slots = batch.generation_tokens, batch.slots[bc:]
            mixed = causal_conv1d_update(qkv[nc:].view(bg, steps, -1), self.conv_weight, None, conv, slots, "silu")
            q, k, v = (t.view(bg, steps, H, K) for t in mixed.split(self.width, dim=-1))
            if fused:
                g_g = beta_g = None
                raw_gate = KDARawGate(g_raw[nc:].view(bg, steps, H, K), b[nc:].view(bg, steps, H), self.A_log,
                                  self.dt_bias)
            else:
                g_g, beta_g, raw_gate = g[nc:].view(bg, steps, H, K), beta[nc:].view(bg, steps, H), None
            if batch.speculative:
                pending = [roles[name][i] for name in PENDING_ROLES]
                o = kda_verify(q, k, v, g_g, beta_g, ssm, *pending, roles["pend_n"][0], slots,
                               use_qk_l2norm_in_kernel=True, gate=raw_gate)
            else:
                o = kda_decode(q, k, v, g_g, beta_g, ssm, slots, use_qk_l2norm_in_kernel=True, gate=raw_gate)
            outs.append(o.reshape(bg * steps, H, K))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        gate = self.g_b_proj(self.g_a_proj(x)).view(n, H, K)
        return self.o_proj(self.o_norm(o, gate).reshape(n, self.width))
