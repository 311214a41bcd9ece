"""The one validation layer for numeric command-line flags.

Every integer or real option of every command has a :class:`Number` type (a test walks the
command tree to keep it so). At parse time, before any file is read or model loaded, a value that
is not a number of the right kind (``abc``, ``1.5`` for an integer, ``1e3`` for an integer), NaN or
infinite, zero or negative where the flag needs a count, or beyond the flag's largest sensible
value (:data:`HUGE` for counts unless the flag says less) is a one-line usage error naming the flag
(``error: Invalid value for '--max-new-tokens': 0 is below the minimum 1 ... (fix: see ...)``,
exit 2). Checks that need the model (a length against its maximum positions) come later, in the
commands, and name the flag too.
"""

from __future__ import annotations

import math
import re

import click

#: the largest count any flag takes unless it says less (beyond it, sizes overflow tensors and int32 indices)
HUGE = 2**31 - 1
#: seeds: what numpy and torch both take
MAX_SEED = 2**32 - 1
_INT_TEXT = re.compile(r"[+-]?\d+")


class Number(click.ParamType):
    """An integer (``kind=int``) or finite real (``kind=float``) within ``[min, max]`` (open ends with
    ``min_open`` / ``max_open``)."""

    def __init__(
        self,
        kind: type = int,
        min: float | None = None,
        max: float | None = None,
        *,  # noqa: A002
        min_open: bool = False,
        max_open: bool = False,
    ):
        self.kind = kind
        self.min, self.max = min, (HUGE if max is None and kind is int else max)
        self.min_open, self.max_open = min_open, max_open
        self.name = "integer" if kind is int else "number"

    def _parse(self, value):
        if isinstance(value, bool):
            return None
        if self.kind is int:
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            text = str(value).strip()
            return int(text) if _INT_TEXT.fullmatch(text) and len(text) < 40 else None
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(str(value).strip())
        except (ValueError, OverflowError):
            return None

    def describe_range(self) -> str:
        lo = "" if self.min is None else (f">{'' if self.min_open else '='} {self.min:g}")
        hi = "" if self.max is None else (f"<{'' if self.max_open else '='} {self.max:g}")
        return " and ".join(x for x in (lo, hi) if x)

    def convert(self, value, param, ctx):
        number = self._parse(value)
        if number is None:
            self.fail(f"{value!r} is not {'an integer' if self.kind is int else 'a number'}", param, ctx)
        if self.kind is float and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        low = self.min is not None and (number <= self.min if self.min_open else number < self.min)
        high = self.max is not None and (number >= self.max if self.max_open else number > self.max)
        if low or high:
            self.fail(f"{value!r} is out of range: it must be {self.describe_range()}", param, ctx)
        return number

    def get_metavar(self, param, ctx=None):  # noqa: D102 - click API (ctx added in click 8.2)
        return "INTEGER" if self.kind is int else "FLOAT"

    def __repr__(self) -> str:
        return f"Number({self.kind.__name__}, {self.describe_range()})"


def count(min: int = 1, max: int | None = None) -> Number:  # noqa: A002
    """A whole number >= ``min`` (default 1) and <= ``max`` (default :data:`HUGE`)."""
    return Number(int, min, max)


def real(min: float | None = None, max: float | None = None, **open_ends: bool) -> Number:  # noqa: A002
    """A finite real number in the given range (``min_open`` / ``max_open``: that end excluded)."""
    return Number(float, min, max, **open_ends)


#: ``--seed``: 0 .. 2**32-1
SEED = Number(int, 0, MAX_SEED)
#: ``--threads``: 1 .. 1024
THREADS = Number(int, 1, 1024)
#: shares in (0, 1]
SHARE = real(0, 1, min_open=True)
