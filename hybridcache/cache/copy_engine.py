"""Moves live rows between the device role tensors and flat host records.

On CUDA the copies never run on the compute stream. Both copy streams wait on the compute stream before
touching device rows, and the compute stream waits on them (`fence`) before the next forward. A batch
moves in chunks: the gather (or scatter) of one chunk on the `pack` stream overlaps the DMA of the
previous chunk on the `dma` stream, so the packing costs almost nothing beside the transfer.
"""
from __future__ import annotations

import torch

from .roles import RecordLayout, RoleSpec

CHUNK_BYTES = 64 << 20


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


def _chunks(n: int, record_bytes: int) -> list[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(record_bytes, 1))
    return [(a, min(n, a + step)) for a in range(0, n, step)]


class CopyEngine:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.dma = torch.cuda.Stream(device) if self.cuda else None
        self.pack = torch.cuda.Stream(device) if self.cuda else None
        self._pending = False

    def _begin(self) -> None:
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            self.dma.wait_stream(compute)
            self.pack.wait_stream(compute)
            self._pending = True

    def fence(self) -> None:
        """Make the compute stream wait for every copy issued so far (call before a forward)."""
        if self._pending:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.dma)
            compute.wait_stream(self.pack)
            self._pending = False

    def _index(self, rows: list[int]) -> torch.Tensor:
        """Row indices on the device, uploaded on the pack stream that reads them."""
        if not self.cuda:
            return torch.tensor(rows, dtype=torch.long)
        with torch.cuda.stream(self.pack):
            return torch.tensor(rows, dtype=torch.long).to(self.device, non_blocking=True)

    def synchronize(self) -> None:
        if self.cuda:
            self.dma.synchronize()
            self.pack.synchronize()
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
        self._begin()
        idx = self._index(rows)
        if not self.cuda:  # same memory: gather straight into the records
            for s, d, n in _runs(dst):
                _pack(roles, tensors, idx[s : s + n], records[d : d + n], layout)
            return _live_bytes(roles, len(rows))
        with torch.cuda.stream(self.pack):
            staging = torch.empty(len(rows), layout.nbytes, dtype=torch.uint8, device=self.device)
        staging.record_stream(self.dma)
        for a, b in _chunks(len(rows), layout.nbytes):
            with torch.cuda.stream(self.pack):
                _pack(roles, tensors, idx[a:b], staging[a:b], layout)
            self.dma.wait_stream(self.pack)
            with torch.cuda.stream(self.dma):
                for s, d, n in _runs(dst[a:b]):
                    records[d : d + n].copy_(staging[a + s : a + s + n], non_blocking=True)
        return _live_bytes(roles, len(rows))

    def to_device(
        self,
        roles: list[RoleSpec],
        tensors: dict[str, torch.Tensor],
        rows: list[int],
        layout: RecordLayout,
        records: torch.Tensor,
        src: list[int],
    ) -> int:
        """Copy host `records[src]` into device `rows`, the live half at the saved buffer index."""
        if not rows:
            return 0
        self._begin()
        idx = self._index(rows)
        if not self.cuda:
            for d, s, n in _runs(src):
                _scatter(roles, tensors, idx[d : d + n], records[s : s + n], layout)
            return _live_bytes(roles, len(rows))
        with torch.cuda.stream(self.dma):
            staging = torch.empty(len(rows), layout.nbytes, dtype=torch.uint8, device=self.device)
        staging.record_stream(self.pack)
        for a, b in _chunks(len(rows), layout.nbytes):
            with torch.cuda.stream(self.dma):
                for d, s, n in _runs(src[a:b]):
                    staging[a + d : a + d + n].copy_(records[s : s + n], non_blocking=True)
            self.pack.wait_stream(self.dma)
            with torch.cuda.stream(self.pack):
                _scatter(roles, tensors, idx[a:b], staging[a:b], layout)
        return _live_bytes(roles, len(rows))


def _live_bytes(roles: list[RoleSpec], n: int) -> int:
    return n * sum(r.live_row_bytes for r in roles)


def record_view(staging: torch.Tensor, role: RoleSpec, layout: RecordLayout) -> torch.Tensor:
    """The `[n, layers, *live_shape]` typed view of one role inside records `[n, nbytes]`."""
    off = layout.offsets[role.name]
    raw = staging[:, off : off + role.live_row_bytes]
    return raw.view(role.dtype).view(staging.shape[0], role.layers, *role.live_shape)


def gather_live(role: RoleSpec, tensors: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    """Live rows `[layers, n, *live_shape]` of a device role for slots `idx`."""
    t = tensors[role.name]
    if role.buffered_by is None:
        return t[:, idx]
    half = tensors[role.buffered_by][0, idx].long()
    return t.movedim(2 + role.buffer_dim, 2)[:, idx, half]


def _pack(
    roles: list[RoleSpec], tensors: dict[str, torch.Tensor], idx: torch.Tensor, records: torch.Tensor,
    layout: RecordLayout,
) -> None:
    """Write the live bytes of device slots `idx` into records `[n, nbytes]`."""
    for role in roles:
        record_view(records, role, layout).copy_(gather_live(role, tensors, idx).transpose(0, 1))


def _scatter(
    roles: list[RoleSpec], tensors: dict[str, torch.Tensor], idx: torch.Tensor, records: torch.Tensor,
    layout: RecordLayout,
) -> None:
    """Write records `[n, nbytes]` into device slots `idx`; index roles first, since the live half of a
    double-buffered role lands at the buffer index the record saved."""
    by_name = {r.name: r for r in roles}
    for role in sorted(roles, key=lambda r: r.buffered_by is not None):
        value = record_view(records, role, layout).transpose(0, 1)
        t = tensors[role.name]
        if role.buffered_by is None:
            t[:, idx] = value
        else:
            half = record_view(records, by_name[role.buffered_by], layout)[:, 0].long()
            t.movedim(2 + role.buffer_dim, 2)[:, idx, half] = value
