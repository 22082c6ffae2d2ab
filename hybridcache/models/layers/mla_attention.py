"""Multi-head latent attention (Kimi Linear's MLA, no positional rotation) over the pool's latent pages."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import mla_paged_attention
from ...ops.linear import linear
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from ..batch import ForwardBatch
from .attention import fused_params, fused_rows
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

    The two projections of x (q_proj or q_a_proj, and kv_a_proj_with_mqa) are row views of one `in_weight`
    (and `in_bias`): one GEMM (`attention.fused_rows` names the views). q_proj has no bias: with `bias` and no
    q_lora_rank its rows of `in_bias` stay zero and only kv_a_proj_with_mqa's are a checkpoint tensor.
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
        kv_a = ("kv_a_proj_with_mqa", kv_lora_rank + rope_dim, (0, kv_lora_rank + rope_dim))
        if q_lora_rank is None:
            self.rows = [("q_proj", num_heads * qd, q_rows[0]), kv_a]
        else:
            self.rows = [("q_a_proj", q_lora_rank, (0, q_lora_rank)), kv_a]
            self.q_a_layernorm = RMSNorm(q_lora_rank, LORA_NORM_EPS, device, dtype)
            self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * qd, q_rows, False, device, dtype)
        self.q_lora = q_lora_rank is not None
        self.in_weight, self.in_bias = fused_params(self.rows, hidden, bias, device, dtype)
        if self.in_bias is not None:
            with torch.no_grad():
                self.in_bias.zero_()  # q_proj's rows, when it has no bias, stay so: the loader fills the rest
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LORA_NORM_EPS, device, dtype)
        self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * kvd, [(h0 * kvd, hl * kvd)], False, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * v_dim, [(h0 * v_dim, hl * v_dim)], hidden, bias, tp, device, dtype)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        views = fused_rows(self.rows, self.in_weight, self.in_bias)
        views.pop("q_proj.bias", None)  # not in checkpoints: q_proj has no bias
        return views

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, D] -> queries [N, H*(Dn+Dr)], kv_a_proj_with_mqa's output [N, R+Dr] (a column slice)."""
        q, kv = linear(x, self.in_weight, self.in_bias).split([row[2][1] for row in self.rows], dim=-1)
        return (self.q_b_proj(self.q_a_layernorm(q)) if self.q_lora else q), kv

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows) -> [N, D]; writes the new tokens' latent and rope key into the pages."""
        n, H, R = x.shape[0], self.num_heads, self.kv_lora_rank
        q, kv = self._project(x)
        q_nope, q_rope = q.view(n, H, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = kv.split([R, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        w_k, w_v = self.kv_b_proj.weight.view(H, self.nope_dim + self.v_dim, R).split([self.nope_dim, self.v_dim], 1)
        o = mla_paged_attention(q_nope, q_rope, latent, k_rope, batch.pages[LATENT_ROLE][self.index],
                                batch.page_table, batch.cached_lens, batch.cu_seqlens, w_k, w_v,
                                scale=(self.nope_dim + self.rope_dim) ** -0.5, host=batch.host_rows)
        return self.o_proj(o.reshape(n, H * self.v_dim))
