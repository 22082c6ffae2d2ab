"""Mamba2 (SSD) layers: conv window, SSM checkpoint and the double-buffered replay history."""
from __future__ import annotations

import torch

from ..cache.errors import LayoutError
from ..cache.roles import RoleSpec
from ..ops.mamba2 import replay_state
from .replay import ReplayState, history_length
from .split import REPLICATED, HeadSplit, heads


class Mamba2State(ReplayState):
    """Roles of `num_layers` Mamba2 layers (shapes per slot; docs/layouts.md):

    conv `[C, W + k]` (C = H*P + 2*G*N), ssm `[H, P, N]` fp32; with speculation (k > 0) also
    replay_x `[2, HIST, H, P]`, replay_B `[2, HIST, G, N]`, replay_dt / replay_dA_cumsum `[2, H, HIST]` fp32,
    pnat and buf_idx (one layer, int32).
    """

    name = "mamba2"

    def __init__(
        self, num_layers: int, num_heads: int, head_dim: int, n_groups: int, state_size: int,
        conv_kernel: int, dtype: torch.dtype = torch.float32, num_draft_tokens: int = 0,
        hist: int | None = None,
    ) -> None:
        if num_heads % n_groups:
            raise LayoutError(f"mamba2: {num_heads} heads do not split into {n_groups} groups")
        if conv_kernel < 1 or num_draft_tokens < 0:
            raise LayoutError(f"mamba2: conv_kernel {conv_kernel} / draft tokens {num_draft_tokens} invalid")
        self.num_layers, self.num_heads, self.head_dim = num_layers, num_heads, head_dim
        self.n_groups, self.state_size, self.conv_kernel = n_groups, state_size, conv_kernel
        self.dtype, self.num_draft_tokens = dtype, num_draft_tokens
        self.hist = history_length(num_draft_tokens, hist)
        self.conv_dim = num_heads * head_dim + 2 * n_groups * state_size

    def roles(self) -> list[RoleSpec]:
        L, H, P, G, N, hist = self.num_layers, self.num_heads, self.head_dim, self.n_groups, self.state_size, self.hist
        roles = [
            RoleSpec("conv", L, (self.conv_dim, self.conv_kernel - 1 + self.num_draft_tokens), self.dtype),
            RoleSpec("ssm", L, (H, P, N), torch.float32),
        ]
        if self.replay:
            roles += [
                RoleSpec("replay_x", L, (2, hist, H, P), self.dtype, buffered_by="buf_idx"),
                RoleSpec("replay_B", L, (2, hist, G, N), self.dtype, buffered_by="buf_idx"),
                RoleSpec("replay_dt", L, (2, H, hist), torch.float32, buffered_by="buf_idx"),
                RoleSpec("replay_dA_cumsum", L, (2, H, hist), torch.float32, buffered_by="buf_idx"),
                RoleSpec("pnat", 1, (), torch.int32),
                RoleSpec("buf_idx", 1, (), torch.int32),
            ]
        return roles

    def head_splits(self) -> dict[str, HeadSplit]:
        """conv channels are x (H heads of P), B and C (G groups of N each); the rest split by head or group."""
        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.state_size
        splits = {"conv": HeadSplit(0, ((H, P), (G, N), (G, N))), "ssm": heads(H)}
        if self.replay:  # live shapes: x [HIST, H, P], B [HIST, G, N], dt / dA_cumsum [H, HIST]
            splits.update(replay_x=heads(H, 1), replay_B=heads(G, 1), replay_dt=heads(H), replay_dA_cumsum=heads(H),
                          pnat=REPLICATED, buf_idx=REPLICATED)
        return splits

    def effective_state(self, tensors, layer: int, slots: torch.Tensor) -> torch.Tensor:
        t = tensors
        return replay_state(t["ssm"][layer], t["replay_x"][layer], t["replay_B"][layer], t["replay_dt"][layer],
                            t["replay_dA_cumsum"][layer], t["pnat"][0], t["buf_idx"][0], slots)
