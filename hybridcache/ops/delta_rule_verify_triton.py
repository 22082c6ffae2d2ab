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
# value columns for KDA and 16 for GDN (GDN at batch 64: 138 us against 149 with 32; KDA: 91 against 104
# with 16), halved (not below 8) while the grid has under 4 programs per SM (batch 1: 8 columns).
# A one-token verify (the speculative engine's step while its rows back off) is the decode kernel's work, and
# takes its tile: two warps and 32 value columns (at one warp KDA's 128 x 32 tile spills about 100 B a thread, at
# two none: benchmarks/kernel_registers.py). Timed on an H100 (tune_delta_rule.py's T = 1 rows, us at batch
# 64 / 16): GDN 32 x 2 warps 99.5 / 20.8 against 124.6 / 27.5 at 16 x 2 and 117.0 / 23.6 at 32 x 1; KDA 32 x 2
# 58.2 / 11.7, 32 x 1 58.9 / 10.3.
BLOCK_V = 32
GDN_BLOCK_V = 16
NUM_WARPS = 1
ONE_TOKEN_WARPS = 2
MIN_PROGRAMS_PER_SM = 4


def verify_warps(tokens: int) -> int:
    """Warps a verify program of `tokens` new tokens a row runs with by default."""
    return NUM_WARPS if tokens > 1 else ONE_TOKEN_WARPS


def gdn_block_v(tokens: int) -> int:
    """The widest value columns a GDN verify program of `tokens` new tokens a row takes by default."""
    return GDN_BLOCK_V if tokens > 1 else BLOCK_V


@triton.jit
def key_l2norm(x, KDA_FORM: tl.constexpr):
    """`x·rsqrt(Σx² + 1e-6)` (gdn/block.py) or `x / sqrt(Σx² + 1e-6)` (kda/block.py); padding lanes are 0."""
    if KDA_FORM:
        return x / tl.sqrt(tl.sum(x * x, 0) + 1e-6)
    return x * tl.rsqrt(tl.sum(x * x, 0) + 1e-6)


@triton.jit
def replay_row(slot_ptr, pnat_ptr, buf_ptr, row, s_pnat, s_buf, T: tl.constexpr, HIST: tl.constexpr):
    """A GDN verify program's row: (slot clamped to 0, valid, p clamped to [0, HIST], b, fold = p + T > HIST);
    a padding row (slot < 0) reads p = 0."""
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    p = tl.where(valid, tl.load(pnat_ptr + s * s_pnat), 0)
    p = tl.minimum(tl.maximum(p, 0), HIST)
    b = tl.load(buf_ptr + s * s_buf).to(tl.int64)
    return s, valid, p, b, p + T > HIST


@triton.jit
def pending_row(slot_ptr, n_ptr, row, s_n, P: tl.constexpr):
    """A KDA verify program's row: `slot_pending` of its slot."""
    return slot_pending(tl.load(slot_ptr + row).to(tl.int64), n_ptr, s_n, P)


@triton.jit
def slot_pending(slot, n_ptr, s_n, P: tl.constexpr):
    """(slot clamped to 0, valid, pend_n clamped to [0, P]) of a row's slot as stored; a padding slot (< 0) reads
    pend_n = 0."""
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    return s, valid, tl.minimum(tl.maximum(tl.where(valid, tl.load(n_ptr + s * s_n), 0), 0), P)


@triton.jit
def tile_pointers(ssm_ptr, s, head, vb, s_ss, s_sh, s_sk, s_sv, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr):
    """The [BK, BV] tile of ssm[s, head, :, value block vb]: (kk, k_ok, vv, v_ok, tile mask, its pointers)."""
    kk = tl.arange(0, BK)
    k_ok = kk < K
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < V
    tile = k_ok[:, None] & v_ok[None, :]
    return kk, k_ok, vv, v_ok, tile, ssm_ptr + s * s_ss + head * s_sh + kk[:, None] * s_sk + vv[None, :] * s_sv


@triton.jit
def state_tile(ssm_ptr, s, head, vb, valid, s_ss, s_sh, s_sk, s_sv, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr):
    """The program's [BK, BV] tile of ssm[s, head, :, value block vb]: (kk, k_ok, vv, v_ok, tile mask, its
    pointers, the tile in fp32: zeros where not valid)."""
    kk, k_ok, vv, v_ok, tile, ptrs = tile_pointers(ssm_ptr, s, head, vb, s_ss, s_sh, s_sk, s_sv, K, V, BK, BV)
    return kk, k_ok, vv, v_ok, tile, ptrs, tl.load(ptrs, mask=tile & valid, other=0.0).to(tl.float32)


def verify_tile_sizes(K: int, V: int, block_v: int | None, rows: int, device: torch.device,
                      widest: int = BLOCK_V) -> tuple[int, int]:
    """BK covers K (the norms and hᵀk need the whole key); BV = block_v, or `widest` halved down to 8 while
    `rows` (batch x value heads) x ⌈V / BV⌉ programs give under MIN_PROGRAMS_PER_SM per SM."""
    bv = min(block_v or widest, max(8, triton.next_power_of_2(V)))
    if block_v is None and device.type == "cuda":
        sms = num_sms(device)
        while bv > 8 and rows * triton.cdiv(V, bv) < MIN_PROGRAMS_PER_SM * sms:
            bv //= 2
    return max(16, triton.next_power_of_2(K)), bv
