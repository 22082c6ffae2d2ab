"""Typed errors of prefill/decode disaggregation."""
from __future__ import annotations


class KVTransferError(RuntimeError):
    """The peer engine died, hung past the timeout, or the link failed; the channel cannot be used again."""


class TransferLayoutError(ValueError):
    """The two engines' caches do not lay a request's state out alike (model, page size, draft tokens,
    dtype or tensor-parallel shard), so one cannot resume the other's requests."""
