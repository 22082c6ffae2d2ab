"""Reference Mamba2 (SSD) ops: plain per-token recurrence, per-row Python loops.

Per head, state h in R^{P x N}: h_t = exp(dt_t * A) h_{t-1} + dt_t x_t B_t^T, y_t = C_t h_t + D x_t,
with dt = clamp(softplus(dt_raw + dt_bias), dt_limit). Shapes follow mamba: state [B|S, H, P, N],
x [.., H, P], dt [.., H], B/C [.., G, N] (head h reads group h // (H // G)), A [H] (negative), D [H].
z-gating is the model's job. State arithmetic in fp32; outputs in x's dtype.

Replay verify roles (docs/layouts.md): replay_x [S, 2, HIST, H, P], replay_B [S, 2, HIST, G, N],
replay_dt [S, 2, H, HIST] (processed dt), replay_dA_cumsum [S, 2, H, HIST] (fp32 running sum of dt * A
from the checkpoint, inclusive of the token), pnat [S], buf_idx [S] (read only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

DtLimit = tuple[float, float]
NO_LIMIT: DtLimit = (0.0, float("inf"))


def _process_dt(dt: Tensor, dt_bias: Tensor | None, dt_limit: DtLimit = NO_LIMIT) -> Tensor:
    """softplus(dt + dt_bias) clamped to dt_limit, in fp32. dt: [..., H]; dt_bias: [H] or None."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    return F.softplus(dt).clamp(min=dt_limit[0], max=dt_limit[1])


def _heads_of_groups(t: Tensor, num_heads: int) -> Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H // G)."""
    groups = t.shape[-2]
    if num_heads % groups:
        raise ValueError(f"num_heads {num_heads} is not a multiple of ngroups {groups}")
    return t.repeat_interleave(num_heads // groups, dim=-2)


def _step(h: Tensor, x: Tensor, dt: Tensor, dA: Tensor, B: Tensor) -> Tensor:
    """One token. h: [H, P, N] fp32; x: [H, P]; dt: [H] processed; dA: [H] = dt * A; B: [H, N]."""
    decay = torch.exp(dA.float())[:, None, None]
    return decay * h + (dt[:, None, None] * x.float()[:, :, None]) * B.float()[:, None, :]


def _out(h: Tensor, x: Tensor, C: Tensor, D: Tensor | None) -> Tensor:
    """y = C h + D x (D [H] per head, or no skip). h: [H, P, N]; x: [H, P]; C: [H, N]. Returns [H, P] fp32."""
    y = (h * C.float()[:, None, :]).sum(-1)
    if D is None:
        return y
    return y + D.float()[:, None] * x.float()


def _token(h: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None) -> tuple[Tensor, Tensor]:
    """One new token (dt processed, B and C per head) -> (state after it, y [H, P] fp32)."""
    h = _step(h, x, dt, dt * A.float(), B)
    return h, _out(h, x, C, D)


def _inputs(
    x: Tensor, dt: Tensor, B: Tensor, C: Tensor, dt_bias: Tensor | None, dt_limit: DtLimit
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(zeroed output like x, processed dt, B per head, C per head) for x [..., H, P], B/C [..., G, N]."""
    heads = x.shape[-2]
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    return y, _process_dt(dt, dt_bias, dt_limit), _heads_of_groups(B, heads), _heads_of_groups(C, heads)


def mamba2_prefill_ref(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """Prefill of a flat variable-length batch, starting from ssm[slot] (or zeros), writing the final state.

    x: [N, H, P]; dt: [N, H] raw; B, C: [N, G, N_state]; ssm: [S, H, P, N_state] fp32 (written in place);
    slots: [B] (negative = padding, writes nothing); has_initial: [B] bool; cu_seqlens: [B + 1].
    Returns y: [N, H, P] in x's dtype.
    """
    y, dtp, Bh, Ch = _inputs(x, dt, B, C, dt_bias, dt_limit)
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        h = torch.zeros(ssm.shape[1:], dtype=torch.float32, device=x.device)
        if slot >= 0 and bool(has_initial[b]):
            h = ssm[slot].clone()
        for t in range(int(cu_seqlens[b]), int(cu_seqlens[b + 1])):
            h, y_t = _token(h, x[t], dtp[t], A, Bh[t], Ch[t], D)
            y[t] = y_t.to(x.dtype)
        if slot >= 0:
            ssm[slot] = h
    return y


def mamba2_decode_ref(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """One token per row (selective state update). x: [B, H, P]; dt: [B, H]; B, C: [B, G, N].
    Updates ssm[slot] in place; padding rows read zeros and write nothing. Returns y: [B, H, P].

    The same as a prefill of B one-token sequences, each starting from its slot's state."""
    batch = x.shape[0]
    has_initial = torch.ones(batch, dtype=torch.bool, device=x.device)
    cu_seqlens = torch.arange(batch + 1, device=x.device)
    return mamba2_prefill_ref(x, dt, A, B, C, ssm, slots, has_initial, cu_seqlens, D, dt_bias, dt_limit)


def replay_state_ref(
    ssm: Tensor,
    replay_x: Tensor,
    replay_B: Tensor,
    replay_dt: Tensor,
    replay_dA_cumsum: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
) -> Tensor:
    """Effective state: checkpoint with the pnat valid history tokens of the active buffer folded in.
    Returns [B, H, P, N] fp32 (zeros for padding rows); writes nothing."""
    heads = ssm.shape[1]
    out = torch.zeros((slots.shape[0], *ssm.shape[1:]), dtype=torch.float32, device=ssm.device)
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        if slot < 0:
            continue
        p, buf = int(pnat[slot]), int(buf_idx[slot])
        h = ssm[slot].clone()
        Bh = _heads_of_groups(replay_B[slot, buf], heads)
        cum = replay_dA_cumsum[slot, buf]  # [H, HIST]
        for s in range(p):
            dA = cum[:, s] - cum[:, s - 1] if s > 0 else cum[:, 0]
            h = _step(h, replay_x[slot, buf, s], replay_dt[slot, buf, :, s], dA, Bh[s])
        out[b] = h
    return out


def mamba2_verify_ref(
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
    """Replay verify of T tokens per row.

    x: [B, T, H, P]; dt: [B, T, H] raw; B, C: [B, T, G, N]. With p = pnat[slot], b = buf_idx[slot]:
    if p + T > HIST, fold the p history tokens into ssm[slot] and write the new tokens at [0, T) of
    buffer 1 - b (cumsum restarting at 0); else write them at [p, p + T) of buffer b (cumsum continuing
    from replay_dA_cumsum[.., p - 1]). Outputs come from the checkpoint, the history [0, p) and the new
    tokens. Returns y: [B, T, H, P] in x's dtype.
    """
    batch, steps, heads = x.shape[:3]
    hist = replay_x.shape[2]
    if steps > hist:
        raise ValueError(f"T={steps} exceeds the replay history length {hist}")
    y, dtp, Bh, Ch = _inputs(x, dt, B, C, dt_bias, dt_limit)
    one = slots.new_zeros(1)
    for b in range(batch):
        slot = int(slots[b])
        live = slot >= 0  # padding rows run from a zero state with no history and write nothing
        p, buf = (int(pnat[slot]), int(buf_idx[slot])) if live else (0, 0)
        h = replay_state_ref(ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, one + slot)[0]
        if p + steps > hist:
            ssm[slot] = h
            buf, start, cum = 1 - buf, 0, torch.zeros(heads, device=x.device)
        else:
            start = p
            cum = replay_dA_cumsum[slot, buf, :, p - 1].clone() if p > 0 else torch.zeros(heads, device=x.device)
        for t in range(steps):
            h, y_t = _token(h, x[b, t], dtp[b, t], A, Bh[b, t], Ch[b, t], D)
            y[b, t] = y_t.to(x.dtype)
            cum = cum + dtp[b, t] * A.float()
            if not live:
                continue
            replay_x[slot, buf, start + t] = x[b, t].to(replay_x.dtype)
            replay_B[slot, buf, start + t] = B[b, t].to(replay_B.dtype)
            replay_dt[slot, buf, :, start + t] = dtp[b, t].to(replay_dt.dtype)
            replay_dA_cumsum[slot, buf, :, start + t] = cum
    return y


def mamba2_accept_ref(
    pnat: Tensor, buf_idx: Tensor, slots: Tensor, num_tokens: int, num_valid: Tensor, hist: int
) -> None:
    """Accept rule, per row with v valid tokens: if p + T > HIST: buf_idx ^= 1, pnat = v; else pnat = p + v.

    The readable loop of `ops.replay_accept.replay_accept` (the one the fast path and the pool use)."""
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        if slot < 0:
            continue
        p, v = int(pnat[slot]), int(num_valid[b])
        if p + num_tokens > hist:
            buf_idx[slot] = 1 - int(buf_idx[slot])
            pnat[slot] = v
        else:
            pnat[slot] = p + v
