"""Inputs and checks the Gated DeltaNet and KDA op tests share (test_gdn / test_kda, test_gdn_replay /
test_kda_verify). Each test module passes its own op, reference and inputs; the decay shape is the
caller's (`g_tail`: (HV,) per value head for GDN, (H, K) per key channel for KDA)."""
from collections.abc import Callable, Sequence

import torch


def close(a, b, tol=2e-4):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def dtype_tol(dtype, tol=2e-4):
    """The output tolerance of a run in `dtype`."""
    return 2e-2 if dtype == torch.bfloat16 else tol


def delta_inputs(B, T, H, HV, K, V, g_tail, dtype=torch.float32, seed=0):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g (log-decay < 0) [B, T, *g_tail]; beta in (0, 1) [B, T, HV]."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(B, T, *g_tail, generator=gen)) * 0.5
    beta = torch.rand(B, T, HV, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, beta]


def check_chunk_varlen(chunk_fn, naive_fn, x, h0, cu, device, dtype, chunk):
    """The chunked op over a flat varlen batch x (on `device`) against the naive one on the CPU."""
    o, s = naive_fn(*x, initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    o2, s2 = chunk_fn(*(t.to(device) for t in x), initial_state=h0.to(device), output_final_state=True,
                      cu_seqlens=cu.to(device), use_qk_l2norm_in_kernel=True, chunk_size=chunk)
    assert o2.dtype == dtype and s2.dtype == torch.float32
    close(o2.cpu(), o, dtype_tol(dtype))
    close(s2.cpu(), s, 2e-4)


def check_split_prefill(chunk_fn, x, split):
    """Prefill in two parts, the second from the first's final state, equals one whole prefill."""
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=8)
    whole, s_whole = chunk_fn(*x, **kw)
    a, s_a = chunk_fn(*(t[:, :split] for t in x), **kw)
    b, s_b = chunk_fn(*(t[:, split:] for t in x), initial_state=s_a, **kw)
    close(torch.cat([a, b], 1), whole), close(s_b, s_whole)


def check_pool_prefill_and_decode(prefill, naive_prefill, decode, naive_decode,
                                  make_inputs: Callable[..., list], ssm_shape: Sequence[int], device, dtype):
    """Prefill then decode steps of T = 1, 3, 8 through slots (one padding row, one fresh start) against the
    references; slots 1 and 4 belong to no live row and stay untouched. make_inputs(B, T, dtype, seed)."""
    slots = torch.tensor([3, -1, 0, 2])
    has_initial = torch.tensor([True, True, False, True])
    lens = [6, 4, 9, 1]
    cu = torch.tensor([0] + lens).cumsum(0)
    ssm = torch.randn(5, *ssm_shape)
    q, k, v, g, beta = (x[0] for x in make_inputs(1, sum(lens), dtype, 5))
    ref = ssm.clone()
    o_ref = naive_prefill(q, k, v, g, beta, cu, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
    fast = ssm.to(device)
    o = prefill(*(x.to(device) for x in (q, k, v, g, beta, cu)), fast, slots.to(device),
                has_initial.to(device), use_qk_l2norm_in_kernel=True, chunk_size=4)
    live = torch.cat([torch.arange(cu[i], cu[i + 1]) for i in range(len(lens)) if slots[i] >= 0])
    tol = dtype_tol(dtype)
    # on CUDA a bf16 prefill runs fla's chunk kernels, which keep per-chunk states in bf16
    state_tol = tol if str(device).startswith("cuda") and dtype == torch.bfloat16 else 2e-4
    close(o.cpu()[live], o_ref[live], tol), close(fast.cpu(), ref, state_tol)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])  # slots no live row owns are untouched

    for T in (1, 3, 8):
        q, k, v, g, beta = make_inputs(4, T, dtype, T)
        o_ref = naive_decode(q, k, v, g, beta, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
        o = decode(*(x.to(device) for x in (q, k, v, g, beta)), fast, slots.to(device),
                   has_initial.to(device), use_qk_l2norm_in_kernel=True)
        close(o.cpu()[slots >= 0], o_ref[slots >= 0], tol), close(fast.cpu(), ref, state_tol)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])


# verify tests (test_gdn_replay, test_kda_verify)

VERIFY_SLOTS = [4, -1, 0, 2, 5]  # slots 1 and 3 belong to no live row
SEQ_SLOTS = [2, -1, 0, 5, 3]


def check_verify_step(o, o_ref, fast: dict, ref: dict, before: dict, roles, slots, out_tol, role_tol):
    """Fast verify against the reference: outputs of live rows, every role (role_tol(r)), and the slots of
    no live row (1 and 3) untouched bit for bit."""
    live = slots >= 0
    close(o.cpu()[live], o_ref[live], out_tol)
    for r in roles:
        close(fast[r].cpu(), ref[r], role_tol(r))
    for r in roles:
        assert torch.equal(fast[r].cpu()[[1, 3]], before[r][[1, 3]])


def live_states(ssm, slots) -> tuple[list[int], dict]:
    """The live rows of `slots` and each one's starting state [1, ...] fp32 on the CPU."""
    live = [i for i, s in enumerate(slots.tolist()) if s >= 0]
    return live, {i: ssm[slots[i]].cpu().float().clone()[None] for i in live}


def check_accepted_prefix(o, x, num_valid, live, state: dict, naive_seq, tol=2e-4):
    """Each live row's first v outputs equal the sequence reference fed only those v tokens from its state
    (advanced in place), within `tol`."""
    for i in live:
        n = int(num_valid[i])
        o_seq, state[i] = naive_seq(*(t[i:i + 1, :n] for t in x), initial_state=state[i],
                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
        close(o[i, :n], o_seq[0], tol)


def check_effective_states(eff, live, state: dict):
    for i in live:
        close(eff[i], state[i][0])


def check_state_fn(fast_fn, naive_fn, args):
    """An effective-state function against its reference; the padding row (slot -1) reads zeros."""
    slots = torch.tensor([5, 0, -1, 3])
    eff = fast_fn(*args, slots)
    close(eff, naive_fn(*args, slots))
    assert torch.equal(eff[2], torch.zeros_like(eff[2]))
