"""Typed errors of the engine's public surface."""
from ..cache.errors import BudgetTooSmallError
from .params import InvalidParamsError  # defined beside the dataclasses it guards, so they import nothing

__all__ = ["InvalidParamsError", "InvalidRequestError", "RequestTooLargeError", "SchedulerStuckError"]


class InvalidRequestError(ValueError):
    """A request the engine refuses before it runs (empty prompt, unknown token ids, too long)."""


class RequestTooLargeError(InvalidRequestError, BudgetTooSmallError):
    """The device cache budget cannot hold this request even when it runs alone."""


class SchedulerStuckError(RuntimeError):
    """Requests remain but none can run in the device cache as it is; raised instead of spinning."""
