"""Speculative verify with replay: outputs from checkpoint + valid history + new tokens, history append/fold.

No host sync. Every row folds its valid history into the checkpoint (the effective state), which is what
its new tokens start from; only rows with p + T > HIST write it back to ssm. New entries go to positions
(slot, buffer, position), one `RowScatter` shared by the four history roles:

    fold (p + T > HIST):  buffer 1 - b, positions [0, T),      G restarts at 0
    append:               buffer b,     positions [p, p + T),  G continues from G_last
"""
import torch

from ..delta_rule_common import gate_values, head_major
from ..slot_io import RowScatter, put_rows, read_rows
from ..triton_support import runs_triton
from .block import block_from_reads, prepare_qk, read_state
from .decode import RawGate
from .history import fold, read_history


def gdn_replay_state(
    ssm: torch.Tensor,
    replay_u: torch.Tensor,
    replay_k: torch.Tensor,
    replay_G: torch.Tensor,
    pnat: torch.Tensor,
    buf_idx: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """The effective state of each row, checkpoint plus its valid history; nothing is written.

    ssm [S, HV, K, V]; roles as in docs/layouts.md (one layer); slots [B]. Returns [B, HV, K, V] fp32
    (zeros for padding rows).
    """
    return fold(read_rows(ssm, slots), read_history(replay_u, replay_k, replay_G, pnat, buf_idx, slots))


def gdn_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    ssm: torch.Tensor,
    replay_u: torch.Tensor,
    replay_k: torch.Tensor,
    replay_G: torch.Tensor,
    replay_beta: torch.Tensor,
    pnat: torch.Tensor,
    buf_idx: torch.Tensor,
    slots: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    gate: RawGate | None = None,
) -> torch.Tensor:
    """Verify T tokens per row against checkpoint + history (docs/layouts.md, Gated DeltaNet).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; ssm [S, HV, K, V] fp32;
    replay_u [S, 2, HIST, HV, V]; replay_k [S, 2, HIST, H, K]; replay_G, replay_beta [S, 2, HV, HIST] fp32;
    pnat, buf_idx [S] int32 (read only); slots [B] int64, negative = padding.

    With p = pnat[slot], b = buf_idx[slot]: if p + T > HIST the p history tokens are folded into ssm and the
    new tokens go to [0, T) of buffer 1 - b, else to [p, p + T) of buffer b. Returns o [B, T, HV, V].
    With `gate` (g and beta None) the gate is computed from the projection's raw outputs (`gdn_gate`);
    replay_G and replay_beta get the same values as with g, beta given.
    On CUDA with triton this is one fused kernel (`delta_rule_verify_triton.gdn_verify_triton`), the gate
    included.
    """
    if runs_triton(q):
        from .triton_verify import gdn_verify_triton

        return gdn_verify_triton(q, k, v, g, beta, ssm, replay_u, replay_k, replay_G, replay_beta, pnat, buf_idx,
                                 slots, scale, use_qk_l2norm_in_kernel, gate=gate)
    g, beta = gate_values(g, beta, gate)
    T, hist_len = q.shape[1], replay_u.shape[2]
    assert T <= hist_len, f"a verify step of {T} tokens needs HIST >= {T}, have {hist_len}"
    valid = slots >= 0
    hist = read_history(replay_u, replay_k, replay_G, pnat, buf_idx, slots)
    h = fold(ssm.index_select(0, slots.clamp(min=0)), hist)  # [B, HV, K, V] effective state
    folds = valid & (hist.p + T > hist_len)
    put_rows(ssm, (slots,), h, folds)

    qn, kn = prepare_qk(q, k, scale, use_qk_l2norm_in_kernel)  # [B, H, T, K]
    # padding rows read a clamped slot: zero their reads so that stale NaNs never reach their outputs
    xh = torch.where(valid[:, None, None, None], read_state(torch.cat([qn, kn], dim=-2), h), 0.0)
    vt, gt, bt = head_major(v, g, beta)
    o, u, c = block_from_reads(qn, kn, vt, gt, bt, xh[..., :T, :], xh[..., T:, :])

    buf = torch.where(folds, 1 - hist.b, hist.b)
    rb = (slots.clamp(min=0) * 2 + buf)[:, None]  # [B, 1] row of the [S·2, ...] views
    pos = torch.where(folds, 0, hist.p)[:, None] + torch.arange(T, device=slots.device)  # [B, T]
    scatter = RowScatter((rb, pos), valid)
    scatter.put(replay_u.view(-1, *replay_u.shape[2:]), u.transpose(1, 2))  # [S·2, HIST, HV, V] <- [B, T, HV, V]
    scatter.put(replay_k.view(-1, *replay_k.shape[2:]), kn.transpose(1, 2))
    G_new = c + torch.where(folds[:, None], 0.0, hist.G_last)[..., None]  # [B, HV, T]
    for role, values in ((replay_G, G_new.transpose(1, 2)), (replay_beta, beta)):  # [B, T, HV]
        scatter.put(role.view(-1, *role.shape[2:]).transpose(1, 2), values)  # [S·2, HIST, HV] view
    return o.transpose(1, 2).to(v.dtype)
