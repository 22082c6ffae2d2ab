"""The gated delta rule over a short block of tokens in closed (WY) form; shared by prefill, decode and verify.

Per value head, state h [K, V]: `h_t = exp(g_t)·h_{t-1} + k_t·u_tᵀ`,
`u_t = β_t·(v_t − (exp(g_t)·h_{t-1})ᵀ·k_t)`, `o_t = h_tᵀ·q_t`.
With c the running sum of g inside the block and h0 the state before it:
  (I + A)·U = β·(V − exp(c)·K·h0),   A[t, s] = β_t·(k_t·k_s)·exp(c_t − c_s)  for s < t
  o_t = exp(c_t)·(q_t·h0) + Σ_{s≤t} exp(c_t − c_s)·(q_t·k_s)·u_s
  h_end = exp(c_L)·h0 + Σ_s exp(c_L − c_s)·k_s·u_sᵀ
The block only needs q·h0 and k·h0, so a caller may supply them without materialising h0 (replay).
"""
import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x * rsqrt(sum(x²) + eps)` over the last dim, as transformers' qwen3_next and fla do (not F.normalize)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, hv: int, scale: float | None, use_qk_l2norm_in_kernel: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K] -> fp32 [B, HV, T, K] (q scaled, both optionally normalised, key heads repeated)."""
    q, k = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    r = hv // k.shape[2]
    return (x.repeat_interleave(r, dim=2).transpose(1, 2) for x in (q, k))


def block_from_reads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    qh: torch.Tensor,
    kh: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [B, HV, L, K]; v, qh, kh [B, HV, L, V]; g, beta [B, HV, L] (all fp32).

    qh = q·h0 and kh = k·h0. Returns o [B, HV, L, V], u [B, HV, L, V], c [B, HV, L].
    """
    L = g.shape[-1]
    c = g.cumsum(-1)
    causal = torch.ones(L, L, dtype=torch.bool, device=g.device).tril()
    # masked to -inf before exp so that the upper triangle (positive exponents) never overflows
    decay = torch.where(causal, c[..., :, None] - c[..., None, :], float("-inf")).exp()
    A = (k @ k.transpose(-1, -2)) * decay * beta[..., None]
    ec = c.exp()[..., None]
    rhs = beta[..., None] * (v - ec * kh)
    u = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    o = ec * qh + ((q @ k.transpose(-1, -2)) * decay) @ u
    return o, u, c


def block(
    h0: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """h0 [B, HV, K, V] fp32; q, k [B, HV, L, K]; v [B, HV, L, V]; g, beta [B, HV, L].

    Returns o [B, HV, L, V] and the state after the block [B, HV, K, V].
    """
    L = q.shape[-2]
    reads = torch.cat([q, k], dim=-2) @ h0
    o, u, c = block_from_reads(q, k, v, g, beta, reads[..., :L, :], reads[..., L:, :])
    tail = (c[..., -1:] - c).exp()[..., None]
    h_end = torch.baddbmm(
        (h0 * c[..., -1].exp()[..., None, None]).flatten(0, 1),
        (k * tail).transpose(-1, -2).flatten(0, 1),
        u.flatten(0, 1),
    ).view_as(h0)
    return o, h_end
