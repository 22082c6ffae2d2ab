"""Token choice for a whole step on the device: greedy, temperature, top-k, top-p and draft rejection for
every row at once, with no host sync. `sampler.choose` is the per-request reference it must agree with.

Random draws are counter based: a row's uniform for (its seed, the output position, a stream) is a hash,
so a row draws the same numbers whatever its batch, and a step that runs again (after a fault, a
suspension or a re-prefill) draws them again. There is no generator state to save or restore.

The argmax is torch's. A one-launch Triton argmax was tried and removed (in git at cf476ba): 8.6 us in the step
against torch's reduce kernel 10.4-10.5 us (both under PDL, waits included), but H100 batch-1 graph steps were even:
replay kimi_linear 0.6009 ms against 0.6011 (1,567 against 1,568 tok/s), qwen3_next 0.7821 against 0.7814 (1,220
against 1,224).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
ACCEPT_STREAM, TOKEN_STREAM = 0, 1


@dataclass(frozen=True)
class RowParams:
    """Per row of a step, on the device: temperature [R] fp32 (0 = greedy), top_k [R] int64 (0 = all),
    top_p [R] fp32, seed [R] int64 (two's complement of a 64-bit seed), position [R] int64 (tokens the
    row generated before this step), drafts [R, T - 1] int64 (padded), num_drafts [R] int64."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    position: torch.Tensor
    drafts: torch.Tensor
    num_drafts: torch.Tensor

    @classmethod
    def upload(cls, temperature: list[float], top_k: list[int], top_p: list[float], seed: list[int],
               position: list[int], drafts: list[list[int]], width: int, device: torch.device) -> "RowParams":
        """From per-row host values (each row's drafts, padded here to `width`) in one host-to-device copy:
        the floats travel as their fp32 bit patterns inside the int64 block."""
        R = len(seed)
        block = np.zeros((6 + width, R), dtype=np.int64)
        block[:2] = np.array([temperature, top_p], dtype=np.float32).reshape(2, R).view(np.int32)
        block[2:6] = np.array([top_k, seed, position, [len(d) for d in drafts]], dtype=np.int64).reshape(4, R)
        for i, d in enumerate(drafts):
            block[6 : 6 + len(d), i] = d
        dev = torch.from_numpy(block).to(device, non_blocking=True)
        floats = dev[:2].to(torch.int32).view(torch.float32)
        return cls(floats[0], dev[2], floats[1], dev[3], dev[4], dev[6:].T, dev[5])


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 values in [0, 2^32); products stay below 2^59 (no overflow)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK32
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, counter: torch.Tensor, stream: int) -> torch.Tensor:
    """U[0, 1) fp32 with 24 random bits for each (seed, counter, stream). seed [R]; counter [R, ...] int64."""
    seed = seed.reshape(seed.shape + (1,) * (counter.dim() - 1))
    h = _mix32((counter & _MASK32) ^ (stream * 0x9E3779B9 & _MASK32))
    h = _mix32(h ^ ((seed >> 32) & _MASK32))
    h = _mix32(h ^ (seed & _MASK32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, T, V] -> probabilities [R, T, V] fp32 after each row's temperature, top-k and top-p (the
    likeliest token always stays). Greedy rows (temperature 0) get temperature 1 here; they never draw."""
    V = logits.shape[-1]
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled, order = (logits.float() / t[:, None, None]).sort(-1, descending=True)
    rank = torch.arange(V, device=logits.device)
    k = torch.where(top_k > 0, top_k, V)
    scaled = scaled.masked_fill(rank >= k[:, None, None], float("-inf"))
    p = scaled.softmax(-1)
    before = p.cumsum(-1) - p  # mass strictly ahead of each token
    p = p.masked_fill((before >= top_p[:, None, None]) & (rank > 0), 0.0)
    p = p / p.sum(-1, keepdim=True)
    return torch.zeros_like(p).scatter(-1, order, p)


def sample(logits: torch.Tensor, rows: RowParams, all_greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, T, V] for the positions that predict each draft and the one after.

    Returns tokens [R, T] (the accepted drafts, then one new token, then padding) and counts [R] in
    1..num_drafts + 1. Greedy rows accept a draft equal to the argmax; the others keep draft `d` with
    probability p(d) and, at the first rejection, draw from p with `d` removed (plain sampling's
    distribution, exactly); when every draft passes, the new token comes from the last position.
    `all_greedy` (known on the host): every row is greedy, `sample_greedy` decides (no probabilities).
    """
    R, T, V = logits.shape
    device = logits.device
    steps = torch.arange(T - 1, device=device)
    if all_greedy:
        return sample_greedy(logits, torch.where(steps < rows.num_drafts[:, None], rows.drafts, -1))
    greedy = rows.temperature == 0
    probs = filtered_probs(logits, rows.temperature, rows.top_k, rows.top_p)
    best = logits.argmax(-1)  # [R, T]
    drafts = rows.drafts
    if T > 1:
        p_draft = probs[:, :-1].gather(-1, drafts[..., None])[..., 0]
        u = uniform(rows.seed, rows.position[:, None] + steps, ACCEPT_STREAM)
        ok = torch.where(greedy[:, None], best[:, :-1] == drafts, u < p_draft)
        ok &= steps < rows.num_drafts[:, None]
        accepted = ok.long().cumprod(-1).sum(-1)  # leading accepted drafts
    else:
        accepted = torch.zeros(R, dtype=torch.long, device=device)
    at = torch.arange(R, device=device)
    token = torch.where(greedy, best[at, accepted], _draw(probs[at, accepted], rows, accepted, T))
    tokens = torch.cat([drafts, drafts.new_zeros(R, 1)], 1) if T > 1 else token.new_zeros(R, 1)
    tokens = tokens.scatter(1, accepted[:, None], token[:, None])
    return tokens, accepted + 1


def sample_greedy(logits: torch.Tensor, proposed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` for rows that are all greedy, in four launches: logits [R, T, V]; proposed [R, T - 1] int64,
    each row's drafts then -1 (no draft). Returns tokens [R, T] and counts [R] as `sample` does (a greedy row
    accepts exactly the leading drafts equal to the argmax, so its tokens are the argmax at positions
    0..accepted; past them the padding differs from `sample`'s and is never read)."""
    best = logits.argmax(-1)  # [R, T]
    if logits.shape[1] == 1:
        return best, torch.ones_like(best[:, 0])
    accepted = (best[:, :-1] == proposed).cumprod(-1).sum(-1)  # leading accepted drafts
    return best, accepted + 1


def greedy_verify_choice(logits: torch.Tensor, ids: torch.Tensor,
                         proposed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_greedy` in a form a CUDA graph can hold: logits [R, T, V]; ids [R, T] the fed tokens (each
    row's last token, then its drafts, padded); proposed [R] int64 the row's real drafts (the rest padding,
    never accepted). Returns choice [R, 2 + T] int64 (the count, the proposed drafts, then `sample_greedy`'s
    tokens: one block to copy back) and the counts again as [R] int32 (what the state modules and the
    chained lengths take)."""
    steps = torch.arange(ids.shape[1] - 1, device=ids.device)
    best, counts = sample_greedy(logits, torch.where(steps < proposed[:, None], ids[:, 1:], -1))
    return packed_choice(best, counts, proposed)


def packed_choice(tokens: torch.Tensor, counts: torch.Tensor,
                  proposed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [R, T], counts [R], proposed [R] (int64) -> choice [R, 2 + T] int64 (count, proposed, tokens:
    one block to copy back) and counts [R] int32."""
    return torch.cat([counts[:, None], proposed[:, None], tokens], 1), counts.to(torch.int32)


def _draw(p: torch.Tensor, rows: RowParams, accepted: torch.Tensor, T: int) -> torch.Tensor:
    """One token per row from p [R, V] — or, where the row rejected a draft, from p without it."""
    V = p.shape[-1]
    if T > 1:
        rejected = accepted < rows.num_drafts
        d = rows.drafts.gather(1, accepted.clamp(max=T - 2)[:, None])
        residual = p.scatter(-1, d, 0.0)
        mass = residual.sum(-1, keepdim=True)
        p = torch.where(rejected[:, None] & (mass > 0), residual / mass.clamp(min=1e-30), p)
    u = uniform(rows.seed, rows.position + accepted, TOKEN_STREAM)
    cdf = p.cumsum(-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=V - 1)
