"""Speculative verify of the gated delta rule as fused Triton kernels, reading and writing the pool's slots in
place (no gather, no scatter, no host sync, shapes known on the host: graph-capturable). The kernels live
with their ops (`gdn/triton_verify.py`, `kda/triton_verify.py`); this module holds what they share (the key
norm, the tiling) and the work split they follow.

Same contracts as `gdn.replay.gdn_verify` (Gated DeltaNet, replay history) and `kda.verify.kda_verify` (KDA,
pending drafts); docs/layouts.md has the roles. Per value head, state h [K, V] fp32, one new token:
  h = exp(g)·h          (g one scalar per value head for GDN, one per key row for KDA)
  u = β·(v − hᵀk);  h = h + k·uᵀ;  o = hᵀ(q·scale)
which is the closed (WY) form of `gdn/block.py`: there u_t = β_t·(v_t − (exp(g_t)·h_{t−1})ᵀ·k_t), the same u.

Work split. One program takes one (batch row, value head, value block) and holds the [BK, BV] fp32 tile of
its state in registers; value columns are independent in the recurrence, so blocks never talk.
- GDN: tile = exp(G_last)·ssm[slot] + Σ_{j<p} k_j·(exp(G_last − G_j)·u_j)ᵀ, read from buffer b of the
  history one entry at a time (rank-1 updates over j < p, so nothing at or past p is read);
  stored back to ssm only when the row folds (p + T > HIST). Then the T new tokens; each writes its u slice;
  the V-block-0 program writes G (running from G_last, or from 0 after a fold) and β of its value head, and
  the V-block-0 program of the first value head of a key group writes the normalised key.
  No program reads what another writes: reads are [0, p) of buffer b, writes [p, p + T) of buffer b or
  [0, T) of buffer 1 − b.
- KDA: tile = ssm[slot], then the pend_n accepted drafts one by one, then the T new tokens; stored to ssm
  after new token 0. The new drafts (tokens 1..T−1) land where the old ones are read, [0, T − 1) against
  [0, pend_n), and pend_k, pend_g, pend_beta are shared by all value blocks of a head: no program of this
  launch may write them. A second, small launch (one program per row and head, after the first has read
  everything) writes pend_*[slot, :T−1]; it needs nothing from the first (the keys are normalised again).
Parallel form (`parallel=True`; the sequential form stays the default until the H200 says otherwise).
The new tokens' two reductions over K are taken from the tile as it stands before them, h, so they do not
wait on one another: with γ_t = Π_{s≤t} exp(g_s) and d_{s→t} = Π_{s<m≤t} exp(g_m)·k_s,
  w_t = hᵀ(γ_t·k_t),  u_t = β_t·(v_t − w_t − Σ_{s<t} (d_{s→t}·k_t)·u_s)
  o_t = hᵀ(γ_t·q_t) + Σ_{s≤t} (d_{s→t}·q_t)·u_s      (d_{t→t} = k_t)
(the sequential recurrence unrolled; `parallel_token`). The d rows [T, BK] and u rows [T, BV] are small; the
tile is read twice a token and written not at all (KDA forms the state after token 0 once: exp(g_0)·h +
k_0·u_0ᵀ). Products of gates only, never a quotient: no overflow however strong the decay. GDN's parallel
form also folds its history 16 entries a product on the tensor cores (tf32x3: three tf32 products, about
1e-6 relative), not one rank-1 update an entry.
Padding rows (slot < 0) load no state, store nothing and output zeros; every pool load is masked, never
multiplied by zero, so NaNs in unused slots or past p / pend_n cannot leak.
GDN's inputs are read through their strides (q, k, v with a unit last stride: column slices of the conv
output are read in place); with a raw gate (`gate=RawGate(a, b, A_log, dt_bias)`) the kernel reads a, b
where g, beta would be and computes them per token (`delta_rule_triton.gdn_raw_gate`), writing the same G and
β history. KDA likewise with `gate=KDARawGate(g_raw, b, A_log, dt_bias)` (`delta_rule_triton.kda_raw_gate`):
both of its launches compute g and β from g_raw and b, so pend_g and pend_beta hold the same values as with g,
β given.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_support import num_sms

# Tiling measured on the H200 (benchmarks/tune_delta_rule.py, K = V = 128, T = 4): one warp per program, 32
# value columns, halved (not below 8) while the grid has under 4 programs per SM (batch 1: 8 columns).
BLOCK_V = 32
NUM_WARPS = 1
MIN_PROGRAMS_PER_SM = 4
PARALLEL = False  # the form a call that names none takes (benchmarks switch it: benchmarks/verify_form.py)


@triton.jit
def key_l2norm(x, KDA_FORM: tl.constexpr):
    """`x·rsqrt(Σx² + 1e-6)` (gdn/block.py) or `x / sqrt(Σx² + 1e-6)` (kda/block.py); padding lanes are 0."""
    if KDA_FORM:
        return x / tl.sqrt(tl.sum(x * x, 0) + 1e-6)
    return x * tl.rsqrt(tl.sum(x * x, 0) + 1e-6)


@triton.jit
def parallel_token(h, D, U, t, rows, k_t, q_t, a_t, gk_t, gq_t, v_t, b_t):
    """One new token t of the parallel form: h [BK, BV] the tile before the new tokens; D [TP, BK] rows
    s < t hold d_{s→t−1}, U [TP, BV] rows s < t hold u_s (zero past); a_t the token's decay (a scalar, or
    [1, BK] per key), gk_t = γ_t·k_t and gq_t = γ_t·q_t [BK]. Returns u_t, o_t [BV] and D, U with row t."""
    w = tl.sum(h * gk_t[:, None], 0)
    ob = tl.sum(h * gq_t[:, None], 0)
    D = D * a_t  # rows s < t: d_{s→t}
    u = b_t * (v_t - w - tl.sum(tl.sum(D * k_t[None, :], 1)[:, None] * U, 0))
    mine = (rows == t)[:, None]
    U = tl.where(mine, u[None, :], U)
    D = tl.where(mine, k_t[None, :], D)
    o = ob + tl.sum(tl.sum(D * q_t[None, :], 1)[:, None] * U, 0)
    return u, o, D, U


def verify_tile_sizes(K: int, V: int, block_v: int | None, rows: int, device: torch.device) -> tuple[int, int]:
    """BK covers K (the norms and hᵀk need the whole key); BV = block_v, or BLOCK_V halved down to 8 while
    `rows` (batch x value heads) x ⌈V / BV⌉ programs give under MIN_PROGRAMS_PER_SM per SM."""
    bv = min(block_v or BLOCK_V, max(8, triton.next_power_of_2(V)))
    if block_v is None and device.type == "cuda":
        sms = num_sms(device)
        while bv > 8 and rows * triton.cdiv(V, bv) < MIN_PROGRAMS_PER_SM * sms:
            bv //= 2
    return max(16, triton.next_power_of_2(K)), bv
