"""Moved to `hybridcache.ops.slot_io`; kept so that existing imports keep working."""

from hybridcache.ops.slot_io import RowScatter, put_rows, take_rows

__all__ = ["RowScatter", "put_rows", "take_rows"]
