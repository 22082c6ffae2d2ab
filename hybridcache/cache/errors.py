"""Typed errors of the cache layer. Every one is raised before any state changes."""


class CacheError(Exception):
    """Base class of every error the cache manager raises."""


class UnknownRequestError(CacheError, KeyError):
    """The request id was never added, or was already freed."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateRequestError(CacheError, ValueError):
    """The request id is already known to the manager."""


class InvalidTransitionError(CacheError, ValueError):
    """The request is not in a state that allows the operation (e.g. suspending a waiting request)."""


class OutOfDeviceMemoryError(CacheError, MemoryError):
    """The device tier has too few free pages or slots for what was asked."""


class HostTierFullError(CacheError, MemoryError):
    """The host tier cannot hold the request; the caller should fall back to re-prefill."""


class BudgetTooSmallError(CacheError, ValueError):
    """A byte budget cannot hold even one request (one slot and one page beyond the dummies)."""


class LayoutError(CacheError, ValueError):
    """A role declaration or configuration the pools or kernels cannot serve."""


class DoubleFreeError(CacheError, ValueError):
    """A request, page or slot was released more times than it was taken."""


class IntegrityError(CacheError, AssertionError):
    """An ownership invariant is broken: a slot or page owned twice, or counts that do not add up."""


class InvalidCountError(CacheError, ValueError):
    """A token or accept count that is not an integer in range (non-positive, past a row's tokens, overflowing)."""


class StateLostError(CacheError, RuntimeError):
    """A rebalance failed after the arena was re-carved and the old carving could not be restored: the live
    requests' state is gone; the planner restarts them from their tokens."""
