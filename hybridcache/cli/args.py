"""The parser, its help format and the option types: a value out of range is refused before any model loads."""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable, NoReturn

from .errors import fail

# engine.llm.DTYPES and "auto" (the checkpoint's own); spelled out so that --help imports no torch
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


class Parser(argparse.ArgumentParser):
    """Help with defaults and the raw module docstring; an error is one line on stderr and exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)", prog=self.prog)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option shows its default, with or without help text; an unset default (None, off, empty) is
    left to the help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS
        if unset or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".lstrip()


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def float_at_least(low: float, above: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if above else '>='} {low}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def probability(text: str) -> float:
    value = float_at_least(0.0, above=True)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def seed(text: str) -> int:
    value = int_at_least(0)(text)
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"must be < 2**64, got {value}")
    return value


def token_ids(text: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3]; anything but comma-separated non-negative ints is refused."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and p.isascii() for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids >= 0 like 1,2,3, got {text!r}")
    return [int(p) for p in parts]


BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(text: str) -> int:
    """`1048576`, `64M`, `2G`, `512KiB` -> bytes (binary units)."""
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = number[-1:] if number[-1:] in BYTE_UNITS else ""
    try:
        value = int(number[: len(number) - len(unit)]) * BYTE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count like 1048576, 64M or 2G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 byte, got {text!r}")
    return value


def add_parallel_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--tensor-parallel-size and --pipeline-parallel-size, the same for every command that loads a model."""
    parser.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, metavar="N",
                        help="shard the model and cache over N ranks (worker processes started here; docs/parallel.md)")
    parser.add_argument("--pipeline-parallel-size", type=int_at_least(1), default=1, metavar="N",
                        help="split the layers and their cache over N stages "
                             "(processes started here; docs/parallel.md)")
