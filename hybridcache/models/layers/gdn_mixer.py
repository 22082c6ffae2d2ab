"""Qwen3-Next's Gated DeltaNet layer over the pool's conv window, state checkpoint and replay history."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.conv1d import causal_conv1d_prefill, causal_conv1d_update
from ...ops.gdn import RawGate, gdn_decode, gdn_gate, gdn_prefill, gdn_verify
from ...ops.linear import linear
from ...ops.triton_support import runs_triton
from ...parallel import SINGLE, TPGroup, head_share, shard
from ...parallel.linear import RowParallelLinear
from ..batch import ForwardBatch
from .attention import fused_params, fused_rows
from .norm import GatedRMSNorm
from .params import param

STATE_NAME = "gdn"
REPLAY_ROLES = ("replay_u", "replay_k", "replay_G", "replay_beta")


class DepthwiseConvWeight(nn.Module):
    """Causal depthwise conv weight as checkpoints store it, `[C, 1, W]`, no bias."""

    def __init__(self, channels: int, kernel: int, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(channels, 1, kernel, device=device, dtype=dtype)


def regroup_rows(w: torch.Tensor, groups: int, parts: list[int]) -> torch.Tensor:
    """w `[groups * sum(parts), D]`, rows grouped as each group's parts in turn -> part 0 of every group, then
    part 1 of every group, ... (a copy, same shape): `w.view(groups, sum(parts), D)` split into `parts`."""
    return torch.cat([p.reshape(-1, w.shape[-1]) for p in w.view(groups, -1, w.shape[-1]).split(parts, dim=1)])


class GatedDeltaNetMixer(nn.Module):
    """H key heads of width K, HV = H*r value heads of width V (value head h*r + j belongs to key head h).

    Projections. Checkpoints group the rows per key head: in_proj_qkvz `[H*(2K + 2rV), D]` holds per key head
    its q `[K]`, k `[K]`, v `[r*V]`, z `[r*V]`; in_proj_ba `[2*HV, D]` per key head b `[r]`, a `[r]`.
    `finish_load` (called once by the loader, after the weights are filled) permutes the rows into

        in_proj_qkvz  [ q: H*K | k: H*K | v: HV*V | z: HV*V ]     (q, k, v = the conv input, C = 2HK + HV*V)
        in_proj_ba    [ b: HV | a: HV ]

    (heads in order within each part), so that qkv `[N, C]`, z, b and a are column slices of one output:
    views, no copies. A row permutation of a linear permutes its output columns and leaves each column's
    arithmetic as it was. The two weights are row views of one `in_weight` (`attention.fused_rows`), so one
    GEMM gives them both; they keep the checkpoint's names and shapes (loading stays name for name); only
    their row order differs once loaded.

    Causal conv + silu over qkv; beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (`gdn_gate`);
    gated delta rule with q/k l2-normalised in the kernel; per-head gated RMSNorm with z; out_proj
    `[D, HV*V]`.

    `index` is this layer's position among the model's GDN layers (its layer in every `gdn` role).
    Context rows run the chunked prefill; generation rows `[Bg, T]` run plain decode (T = 1) or the replay
    verify (`batch.speculative`). On CUDA the generation rows' kernels compute their gate from the raw a, b
    (`RawGate`); g and beta are computed here for the context rows only.

    Tensor parallel: key heads sharded, each with its r value heads; the checkpoint's per-key-head row
    groups make a rank's projection rows one contiguous range. Conv channels (q, k, v sections), dt_bias
    and A_log follow the heads; the per-head norm is replicated; out_proj is row-parallel (the output is
    this rank's partial sum).
    """

    def __init__(self, index: int, hidden: int, num_key_heads: int, num_value_heads: int, key_dim: int,
                 value_dim: int, conv_kernel: int, eps: float, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h0, hl = head_share(tp, num_key_heads, "linear_num_key_heads")
        r = num_value_heads // num_key_heads
        v0, vl, K, V = h0 * r, hl * r, key_dim, value_dim
        self.index, self.H, self.HV, self.K, self.V, self.r = index, hl, vl, K, V, r
        self.conv_dim = 2 * hl * K + vl * V
        group = 2 * K + 2 * r * V  # checkpoint rows per key head in in_proj_qkvz
        self.rows = [("in_proj_qkvz", num_key_heads * group, (h0 * group, hl * group)),
                     ("in_proj_ba", 2 * num_value_heads, (h0 * 2 * r, hl * 2 * r))]
        self.in_weight, _ = fused_params(self.rows, hidden, False, device, dtype)
        self.conv1d = DepthwiseConvWeight(self.conv_dim, conv_kernel, device, dtype)
        hk = num_key_heads * K
        shard(self.conv1d.weight, 0, 2 * hk + num_value_heads * V, (h0 * K, hl * K), (hk + h0 * K, hl * K),
              (2 * hk + v0 * V, vl * V))
        self.dt_bias = shard(param(vl, device=device, dtype=dtype), 0, num_value_heads, (v0, vl))
        self.A_log = shard(param(vl, device=device, dtype=dtype), 0, num_value_heads, (v0, vl))
        self.norm = GatedRMSNorm(value_dim, eps, device, dtype)
        self.out_proj = RowParallelLinear(num_value_heads * V, [(v0 * V, vl * V)], hidden, False, tp, device, dtype)
        self.kernel_layout = False  # whether finish_load has permuted the projections' rows

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {**fused_rows(self.rows, self.in_weight, None), "dt_bias": self.dt_bias, "A_log": self.A_log}

    def finish_load(self) -> None:
        """Permute the projections' rows from the checkpoint's per-key-head grouping into the layout `_project`
        reads (class docstring). Called once, after every weight is filled; a second call would scramble them."""
        if self.kernel_layout:
            raise RuntimeError(f"GDN layer {self.index}: the projections are already in the kernel layout")
        K, rV, r = self.K, self.r * self.V, self.r
        qkvz, ba = self.in_weight.split([row[2][1] for row in self.rows])
        with torch.no_grad():
            for w, parts in ((qkvz, [K, K, rV, rV]), (ba, [r, r])):
                w.copy_(regroup_rows(w, self.H, parts))
        self.kernel_layout = True

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, D] -> qkv [N, C] (conv input), z [N, HV, V], b, a [N, HV]: column slices (views, unit last
        stride) of the one projection's output."""
        if not self.kernel_layout:  # checkpoint row order read as the kernel layout would be silently wrong
            raise RuntimeError(f"GDN layer {self.index}: weights not in the kernel layout; load the model with "
                               "hybridcache.models.loader.load_model (or call finish_load once after filling them)")
        HV = self.HV
        qkv, z, b, a = linear(x, self.in_weight).split([self.conv_dim, HV * self.V, HV, HV], dim=-1)
        return qkv, z.view(x.shape[0], HV, self.V), b, a

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
        weight = self.conv1d.weight[:, 0]
        nc, bc, bg = batch.num_context_tokens, batch.num_context_rows, batch.num_generation_rows
        fused = runs_triton(hidden)  # the generation rows' kernels then compute their own gate (RawGate)
        rows = nc if fused else hidden.shape[0]  # the rows whose g, beta are computed here
        g, beta = gdn_gate(a[:rows], b[:rows], self.A_log, self.dt_bias) if rows else (None, None)
        outs = []
        if bc:
            slots, has_initial, cu = batch.context_rows
            q, k, v = self._split_qkv(causal_conv1d_prefill(qkv[:nc], weight, None, conv, slots, has_initial, cu, "silu"))
            outs.append(gdn_prefill(q, k, v, g[:nc], beta[:nc], cu, ssm, slots, has_initial,
                                    use_qk_l2norm_in_kernel=True))
        if bg:
            steps, slots, shape = batch.generation_tokens, batch.slots[bc:], (bg, batch.generation_tokens, self.HV)
            qkv_g = causal_conv1d_update(qkv[nc:].view(bg, steps, self.conv_dim), weight, None, conv, slots, "silu")
            q, k, v = self._split_qkv(qkv_g)
            if fused:
                g_g = beta_g = None
                gate = RawGate(a[nc:].view(shape), b[nc:].view(shape), self.A_log, self.dt_bias)
            else:
                g_g, beta_g, gate = g[nc:].reshape(shape), beta[nc:].reshape(shape), None
            if batch.speculative:
                replay = [roles[name][i] for name in REPLAY_ROLES]
                o = gdn_verify(q, k, v, g_g, beta_g, ssm, *replay, roles["pnat"][0], roles["buf_idx"][0], slots,
                               use_qk_l2norm_in_kernel=True, gate=gate)
            else:
                o = gdn_decode(q, k, v, g_g, beta_g, ssm, slots, batch.has_initial[bc:], use_qk_l2norm_in_kernel=True,
                               gate=gate)
            outs.append(o.reshape(bg * steps, self.HV, self.V))
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        return self.out_proj(self.norm(o, z).reshape(hidden.shape[0], -1))
