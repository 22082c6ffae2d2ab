"""Vectorized Mamba2 replay verify and effective-state helper (no host sync).

A batch mixes rows that append (p + T <= HIST) and rows that fold (p + T > HIST). Every row runs the
fold arithmetic on its gathered checkpoint; a row that does not fold gets weight 0 and decay 1, which
leaves its checkpoint bit for bit, and only folding rows are written back. Outputs then treat the
(folded) checkpoint as the start and the history [0, p_eff) plus the new tokens as one short
causal sequence, p_eff = 0 for folding rows:

    y_t = exp(c_t) C_t . h + sum_{s valid, s <= t} (C_t . B_s) exp(c_t - c_s) dt_s x_s + D x_t

with c the running sum of dt * A from the checkpoint (replay_dA_cumsum for history tokens).
On CUDA with triton, `mamba2_verify` is one fused kernel instead (`triton_verify.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit, add_skip, check_dims, check_steps, process_dt
from hybridcache.ops.slot_io import put_rows, take_rows
from hybridcache.ops.triton_support import runs_triton


class _History:
    """One batch's view of the active replay buffers. Tokens at or past `count` are zeroed.

    valid: [B] (slot >= 0); count: [B] (valid tokens p, 0 for padding rows); buf: [B] (active buffer);
    x: [B, HIST, H, P] fp32; B: [B, HIST, G, N] fp32; dt, cum: [B, H, HIST] fp32;
    last_cum: [B, H] (cum of token p - 1, 0 when p = 0).
    """

    def __init__(self, replay_x: Tensor, replay_B: Tensor, replay_dt: Tensor, replay_dA_cumsum: Tensor,
                 pnat: Tensor, buf_idx: Tensor, slots: Tensor) -> None:
        hist = replay_x.shape[2]
        valid = slots >= 0
        sc = slots.clamp_min(0)
        count = torch.where(valid, pnat[sc].long(), 0)
        buf = torch.where(valid, buf_idx[sc].long(), 0)
        live = (torch.arange(hist, device=slots.device) < count[:, None]) & valid[:, None]  # [B, HIST]
        self.valid, self.count, self.buf = valid, count, buf
        self.x = torch.where(live[..., None, None], replay_x[sc, buf].float(), 0.0)
        self.B = torch.where(live[..., None, None], replay_B[sc, buf].float(), 0.0)
        self.dt = torch.where(live[:, None], replay_dt[sc, buf].float(), 0.0)
        self.cum = torch.where(live[:, None], replay_dA_cumsum[sc, buf].float(), 0.0)
        last = (count - 1).clamp_min(0).view(-1, 1, 1).expand(-1, self.cum.shape[1], 1)
        self.last_cum = torch.where((count > 0)[:, None], self.cum.gather(2, last)[..., 0], 0.0)


def _fold(h: Tensor, hist: _History, apply: Tensor) -> Tensor:
    """In place: h <- exp(c_last) h + sum_{s < p} exp(c_last - c_s) dt_s x_s B_s^T where `apply`.

    h: [B, H, P, N] fp32; apply: [B] bool (rows not applied keep h exactly). Returns h.
    """
    batch, heads, head_dim, dstate = h.shape
    groups = hist.B.shape[2]
    on = apply[:, None]
    decay = torch.where(on, torch.exp(hist.last_cum), 1.0)  # [B, H]
    weight = torch.where(on[..., None], torch.exp(hist.last_cum[..., None] - hist.cum) * hist.dt, 0.0)
    size = hist.x.shape[1]
    xw = hist.x * weight.transpose(1, 2)[..., None]  # [B, HIST, H, P]
    xw = xw.view(batch, size, groups, -1).permute(0, 2, 3, 1).reshape(batch * groups, -1, size)  # [BG, RP, S]
    bs = hist.B.transpose(1, 2).reshape(batch * groups, size, dstate)  # [BG, S, N]
    h.mul_(decay[..., None, None])
    h.view(batch * groups, -1, dstate).baddbmm_(xw, bs)  # one pass over the state
    return h


def replay_state(
    ssm: Tensor,
    replay_x: Tensor,
    replay_B: Tensor,
    replay_dt: Tensor,
    replay_dA_cumsum: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
) -> Tensor:
    """Effective state (checkpoint + the pnat valid history tokens folded), writing nothing.
    Returns [B, H, P, N] fp32; zeros for padding rows."""
    hist = _History(replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, slots)
    return _fold(take_rows(ssm, slots, hist.valid), hist, hist.valid)


def mamba2_verify(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    replay_x: Tensor,
    replay_B: Tensor,
    replay_dt: Tensor,
    replay_dA_cumsum: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """Replay verify; see `mamba2_verify_ref`. x: [B, T, H, P]; dt: [B, T, H]; B, C: [B, T, G, N].
    Returns y: [B, T, H, P] in x's dtype."""
    if runs_triton(x):
        from hybridcache.ops.mamba2.triton_verify import mamba2_verify_triton

        return mamba2_verify_triton(x, dt, A, B, C, ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat,
                                    buf_idx, slots, D, dt_bias, dt_limit)
    batch, steps = x.shape[:2]
    size = replay_x.shape[2]
    check_steps(steps, size)
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    device = x.device
    hist = _History(replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, slots)
    valid, p, buf = hist.valid, hist.count, hist.buf
    fold = valid & (p + steps > size)

    h = _fold(take_rows(ssm, slots, valid), hist, fold)  # [B, H, P, N]
    put_rows(ssm, (slots,), h, fold)

    # new tokens' running sums continue the history's, or restart at 0 after a fold
    dtp = process_dt(dt, dt_bias, dt_limit)  # [B, T, H]
    base = torch.where(fold[:, None], 0.0, hist.last_cum)  # [B, H]
    cum_new = base[:, None] + torch.cumsum(dtp * A.float(), dim=1)  # [B, T, H]

    # sources: history [0, HIST) then the T new tokens; history counts only below p_eff
    p_eff = torch.where(fold, 0, p)
    src_cum = torch.cat([hist.cum, cum_new.transpose(1, 2)], dim=2)  # [B, H, L]
    src_dt = torch.cat([hist.dt, dtp.transpose(1, 2)], dim=2)
    src_x = torch.cat([hist.x, x.float()], dim=1).view(batch, -1, groups, reps, head_dim)  # [B, L, G, R, P]
    src_B = torch.cat([hist.B, B.float()], dim=1)  # [B, L, G, N]
    s = torch.arange(size + steps, device=device)
    t = torch.arange(steps, device=device)
    in_hist = (s[None, None, :] < p_eff[:, None, None]) & (s < size)
    in_new = (s >= size) & (s - size <= t[:, None])
    mask = (in_hist | in_new)[:, None]  # [B, 1, T, L]
    diff = cum_new.transpose(1, 2)[..., None] - src_cum[:, :, None, :]  # [B, H, T, L]
    weight = torch.exp(torch.where(mask, diff, -torch.inf)) * src_dt[:, :, None, :]
    Cf = C.float()
    cb = torch.einsum("btgn,blgn->bgtl", Cf, src_B)
    scores = cb[:, :, None] * weight.view(batch, groups, reps, steps, -1)  # [B, G, R, T, L]
    y = torch.einsum("bgrtl,blgrp->btgrp", scores, src_x)
    y_ckpt = torch.einsum("btgn,bgrpn->btgrp", Cf, h.view(batch, groups, reps, head_dim, dstate))
    y = y + y_ckpt * torch.exp(cum_new).view(batch, steps, groups, reps, 1)
    y = add_skip(y.reshape(batch, steps, heads, head_dim), x, D)

    # append at [p, p + T) of buffer b, or after a fold at [0, T) of buffer 1 - b
    target = torch.where(fold, 1 - buf, buf)[:, None]  # [B, 1]
    pos = torch.where(fold, 0, p)[:, None] + t  # [B, T]
    rows = slots[:, None]
    put_rows(replay_x, (rows, target, pos), x, valid)
    put_rows(replay_B, (rows, target, pos), B, valid)
    hidx = torch.arange(heads, device=device).view(1, 1, heads)
    idx = (rows[..., None], target[..., None], hidx, pos[..., None])  # -> [B, T, H]
    put_rows(replay_dt, idx, dtp, valid)
    put_rows(replay_dA_cumsum, idx, cum_new, valid)
    return y.to(x.dtype)
