"""Multi-head latent attention (Kimi Linear's MLA, no positional rotation) over the pool's latent pages."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import mla_paged_attention
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from ..batch import ForwardBatch
from .mlp import Linear
from .norm import RMSNorm

LATENT_ROLE = "mla.latent"
LORA_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the RMSNorm default, not rms_norm_eps


class MLAAttention(nn.Module):
    """Queries: q_proj `[H*(Dn+Dr), D]`, or q_a_proj `[Rq, D]` -> q_a_layernorm -> q_b_proj `[H*(Dn+Dr), Rq]`.
    Keys/values: kv_a_proj_with_mqa `[R+Dr, D]` -> (latent c `[R]`, shared rope key `[Dr]`), c ->
    kv_a_layernorm; kv_b_proj `[H*(Dn+Dv), R]` expands c to per-head k_nope and v. o_proj `[D, H*Dv]`.

    The pages hold c (after the norm) and the rope key per token; neither queries nor keys are rotated
    (transformers' KimiLinearAttention never uses the positions). Scale: (Dn + Dr) ** -0.5.
    `index` is this layer's position among the model's MLA layers (its layer in the `latent` role).
    Tensor parallel: the heads are sharded (q_proj / q_b_proj, kv_b_proj column-parallel, o_proj
    row-parallel, so the output is this rank's partial sum); the low-rank projections, their norms and
    the latent pages are replicated (every head reads the whole latent).
    """

    def __init__(self, index: int, hidden: int, num_heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                 nope_dim: int, rope_dim: int, v_dim: int, bias: bool, device: torch.device | str,
                 dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h0, hl = head_share(tp, num_heads, "num_attention_heads")
        self.index, self.num_heads, self.kv_lora_rank = index, hl, kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = nope_dim, rope_dim, v_dim
        qd, kvd = nope_dim + rope_dim, nope_dim + v_dim
        q_rows = [(h0 * qd, hl * qd)]
        if q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, num_heads * qd, q_rows, False, device, dtype)
        else:
            self.q_a_proj = Linear(hidden, q_lora_rank, bias, device, dtype)
            self.q_a_layernorm = RMSNorm(q_lora_rank, LORA_NORM_EPS, device, dtype)
            self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * qd, q_rows, False, device, dtype)
        self.kv_a_proj_with_mqa = Linear(hidden, kv_lora_rank + rope_dim, bias, device, dtype)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LORA_NORM_EPS, device, dtype)
        self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * kvd, [(h0 * kvd, hl * kvd)], False, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * v_dim, [(h0 * v_dim, hl * v_dim)], hidden, bias, tp, device, dtype)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows) -> [N, D]; writes the new tokens' latent and rope key into the pages."""
        n, H, R = x.shape[0], self.num_heads, self.kv_lora_rank
        q_nope, q_rope = self._queries(x).view(n, H, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([R, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        w_k, w_v = self.kv_b_proj.weight.view(H, self.nope_dim + self.v_dim, R).split([self.nope_dim, self.v_dim], 1)
        o = mla_paged_attention(q_nope, q_rope, latent, k_rope, batch.pages[LATENT_ROLE][self.index],
                                batch.page_table, batch.cached_lens, batch.cu_seqlens, w_k, w_v,
                                scale=(self.nope_dim + self.rope_dim) ** -0.5, host=batch.host_rows)
        return self.o_proj(o.reshape(n, H * self.v_dim))
