"""KDA decode: T tokens per row from the slot's state, writing the state after the last one."""
import torch

from ..gdn.pool_io import read_rows
from ..slot_io import put_rows
from .block import block, prepare_qk


def kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> torch.Tensor:
    """q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; ssm [S, H, K, V] fp32; slots [B].

    Returns o [B, T, H, V] in v's dtype.
    """
    qh, kh = prepare_qk(q, k, scale, use_qk_l2norm_in_kernel)
    h0 = read_rows(ssm, slots, has_initial)
    o, h = block(h0, qh, kh, *(x.float().transpose(1, 2) for x in (v, g, beta)))
    put_rows(ssm, (slots,), h, slots >= 0)
    return o.transpose(1, 2).to(v.dtype)
