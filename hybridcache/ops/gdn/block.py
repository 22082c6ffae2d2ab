"""The gated delta rule over a short block of tokens in closed (WY) form; shared by prefill, decode and verify.

Per value head, state h [K, V]: `h_t = exp(g_t)·h_{t-1} + k_t·u_tᵀ`,
`u_t = β_t·(v_t − (exp(g_t)·h_{t-1})ᵀ·k_t)`, `o_t = h_tᵀ·q_t`.
With c the running sum of g inside the block and h0 the state before it:
  (I + A)·U = β·(V − exp(c)·K·h0),   A[t, s] = β_t·(k_t·k_s)·exp(c_t − c_s)  for s < t
  o_t = exp(c_t)·(q_t·h0) + Σ_{s≤t} exp(c_t − c_s)·(q_t·k_s)·u_s
  h_end = exp(c_L)·h0 + Σ_s exp(c_L − c_s)·k_s·u_sᵀ
The block only needs q·h0 and k·h0, so a caller may supply them (replay reads them from the effective state).
q and k stay at key-head granularity (H); value head hv reads key head hv // (HV / H) by broadcasting.
"""
import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x * rsqrt(sum(x²) + eps)` over the last dim, as transformers' qwen3_next and fla do (not F.normalize)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, scale: float | None, use_qk_l2norm_in_kernel: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K] -> fp32 [B, H, T, K] (q scaled, both optionally normalised; key heads not repeated)."""
    qk = torch.stack([q, k]).float()  # one pass normalises both
    if use_qk_l2norm_in_kernel:
        qk = l2norm(qk)
    qk = qk.transpose(2, 3)
    return qk[0] * (q.shape[-1] ** -0.5 if scale is None else scale), qk[1]


def per_value_head(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[B, H, M, N] -> [B·HV, M, N] (a copy; value head hv reads key head hv // (HV / H))."""
    B, H, M, N = x.shape
    return x[:, :, None].expand(B, H, hv // H, M, N).reshape(B * hv, M, N)


def read_state(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """x [B, H, M, K] (key heads) against states h [B, HV, K, V] -> x·h [B, HV, M, V]."""
    B, hv = h.shape[:2]
    return torch.bmm(per_value_head(x, hv), h.flatten(0, 1)).view(B, hv, x.shape[2], h.shape[-1])


def block_from_reads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    qh: torch.Tensor,
    kh: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [B, H, L, K]; v, qh, kh [B, HV, L, V]; g, beta [B, HV, L] (all fp32, HV a multiple of H).

    qh = q·h0 and kh = k·h0. Returns o [B, HV, L, V], u [B, HV, L, V], c [B, HV, L].
    """
    B, hv, L = g.shape
    H = k.shape[1]
    c = g.cumsum(-1)
    causal = torch.ones(L, L, dtype=torch.bool, device=g.device).tril()
    # masked to -inf before exp so that the upper triangle (positive exponents) never overflows
    decay = torch.where(causal, c[..., :, None] - c[..., None, :], float("-inf")).exp()
    dots = (torch.cat([k, q], dim=-2) @ k.transpose(-1, -2)).view(B, H, 1, 2, L, L)  # k·k, q·k per key head
    scores = dots * decay.view(B, H, hv // H, 1, L, L)  # [B, H, HV / H, 2, L, L]
    A = scores[:, :, :, 0].reshape(B, hv, L, L) * beta[..., None]
    ec = c.exp()[..., None]
    rhs = beta[..., None] * (v - ec * kh)
    u = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    o = ec * qh + scores[:, :, :, 1].reshape(B, hv, L, L) @ u
    return o, u, c


def block(
    h0: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """h0 [B, HV, K, V] fp32; q, k [B, H, L, K]; v [B, HV, L, V]; g, beta [B, HV, L].

    Returns o [B, HV, L, V] and the state after the block [B, HV, K, V].
    """
    B, hv, L = g.shape
    H = k.shape[1]
    reads = read_state(torch.cat([q, k], dim=-2), h0)
    o, u, c = block_from_reads(q, k, v, g, beta, reads[..., :L, :], reads[..., L:, :])
    tail = (c[..., -1:] - c).exp()  # [B, HV, L]
    kt = (k[:, :, None] * tail.view(B, H, hv // H, L, 1)).flatten(0, 2)  # [B·HV, L, K]
    h_end = torch.baddbmm((h0 * c[..., -1].exp()[..., None, None]).flatten(0, 1), kt.transpose(-1, -2),
                          u.flatten(0, 1)).view_as(h0)
    return o, h_end
