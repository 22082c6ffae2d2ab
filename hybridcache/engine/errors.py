"""Typed errors of the engine's public surface."""
from ..cache.errors import BudgetTooSmallError


class InvalidRequestError(ValueError):
    """A request the engine refuses before it runs (empty prompt, unknown token ids, too long)."""


class RequestTooLargeError(InvalidRequestError, BudgetTooSmallError):
    """The device cache budget cannot hold this request even when it runs alone."""
