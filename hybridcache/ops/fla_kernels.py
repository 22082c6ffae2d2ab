"""flash-linear-attention's chunk kernels for prefill: the one module that imports `fla`, lazily.

fla-core 0.6.0 (MIT), facts relied on (read from its source):

- `fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
  output_final_state=False, use_qk_l2norm_in_kernel=False, ..., cu_seqlens=None, cu_seqlens_cpu=None, ...)`:
  q, k [B, T, H, K]; v [B, T, HV, V] (HV a multiple of H, value head hv reads key head hv // (HV / H));
  g [B, T, HV] log-decay (the gate is applied in-kernel only with `use_gate_in_kernel=True`, not used here);
  beta [B, T, HV] after the sigmoid; `use_qk_l2norm_in_kernel` normalises q and k as x·rsqrt(Σx² + 1e-6).
  Note the positional order: `use_qk_l2norm_in_kernel` comes before `cu_seqlens` (ours is the other way
  round), so everything past `beta` is passed by keyword. `chunk_size` (a kwarg) must be 16, 32 or 64.
- `fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, ..., cu_seqlens=None, ...)`: g [B, T, HV, K] is
  the per-channel log-decay when `use_gate_in_kernel=False` (our `kda_gate` output); `initial_state`
  must be fp32 (asserted); K <= 256; `chunk_size` 32 or 64.
- `fla.ops.simple_gla.chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
  output_final_state=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None)`: one log-gate per
  head g [B, T, H]; q, k, v share H; `o_t = scale·S_tᵀ q_t` with `S_t = exp(g_t)·S_{t-1} + k_t v_tᵀ`
  (inclusive of token t); with `state_v_first=True` states are [N, H, V, K].
- All three: with `cu_seqlens [N+1]` the batch must be flat (B = 1, else ValueError) and states are
  [N, HV, K, V]; final states come back fp32 whatever the inputs; outputs come back in q's dtype; a
  zero-length sequence returns its initial state. Inputs are made contiguous inside (`input_guard`).
  Intermediate per-chunk states and the WY terms are kept in the input dtype (bf16 inputs: bf16), and
  on sm80+ Triton runs fp32 `tl.dot` in TF32 (fla sets no input precision).
- cu_seqlens may be int32 or int64 (the kernels load it and cast). fla reads it on the host while
  preparing chunk indices (`prepare_chunk_indices` -> `repeat_interleave` over device counts). That helper
  (and `prepare_chunk_offsets`) is memoised by the *identity* of the cu_seqlens tensor (`tensor_cache`,
  which holds a reference, so an id is never reused): the layers of one step share one tensor and so one
  host read. The contract this puts on callers: a cu_seqlens tensor is never rewritten in place (the
  engine uploads a new one each step).
- `chunk_simple_gla` is run here through its parts (`simple_gla_forward`) rather than whole: its state
  pass (`common.chunk_h.chunk_fwd_h`) reads `split_offsets[-1].item()` on every call only to size the
  per-chunk states, a host sync per Mamba2 layer. With the chunk size as the split size that count is the
  number of chunks, `len(chunk_indices)`, already on the host. The parts (fla-core 0.6.0): the chunk-local
  cumsum of g scaled by 1/ln 2 (the kernels use exp2), `chunk_fwd_kernel_h` (autotuned; it takes the
  per-sequence chunk offsets and writes h [1, NS, H, V, K] in k's dtype and the fp32 final states), then
  `chunk_fwd_o`.
- The ops go through fla's backend dispatch, which prefers the optional `flash_qla` / `flash_kda`
  packages when installed; with neither installed (our images) fla's Triton kernels run.
- `import fla.ops...` works without a GPU (fla warns and falls back to a 'cpu' platform), and the three
  kernels run on CPU tensors in triton 3.6's interpreter given two test-only shims (autotuner
  benchmarker, loop indices) in fp32; the interpreter's bf16 `tl.dot` is wrong (tests/ops/test_prefill_fla.py).
"""
from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor

from .triton_support import HAS_TRITON, triton_testable

MAX_KEY_DIM = 256  # fla's delta-rule kernels assert K <= 256


class FlaOps(NamedTuple):
    """fla's chunk functions (tests swap in stand-ins with the same keywords)."""

    chunk_gated_delta_rule: Callable[..., tuple[Tensor, Tensor | None]]
    chunk_kda: Callable[..., tuple[Tensor, Tensor | None]]
    chunk_simple_gla: Callable[..., tuple[Tensor, Tensor | None]]


@cache
def fla_ops() -> FlaOps | None:
    """fla's three chunk kernels, imported on first use; None where triton or fla-core is missing, or
    fla's kernels do not import (a warning says why: prefill then runs the torch paths)."""
    if not HAS_TRITON or importlib.util.find_spec("fla") is None:
        return None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda
        from fla.ops.common.chunk_h import chunk_fwd_kernel_h  # noqa: F401 - simple_gla_forward's parts
        from fla.ops.common.chunk_o import chunk_fwd_o  # noqa: F401
    except ImportError as e:  # e.g. a fla-core built for another torch
        warnings.warn(f"fla-core is installed but its kernels do not import ({e}); prefill runs the torch paths",
                      stacklevel=2)
        return None
    return FlaOps(chunk_gated_delta_rule, chunk_kda, simple_gla_forward)


def simple_gla_forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, initial_state: Tensor,
                       output_final_state: bool, state_v_first: bool, cu_seqlens: Tensor,
                       chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """fla's `chunk_simple_gla` forward (same keywords, varlen only) with no host read beyond the memoised
    chunk indices (module docstring). q, k [1, T, H, K]; v [1, T, H, V]; g [1, T, H] log-gate fp32;
    initial_state [N, H, V, K] (state_v_first) or [N, H, K, V], fp32. Returns o [1, T, H, V] in q's dtype
    and the fp32 final states if asked."""
    import triton
    from fla.ops.common.chunk_h import chunk_fwd_kernel_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.utils import chunk_local_cumsum, prepare_chunk_indices, prepare_chunk_offsets
    from fla.ops.utils.constant import RCP_LN2

    q, k, v, g, initial_state = (t.contiguous() for t in (q, k, v, g, initial_state))
    _, steps, heads, key_dim = k.shape
    value_dim = v.shape[-1]
    chunks = prepare_chunk_indices(cu_seqlens, chunk_size)  # [NS, 2] (sequence, chunk), memoised
    offsets = prepare_chunk_offsets(cu_seqlens, chunk_size)  # [N + 1] first chunk of each sequence
    g = chunk_local_cumsum(g, chunk_size=chunk_size, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=chunks)
    num_seqs = cu_seqlens.shape[0] - 1
    state = (value_dim, key_dim) if state_v_first else (key_dim, value_dim)
    h = k.new_empty(1, chunks.shape[0], heads, *state)
    ht = k.new_empty(num_seqs, heads, *state, dtype=torch.float32) if output_final_state else None
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():
        chunk_fwd_kernel_h[lambda meta: (triton.cdiv(key_dim, meta["BK"]) * triton.cdiv(value_dim, meta["BV"])
                                         * num_seqs * heads,)](
            k=k, v=v, h=h, g=g, g_gamma=None, gk=None, gv=None, h0=initial_state, ht=ht, cu_seqlens=cu_seqlens,
            split_offsets=offsets, T=steps, H=heads, K=key_dim, V=value_dim, BT=chunk_size, BS=chunk_size,
            USE_G=True, USE_G_GAMMA=False, USE_GK=False, USE_GV=False, STATE_V_FIRST=state_v_first,
        )
        o = chunk_fwd_o(q=q, k=k, v=v, h=h, g=g, scale=scale, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                        chunk_size=chunk_size, chunk_indices=chunks)
    return o.to(q.dtype), ht


def fla_usable(t: Tensor) -> bool:
    """Whether prefill of inputs like `t` runs on fla's kernels: a CUDA tensor, fla importable, and, for
    fp32 inputs, TF32 allowed (`torch.get_float32_matmul_precision() != "highest"`): fla's fp32 dots run
    in TF32 on sm80+, which torch's own fp32 matmuls do only under that setting, so an fp32 model that
    asks for full precision keeps the torch path."""
    if not t.is_cuda:
        return False
    if t.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return False
    return fla_ops() is not None


def fla_testable(t: Tensor) -> bool:
    """Whether a test may call the fla entry points on `t` directly: fla importable, and `t` on CUDA or
    on the CPU under Triton's interpreter (fp32 only there: see tests/ops/test_prefill_fla.py)."""
    return triton_testable(t) and fla_ops() is not None


def _ops() -> FlaOps:
    ops = fla_ops()
    if ops is None:
        raise RuntimeError("fla-core's kernels are not importable here")
    return ops


def _on_device(cu_seqlens: Tensor, like: Tensor) -> Tensor:
    """cu_seqlens on `like`'s device: the same object when already there, so fla's identity-keyed index
    cache serves every layer of a step after the first."""
    return cu_seqlens.to(like.device)


def fla_chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float | None,
                               initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor,
                               use_qk_l2norm_in_kernel: bool, chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """Our `chunk_gated_delta_rule` contract (see gdn/chunk.py) on fla's kernel, flat varlen batches only.

    q, k [1, T, H, K]; v [1, T, HV, V]; g, beta [1, T, HV]; initial_state [N, HV, K, V] fp32. `chunk_size`
    is our torch path's tiling knob; fla tiles by its own 64 (same math). Returns o [1, T, HV, V] in v's
    dtype and the fp32 final state [N, HV, K, V] if asked.
    """
    o, ht = _ops().chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=_on_device(cu_seqlens, q),
    )
    return o.to(v.dtype), ht


def fla_chunk_kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float | None,
                  initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor,
                  use_qk_l2norm_in_kernel: bool, chunk_size: int = 64) -> tuple[Tensor, Tensor | None]:
    """Our `chunk_kda` contract (see kda/chunk.py) on fla's kernel, flat varlen batches only.

    q, k, g [1, T, H, K] (g the per-channel log-decay, gate not applied in-kernel); v [1, T, H, V];
    beta [1, T, H]; initial_state [N, H, K, V] fp32. Returns o [1, T, H, V] in v's dtype and the fp32
    final state if asked. `chunk_size` as in `fla_chunk_gated_delta_rule`.
    """
    o, ht = _ops().chunk_kda(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=False, cu_seqlens=_on_device(cu_seqlens, q),
    )
    return o.to(v.dtype), ht


def fla_chunk_simple_gla_v_first(q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float,
                                 initial_state: Tensor, cu_seqlens: Tensor) -> tuple[Tensor, Tensor]:
    """Scalar-gated linear attention over a flat varlen batch, states kept V-first.

    q, k [1, T, H, K]; v [1, T, H, V]; g [1, T, H] log-gate; initial_state [N, H, V, K] fp32.
    Per head `S_t = exp(g_t)·S_{t-1} + v_t k_tᵀ` ([V, K]), `o_t = scale·S_t q_t`.
    Returns o [1, T, H, V] in q's dtype and the final states [N, H, V, K] fp32.
    """
    o, ht = _ops().chunk_simple_gla(
        q, k, v, g=g, scale=scale, initial_state=initial_state, output_final_state=True, state_v_first=True,
        cu_seqlens=_on_device(cu_seqlens, q),
    )
    return o, ht
