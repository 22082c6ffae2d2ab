"""Acceptance bookkeeping for the GDN replay history: the shared replay rule."""
from ..replay_accept import replay_accept as gdn_accept

__all__ = ["gdn_accept"]
