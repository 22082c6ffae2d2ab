"""KDA over a short block of tokens in closed (WY) form; shared by prefill, decode and verify.

Per head, state h [K, V] with a per-key-channel log-decay g_t [K]:
`h_t = diag(exp(g_t))·h_{t-1} + k_t·u_tᵀ`, `u_t = β_t·(v_t − (diag(exp(g_t))·h_{t-1})ᵀ·k_t)`,
`o_t = h_tᵀ·q_t`.
With c the running sum of g inside the block (per channel) and h0 the state before it:
  (I + A)·U = β·(V − (k ⊙ exp(c))·h0),   A[t, s] = β_t·Σ_d k_td·k_sd·exp(c_td − c_sd)  for s < t
  o_t = (q_t ⊙ exp(c_t))·h0 + Σ_{s≤t} (Σ_d q_td·k_sd·exp(c_td − c_sd))·u_s
  h_a = diag(exp(c_a))·h0 + Σ_{s≤a} (k_s ⊙ exp(c_a − c_s))·u_sᵀ
"""
import torch


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x²) + eps)` over the last dim, as transformers' kimi_linear does (fla's Triton form)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, scale: float | None, use_qk_l2norm_in_kernel: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K] -> fp32 [B, H, T, K], optionally normalised, q scaled."""
    q, k = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    return q.transpose(1, 2), k.transpose(1, 2)


def block(
    h0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    at: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h0 [B, H, K, V] fp32; q, k, g [B, H, L, K]; v [B, H, L, V]; beta [B, H, L] (fp32, q scaled).

    Returns o [B, H, L, V] and the state after token `at` of the block [B, H, K, V].
    """
    L = g.shape[-2]
    a = at % L
    c = g.cumsum(-2)
    causal = torch.ones(L, L, dtype=torch.bool, device=g.device).tril()
    # [B, H, L(t), L(s), K]; masked to -inf before exp so that s > t never overflows
    decay = torch.where(causal[..., None], c[..., :, None, :] - c[..., None, :, :], float("-inf")).exp()
    kd = k[..., None, :, :] * decay
    A = (kd * k[..., :, None, :]).sum(-1) * beta[..., None]
    qk = (kd * q[..., :, None, :]).sum(-1)
    ec = c.exp()
    reads = torch.cat([k * ec, q * ec], dim=-2) @ h0
    rhs = beta[..., None] * (v - reads[..., :L, :])
    u = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    o = reads[..., L:, :] + qk @ u
    upto = (torch.arange(L, device=g.device) <= a)[:, None]
    tail = torch.where(upto, c[..., a : a + 1, :] - c, float("-inf")).exp()
    h = torch.baddbmm(
        (h0 * ec[..., a, :, None]).flatten(0, 1), (k * tail).transpose(-1, -2).flatten(0, 1), u.flatten(0, 1)
    ).view_as(h0)
    return o, h
