"""Speculative verify with replay: outputs from checkpoint + valid history + new tokens, history append/fold."""
import torch

from .block import block_from_reads, prepare_qk
from .history import fold, read_history
from .pool_io import put_last, put_tokens, read_rows


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
    g: torch.Tensor,
    beta: torch.Tensor,
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
) -> torch.Tensor:
    """Verify T tokens per row against checkpoint + history (docs/layouts.md, Gated DeltaNet).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; ssm [S, HV, K, V] fp32;
    replay_u [S, 2, HIST, HV, V]; replay_k [S, 2, HIST, H, K]; replay_G, replay_beta [S, 2, HV, HIST] fp32;
    pnat, buf_idx [S] int32 (read only); slots [B] int64, negative = padding.

    With p = pnat[slot], b = buf_idx[slot]: if p + T > HIST the p history tokens are folded into ssm and the
    new tokens go to [0, T) of buffer 1 - b, else to [p, p + T) of buffer b. Returns o [B, T, HV, V].
    """
    B, T, hv = q.shape[0], q.shape[1], v.shape[2]
    assert T <= replay_u.shape[2], f"a verify step of {T} tokens needs HIST >= {T}, have {replay_u.shape[2]}"
    qn, kn = prepare_qk(q, k, hv, scale, use_qk_l2norm_in_kernel)
    hist = read_history(replay_u, replay_k, replay_G, pnat, buf_idx, slots)
    valid = slots >= 0
    # the checkpoint is read once, by the product below; padding rows are zeroed after it (cheaper than
    # zeroing their state, and NaN-safe)
    h = ssm.index_select(0, slots.clamp(min=0)).float()
    x = torch.cat([qn, kn], dim=-2)
    xh = torch.where(valid[:, None, None, None], x @ h, 0.0)
    # x·h_eff without materialising h_eff: the checkpoint read plus the history's rank-p correction
    xh = torch.baddbmm(
        xh.flatten(0, 1) * hist.G_last.exp().flatten(0, 1)[:, None, None],
        ((x @ hist.keys.transpose(-1, -2)) * hist.weight[:, :, None, :]).flatten(0, 1),
        hist.u.flatten(0, 1),
    ).view(B, hv, 2 * T, -1)
    vt, gt, bt = (y.float().transpose(1, 2) for y in (v, g, beta))
    o, u, c = block_from_reads(qn, kn, vt, gt, bt, xh[..., :T, :], xh[..., T:, :])

    hist_len = replay_u.shape[2]
    folds = hist.p + T > hist_len
    masks = torch.stack([valid, valid & folds]).cpu()  # the one host sync: which rows write, which fold
    rows, frows = (m.nonzero().squeeze(1).to(slots.device) for m in masks)

    # flat positions of the T new entries of each writing row: (slot, buffer, position)
    buf = torch.where(folds, 1 - hist.b, hist.b)
    pos = torch.where(folds, 0, hist.p)[:, None] + torch.arange(T, device=slots.device)
    at = ((slots.clamp(min=0) * 2 + buf)[:, None] * hist_len + pos).index_select(0, rows)  # [R, T]
    G_new = c + torch.where(folds[:, None], 0.0, hist.G_last)[..., None]
    r = hv // k.shape[2]
    put_tokens(replay_u, at, u.index_select(0, rows).transpose(1, 2))
    put_tokens(replay_k, at, kn.index_select(0, rows)[:, ::r].transpose(1, 2))
    put_last(replay_G, at, G_new.index_select(0, rows))
    put_last(replay_beta, at, bt.index_select(0, rows))
    if frows.numel():
        folded = fold(h[frows], type(hist)(*(t[frows] for t in hist)))
        ssm.index_copy_(0, slots.index_select(0, frows), folded.to(ssm.dtype))
    return o.transpose(1, 2).to(v.dtype)
