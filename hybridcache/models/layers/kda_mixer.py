"""Kimi Delta Attention mixer over the pool's `kda` slot roles: conv window, state, pending-draft caches."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.conv1d import causal_conv1d_prefill, causal_conv1d_update
from ...ops.kda import KDARawGate, kda_decode, kda_gate, kda_prefill, kda_verify
from ...ops.linear import linear
from ...ops.triton_support import runs_triton
from ...parallel import SINGLE, TPGroup, head_share, shard
from ...parallel.linear import RowParallelLinear
from ..batch import ForwardBatch
from .attention import fused_params, fused_rows
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

    Likewise every projection of x, `q_proj`, `k_proj`, `v_proj` `[H*K, D]`, the low-rank `f_a_proj`,
    `g_a_proj` `[K, D]` and `b_proj` `[H, D]`, is a row slice (a view) of one `in_weight`
    `[3*H*K + 2*K + H, D]`, so one GEMM gives them all (in place of six): the conv input cat(q, k, v)
    `[N, 3*H*K]` and the others are column slices of its output (`attention.fused_rows` names the views).
    The two low-rank up-projections, `f_b_proj` and `g_b_proj` `[H*K, K]`, are the diagonal blocks of one
    `up_weight` `[2*H*K, 2*K]` (zeros off the diagonal), applied to the adjacent f_a, g_a columns: one GEMM
    gives g_raw and the norm's gate (the zero blocks cost 2*H*K*K more weight bytes, a fraction of a
    launch's time at batch 1).
    The views are made here, at construction, not by a copy in a `finish_load`:
    the loader fills them name for name and the fused weight holds the checkpoint's values with nothing
    more to do, so there is no state in which the fused weight is stale (no "before finish_load" to guard,
    no second call to refuse). They are tensors of `checkpoint_tensors`, not Linear modules, so that the
    parameter walk lists each weight once; replacing (not filling) one of them, e.g. `Module.to`, would
    break the sharing — load with `load_model` on the target device and dtype.

    `index` is this layer's position among the model's KDA layers (its layer in every `kda` role). Context
    rows run the chunked prefill; generation rows `[Bg, T]` run plain decode (T = 1) or the pending-draft
    verify (`batch.speculative`). On CUDA the generation rows' kernels compute their gate from the raw
    f_b_proj and b_proj outputs (`KDARawGate`); g and beta are computed here for the context rows only.

    Tensor parallel: heads sharded (q/k/v rows and their conv channels, f_b / g_b / b rows, A_log,
    dt_bias); the low-rank f_a / g_a rows and the per-head norm are replicated; o_proj is row-parallel
    (the output is this rank's partial sum).
    """

    def __init__(self, index: int, hidden: int, num_heads: int, head_dim: int, conv_kernel: int, eps: float,
                 device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h0, hl = head_share(tp, num_heads, "linear_attn_config num_heads")
        K, full = head_dim, num_heads * head_dim
        self.index, self.num_heads, self.head_dim = index, hl, head_dim
        self.width, self.full_width, self.channels = hl * K, full, (h0 * K, hl * K)
        self.heads = (h0, hl)
        self.rows = [*((name, full, self.channels) for name in ("q_proj", "k_proj", "v_proj")),
                     ("f_a_proj", K, (0, K)), ("g_a_proj", K, (0, K)), ("b_proj", num_heads, self.heads)]
        self.in_weight, _ = fused_params(self.rows, hidden, False, device, dtype)
        self.conv_weight = param(3 * self.width, conv_kernel, device=device, dtype=dtype)
        self.up_weight = param(2 * self.width, 2 * K, device=device, dtype=dtype)
        with torch.no_grad():
            self.up_weight.zero_()  # the off-diagonal blocks stay zero: the loader fills the diagonal ones
        self.A_log = param(1, 1, hl, 1, device=device, dtype=dtype)
        self.dt_bias = shard(param(self.width, device=device, dtype=torch.float32), 0, full, self.channels)
        self.o_norm = SigmoidGatedRMSNorm(head_dim, eps, device, dtype)
        self.o_proj = RowParallelLinear(full, [self.channels], hidden, False, tp, device, dtype)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        q, k, v = self.conv_weight.split(self.width)
        full, rows, W, K = self.full_width, self.channels, self.width, self.head_dim
        return {"q_conv1d.weight": shard(q[:, None], 0, full, rows), "k_conv1d.weight": shard(k[:, None], 0, full, rows),
                "v_conv1d.weight": shard(v[:, None], 0, full, rows), **fused_rows(self.rows, self.in_weight, None),
                "f_b_proj.weight": shard(self.up_weight[:W, :K], 0, full, rows),
                "g_b_proj.weight": shard(self.up_weight[W:, K:], 0, full, rows),
                "A_log": shard(self.A_log, 2, full // self.head_dim, self.heads),
                "dt_bias": self.dt_bias}

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, D] -> qkv [N, 3*H*K] (the conv input), g_raw [N, H, K] (f_b_proj's output), b [N, H]
        (the raw beta logits), gate [N, H, K] (g_b_proj's output, for the norm): column slices of two GEMMs'
        outputs (views, unit last stride)."""
        n, H, K, W = x.shape[0], self.num_heads, self.head_dim, self.width
        qkv, low_rank, b = linear(x, self.in_weight).split([3 * W, 2 * K, H], dim=-1)  # low_rank: f_a, g_a
        g_raw, gate = linear(low_rank, self.up_weight).split([W, W], dim=-1)
        return qkv, g_raw.view(n, H, K), b, gate.view(n, H, K)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] -> [N, D]; updates this layer's conv / ssm (/ pending) roles of the batch's slots."""
        roles = batch.states[STATE_NAME]
        i, n, H, K = self.index, x.shape[0], self.num_heads, self.head_dim
        conv, ssm = roles["conv"][i], roles["ssm"][i]
        qkv, g_raw, b, gate = self._project(x)
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
        return self.o_proj(self.o_norm(o, gate).reshape(n, self.width))
