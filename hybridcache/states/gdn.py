"""Gated DeltaNet layers: conv window, state checkpoint and the double-buffered replay history."""
from __future__ import annotations

import torch

from ..cache.errors import LayoutError
from ..cache.roles import RoleSpec
from ..ops.gdn import gdn_replay_state
from .replay import ReplayState, history_length
from .split import REPLICATED, HeadSplit, heads


class GDNState(ReplayState):
    """Roles of `num_layers` GDN layers with H key heads and HV value heads (per slot; docs/layouts.md):

    conv `[C, W + k]` (C = 2*H*K + HV*V), ssm `[HV, K, V]` fp32; with speculation also replay_u
    `[2, HIST, HV, V]`, replay_k `[2, HIST, H, K]`, replay_G / replay_beta `[2, HV, HIST]`, all fp32, pnat, buf_idx.
    """

    name = "gdn"

    def __init__(
        self, num_layers: int, num_key_heads: int, num_value_heads: int, key_dim: int, value_dim: int,
        conv_kernel: int, dtype: torch.dtype = torch.float32, num_draft_tokens: int = 0,
        hist: int | None = None,
    ) -> None:
        if num_value_heads % num_key_heads:
            raise LayoutError(f"gdn: {num_value_heads} value heads are not a multiple of {num_key_heads} key heads")
        if conv_kernel < 1 or num_draft_tokens < 0:
            raise LayoutError(f"gdn: conv_kernel {conv_kernel} / draft tokens {num_draft_tokens} invalid")
        self.num_layers, self.H, self.HV, self.K, self.V = num_layers, num_key_heads, num_value_heads, key_dim, value_dim
        self.conv_kernel, self.dtype, self.num_draft_tokens = conv_kernel, dtype, num_draft_tokens
        self.hist = history_length(num_draft_tokens, hist)
        self.conv_dim = 2 * num_key_heads * key_dim + num_value_heads * value_dim

    def roles(self) -> list[RoleSpec]:
        L, H, HV, K, V, hist = self.num_layers, self.H, self.HV, self.K, self.V, self.hist
        roles = [
            RoleSpec("conv", L, (self.conv_dim, self.conv_kernel - 1 + self.num_draft_tokens), self.dtype),
            RoleSpec("ssm", L, (HV, K, V), torch.float32),
        ]
        if self.replay:
            roles += [
                # u and the normalised keys are computed in fp32: kept so, the replayed state is the decoded one
                RoleSpec("replay_u", L, (2, hist, HV, V), torch.float32, buffered_by="buf_idx"),
                RoleSpec("replay_k", L, (2, hist, H, K), torch.float32, buffered_by="buf_idx"),
                RoleSpec("replay_G", L, (2, HV, hist), torch.float32, buffered_by="buf_idx"),
                RoleSpec("replay_beta", L, (2, HV, hist), torch.float32, buffered_by="buf_idx"),
                RoleSpec("pnat", 1, (), torch.int32),
                RoleSpec("buf_idx", 1, (), torch.int32),
            ]
        return roles

    def head_splits(self) -> dict[str, HeadSplit]:
        """conv channels are q, k (H key heads of K each) and v (HV value heads of V); the rest split by head."""
        H, HV, K, V = self.H, self.HV, self.K, self.V
        splits = {"conv": HeadSplit(0, ((H, K), (H, K), (HV, V))), "ssm": heads(HV)}
        if self.replay:  # live shapes: u [HIST, HV, V], k [HIST, H, K], G / beta [HV, HIST]
            splits.update(replay_u=heads(HV, 1), replay_k=heads(H, 1), replay_G=heads(HV), replay_beta=heads(HV),
                          pnat=REPLICATED, buf_idx=REPLICATED)
        return splits

    def effective_state(self, tensors, layer: int, slots: torch.Tensor) -> torch.Tensor:
        t = tensors
        return gdn_replay_state(t["ssm"][layer], t["replay_u"][layer], t["replay_k"][layer], t["replay_G"][layer],
                                t["pnat"][0], t["buf_idx"][0], slots)
