"""Moves live rows between the device role tensors and flat host records.

On CUDA every copy runs on a dedicated stream: it waits on the compute stream before reading device
rows, and the compute stream waits on it (`fence`) before the next forward touches those rows again.
"""
from __future__ import annotations

import contextlib

import torch

from .roles import RecordLayout, RoleSpec


def _runs(dst: list[int]) -> list[tuple[int, int, int]]:
    """Group `dst` into (src_start, dst_start, length) runs where both sides are consecutive."""
    runs: list[tuple[int, int, int]] = []
    for i, d in enumerate(dst):
        if runs and runs[-1][1] + runs[-1][2] == d:
            s, d0, n = runs[-1]
            runs[-1] = (s, d0, n + 1)
        else:
            runs.append((i, d, 1))
    return runs


class CopyEngine:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending = False

    @contextlib.contextmanager
    def _on_copy_stream(self):
        if not self.cuda:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        self._pending = True

    def fence(self) -> None:
        """Make the compute stream wait for every copy issued so far (call before a forward)."""
        if self._pending:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self._pending = False

    def synchronize(self) -> None:
        if self.cuda:
            self.stream.synchronize()
            self.fence()

    def to_host(
        self,
        roles: list[RoleSpec],
        tensors: dict[str, torch.Tensor],
        rows: list[int],
        layout: RecordLayout,
        records: torch.Tensor,
        dst: list[int],
    ) -> int:
        """Copy the live bytes of device `rows` into host `records[dst]`; returns the bytes moved."""
        if not rows:
            return 0
        with self._on_copy_stream():
            idx = torch.tensor(rows, dtype=torch.long, device=self.device)
            staging = torch.empty(len(rows), layout.nbytes, dtype=torch.uint8, device=self.device)
            for role in roles:
                _view(staging, role, layout).copy_(_gather(role, tensors, idx).transpose(0, 1))
            for s, d, n in _runs(dst):
                records[d : d + n].copy_(staging[s : s + n], non_blocking=True)
        return len(rows) * sum(r.live_row_bytes for r in roles)

    def to_device(
        self,
        roles: list[RoleSpec],
        tensors: dict[str, torch.Tensor],
        rows: list[int],
        layout: RecordLayout,
        records: torch.Tensor,
        src: list[int],
    ) -> int:
        """Copy host `records[src]` into device `rows`, live half at the saved buffer index."""
        if not rows:
            return 0
        with self._on_copy_stream():
            idx = torch.tensor(rows, dtype=torch.long, device=self.device)
            staging = torch.empty(len(rows), layout.nbytes, dtype=torch.uint8, device=self.device)
            for d, s, n in _runs(src):
                staging[d : d + n].copy_(records[s : s + n], non_blocking=True)
            by_name = {r.name: r for r in roles}
            for role in sorted(roles, key=lambda r: r.buffered_by is not None):  # index roles first
                value = _view(staging, role, layout).transpose(0, 1)
                if role.buffered_by is None:
                    tensors[role.name][:, idx] = value
                else:
                    half = _view(staging, by_name[role.buffered_by], layout)[:, 0].long()
                    _scatter_half(role, tensors[role.name], idx, half, value)
        return len(rows) * sum(r.live_row_bytes for r in roles)

    def move_within(self, roles: list[RoleSpec], tensors: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
        """Gather whole rows (both halves) into fresh tensors `[layers, n, *shape]` (used by rebalance)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        return {r.name: tensors[r.name][:, idx].clone() for r in roles}


def _view(staging: torch.Tensor, role: RoleSpec, layout: RecordLayout) -> torch.Tensor:
    """The `[n, layers, *live_shape]` typed view of one role inside staging records `[n, nbytes]`."""
    off = layout.offsets[role.name]
    raw = staging[:, off : off + role.live_row_bytes]
    return raw.view(role.dtype).view(staging.shape[0], role.layers, *role.live_shape)


def _gather(role: RoleSpec, tensors: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """Live rows `[layers, n, *live_shape]` of device role tensor for slots `idx`."""
    t = tensors[role.name]
    if role.buffered_by is None:
        return t[:, idx]
    half = tensors[role.buffered_by][0, idx].long()
    moved = t.movedim(2 + role.buffer_dim, 2)  # [L, S, 2, ...rest]
    return moved[:, idx, half]


def _scatter_half(role: RoleSpec, t: torch.Tensor, idx: torch.Tensor, half: torch.Tensor, value: torch.Tensor) -> None:
    moved = t.movedim(2 + role.buffer_dim, 2)
    moved[:, idx, half] = value
