"""A mistake in the input ends in one line on stderr and exit code 2; a bug keeps its traceback."""
from __future__ import annotations

import sys
from typing import NoReturn


class UsageError(Exception):
    """A command line the CLI refuses before any model loads."""


def fail(message: str, prog: str = "hybridcache") -> NoReturn:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


def user_errors() -> tuple[type[BaseException], ...]:
    """The library's typed errors that mean "your input is wrong", not "this is a bug"."""
    from ..cache.errors import BudgetTooSmallError, LayoutError
    from ..engine.errors import InvalidParamsError, InvalidRequestError, SchedulerStuckError
    from ..models.errors import ModelLoadError
    from ..disagg.errors import KVTransferError, TransferLayoutError
    from ..parallel.errors import ShardingError

    return (UsageError, InvalidParamsError, InvalidRequestError, ModelLoadError, BudgetTooSmallError, LayoutError,
            SchedulerStuckError, ShardingError, KVTransferError, TransferLayoutError)
