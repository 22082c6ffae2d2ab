"""Mamba2 (SSD) mixer over the pool's `mamba2` slot roles: conv window, checkpoint and replay history."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.conv1d import causal_conv1d_prefill, causal_conv1d_update
from ...ops.mamba2 import mamba2_decode, mamba2_prefill, mamba2_verify
from ...parallel import SINGLE, TPGroup, group_share, head_share, shard
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from ..batch import ForwardBatch
from .norm import GatedGroupRMSNorm
from .params import param

STATE_NAME = "mamba2"
REPLAY_ROLES = ("replay_x", "replay_B", "replay_dt", "replay_dA_cumsum")


class DepthwiseConv(nn.Module):
    """Causal depthwise conv weights as checkpoints store them: weight `[C, 1, K]`, bias `[C]`."""

    def __init__(self, channels: int, kernel: int, bias: bool, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(channels, 1, kernel, device=device, dtype=dtype)
        self.bias = param(channels, device=device, dtype=dtype) if bias else None


class Mamba2Mixer(nn.Module):
    """in_proj `[I + C + H, D]` -> (z `[I]`, xBC `[C]`, dt `[H]`), C = I + 2*G*N, I = H*P; causal conv + silu
    on xBC; SSD scan with A = -exp(A_log), D skip and dt = clamp(softplus(dt + dt_bias), dt_limit); gated
    group RMSNorm with z; out_proj `[D, I]`.

    `index` is this layer's position among the model's Mamba2 layers (its layer in every `mamba2` role).
    Context rows run the chunked prefill; generation rows `[Bg, T]` run plain decode (T = 1) or the
    replay verify (`batch.speculative`).

    Tensor parallel: heads sharded (their z, x, dt channels, dt_bias, A_log, D, norm weight); groups
    (B, C channels) sharded with them when the size divides `n_groups`, else each rank holds the one
    group of its heads (`group_share`), and the gated norm, whose group then spans ranks, sums its
    squares across them. out_proj is row-parallel: the output is this rank's partial sum.
    """

    def __init__(self, index: int, hidden: int, num_heads: int, head_dim: int, n_groups: int, state_size: int,
                 conv_kernel: int, chunk_size: int, dt_limit: tuple[float, float], eps: float,
                 proj_bias: bool, conv_bias: bool, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h0, hl = head_share(tp, num_heads, "mamba_num_heads")
        g0, gl = group_share(tp, n_groups, num_heads, "n_groups")
        P, N, I, GN = head_dim, state_size, num_heads * head_dim, n_groups * state_size
        self.index, self.num_heads, self.head_dim = index, hl, head_dim
        self.n_groups, self.state_size, self.chunk_size, self.dt_limit = gl, state_size, chunk_size, dt_limit
        self.inner = hl * P
        self.conv_dim = self.inner + 2 * gl * N
        # this rank's channels of xBC [x: I | B: G*N | C: G*N] and of in_proj's output [z: I | xBC | dt: H]
        xbc = [(h0 * P, hl * P), (I + g0 * N, gl * N), (I + GN + g0 * N, gl * N)]
        rows = [(h0 * P, hl * P), *((I + a, n) for a, n in xbc), (2 * I + 2 * GN + h0, hl)]
        self.in_proj = ColumnParallelLinear(hidden, 2 * I + 2 * GN + num_heads, rows, proj_bias, device, dtype)
        self.conv1d = DepthwiseConv(self.conv_dim, conv_kernel, conv_bias, device, dtype)
        shard(self.conv1d.weight, 0, I + 2 * GN, *xbc)
        shard(self.conv1d.bias, 0, I + 2 * GN, *xbc)
        heads = (h0, hl)
        self.dt_bias = shard(param(hl, device=device, dtype=dtype), 0, num_heads, heads)
        self.A_log = shard(param(hl, device=device, dtype=dtype), 0, num_heads, heads)
        self.D = shard(param(hl, device=device, dtype=dtype), 0, num_heads, heads)
        self.register_buffer("A", None, persistent=False)  # -exp(A_log) in fp32, set by finish_load
        spans = n_groups % tp.size != 0  # this rank holds part of one group's channels
        self.norm = GatedGroupRMSNorm(self.inner, gl, eps, device, dtype,
                                      (tp, g0, n_groups, I // n_groups) if spans else None)
        shard(self.norm.weight, 0, I, (h0 * P, hl * P))
        self.out_proj = RowParallelLinear(I, [(h0 * P, hl * P)], hidden, proj_bias, tp, device, dtype)

    def finish_load(self) -> None:
        """A = -exp(A_log) in fp32, once after the weights are filled (three launches a layer and step
        fewer); a mixer whose weights are filled otherwise computes it in each forward."""
        with torch.no_grad():
            self.A = -torch.exp(self.A_log.float())

    def _split_xbc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[..., C] -> x [..., H, P], B [..., G, N], C [..., G, N]."""
        gn = self.n_groups * self.state_size
        xs, B, C = xbc.split([self.inner, gn, gn], dim=-1)
        lead = xbc.shape[:-1]
        return (xs.reshape(*lead, self.num_heads, self.head_dim),
                B.reshape(*lead, self.n_groups, self.state_size), C.reshape(*lead, self.n_groups, self.state_size))

    def forward(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """hidden: [N, D] -> [N, D]; updates this layer's conv / ssm / replay roles of the batch's slots."""
        roles = batch.states[STATE_NAME]
        i = self.index
        conv, ssm = roles["conv"][i], roles["ssm"][i]
        z, xbc, dt = self.in_proj(hidden).split([self.inner, self.conv_dim, self.num_heads], dim=-1)
        weight, bias = self.conv1d.weight[:, 0], self.conv1d.bias
        A = self.A if self.A is not None else -torch.exp(self.A_log.float())
        scan = dict(D=self.D, dt_bias=self.dt_bias, dt_limit=self.dt_limit)
        nc, bc, bg = batch.num_context_tokens, batch.num_context_rows, batch.num_generation_rows
        outs = []
        if bc:
            slots, has_initial, cu = batch.context_rows
            xbc_c = causal_conv1d_prefill(xbc[:nc], weight, bias, conv, slots, has_initial, cu, "silu")
            xs, B, C = self._split_xbc(xbc_c)
            outs.append(mamba2_prefill(xs, dt[:nc], A, B, C, ssm, slots, has_initial, cu,
                                       chunk_size=self.chunk_size, **scan).reshape(nc, self.inner))
        if bg:
            steps = batch.generation_tokens
            slots = batch.slots[bc:]
            xbc_g = causal_conv1d_update(xbc[nc:].reshape(bg, steps, self.conv_dim), weight, bias, conv, slots, "silu")
            xs, B, C = self._split_xbc(xbc_g)
            dt_g = dt[nc:].reshape(bg, steps, self.num_heads)
            if batch.speculative:
                replay = [roles[name][i] for name in REPLAY_ROLES]
                y = mamba2_verify(xs, dt_g, A, B, C, ssm, *replay, roles["pnat"][0], roles["buf_idx"][0], slots, **scan)
            else:
                y = mamba2_decode(xs[:, 0], dt_g[:, 0], A, B[:, 0], C[:, 0], ssm, slots, **scan)
            outs.append(y.reshape(bg * steps, self.inner))
        y = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self.out_proj(self.norm(y, z))
