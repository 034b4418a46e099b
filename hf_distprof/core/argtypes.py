"""Validated argparse types, for every parser of the package (torch-free).

A bad value fails while the command line is parsed: argparse prints ``argument --flag: <message>`` and exits 2,
without a traceback, and every message says what would be valid. Two kinds:

- classes (:class:`NonNegativeInt`, :class:`PositiveInt`, ...), used as the types of dataclass fields
  (:class:`hf_distprof.config.ProfilingArguments`): their constructor validates, so the same check runs for code
  that builds the dataclass directly;
- factories for a subcommand's own options: :func:`number` (an integer or finite number in a range) and
  :func:`checked` (a parser that raises ``ValueError`` naming the valid values).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # For type checkers the validated types are what they hold; at run time they validate.
    NonNegativeInt = int
    PositiveInt = int
    RankList = str
    RunName = str
    NonNegativeFloat = float
    PositiveFloat = float
    AboveOneFloat = float
else:

    class NonNegativeInt(int):
        """An ``int`` that is >= 0; its constructor is the argparse ``type`` of counting flags."""

        def __new__(cls, value: Any) -> NonNegativeInt:
            return super().__new__(cls, _valid(int, value, low=0))

    class PositiveInt(int):
        """An ``int`` that is >= 1."""

        def __new__(cls, value: Any) -> PositiveInt:
            return super().__new__(cls, _valid(int, value, low=1))

    class RankList(str):
        """``all``, ``auto``, or a comma-separated list of distinct ranks >= 0 such as ``0,3``."""

        def __new__(cls, value: Any) -> RankList:
            text = str(value).strip().lower()
            if text not in ("all", "auto"):
                parts = [p.strip() for p in text.split(",")]
                if not parts or any(not p.isdigit() for p in parts):
                    raise argparse.ArgumentTypeError(
                        f"must be 'all', 'auto' or a comma-separated list of ranks >= 0 such as '0,3', got {value!r}"
                    )
                text = ",".join(str(r) for r in sorted({int(p) for p in parts}))
            return super().__new__(cls, text)

    class RunName(str):
        """A folder name of one part: not empty, no ``/`` (a path made the run folder elsewhere, or none at all)."""

        def __new__(cls, value: Any) -> RunName:
            text = str(value)
            if not text.strip() or text in (".", "..") or "/" in text or os.sep in text or "\0" in text:
                raise argparse.ArgumentTypeError(
                    f"must be a folder name without '/' (the run's sub-folder of --profiler-output-dir), got {value!r}"
                )
            return super().__new__(cls, text)

    class NonNegativeFloat(float):
        """A finite ``float`` that is >= 0 (thresholds in percent)."""

        def __new__(cls, value: Any) -> NonNegativeFloat:
            return super().__new__(cls, _valid(float, value, low=0))

    class PositiveFloat(float):
        """A finite ``float`` that is > 0."""

        def __new__(cls, value: Any) -> PositiveFloat:
            return super().__new__(cls, _valid(float, value, low=0, above=True))

    class AboveOneFloat(float):
        """A finite ``float`` that is > 1 (a factor over a normal value)."""

        def __new__(cls, value: Any) -> AboveOneFloat:
            return super().__new__(cls, _valid(float, value, low=1, above=True))


# The validated classes: a dataclass field of one of these types is checked when the dataclass is built.
VALIDATED: tuple[type, ...] = (NonNegativeInt, PositiveInt, RankList, RunName, NonNegativeFloat, PositiveFloat,
                               AboveOneFloat)


def _valid(kind: type, value: Any, low: float, above: bool = False) -> Any:
    """``value`` parsed as ``kind`` and checked against the range; a value that is no number (or no finite one) is
    told the range too: ``must be an integer >= 0, got 'x'``, ``must be a finite number > 0, got 'nan'``."""
    try:
        parsed = _parse_int(value) if kind is int else _parse_float(value)
    except argparse.ArgumentTypeError as exc:
        finite = "finite" in str(exc)
        raise argparse.ArgumentTypeError(f"{_range_text(kind, low, None, above, finite=finite)}, got {value!r}") \
            from None
    if kind is int and parsed > MAX_INT:  # (C code takes these: a buffer's entries, an environment variable)
        raise argparse.ArgumentTypeError(f"{_range_text(kind, low, None, above)} and below 2**63, got {value!r}")
    return _in_range(parsed, value, low=low, above=above)


MAX_INT = 2**63 - 1


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {value!r}") from None


def _parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"must be a number, got {value!r}")
    try:
        number = float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {value!r}")
    return number


def _range_text(kind: type, low: float | None, high: float | None, above: bool, why: str = "",
                finite: bool = False) -> str:
    """``must be an integer >= 1``, ``must be a number > 0``, ``must be an integer from 0 to 10000`` (``must be a
    finite number > 0`` with ``finite``)."""
    what = "an integer" if issubclass(kind, int) else ("a finite number" if finite else "a number")
    if low is not None and high is not None:
        bound = f" from {low:g} to {high:g}"
    elif low is not None:
        bound = f" {'>' if above else '>='} {low:g}"
    else:
        bound = f" <= {high:g}" if high is not None else ""
    return f"must be {what}{bound}{why}"


def _in_range(value: Any, given: Any, low: float | None = None, high: float | None = None, above: bool = False,
              why: str = "") -> Any:
    """``value`` (parsed from ``given``) when it lies in the range, else the error that names the range.

    Raises:
        argparse.ArgumentTypeError: Out of the range, or not finite (NaN compares false with everything, and
            infinity overflows timers).
    """
    # (An int is always finite, and one beyond a float's range would overflow math.isfinite.)
    out = (isinstance(value, float) and not math.isfinite(value)) or (
        low is not None and (value < low or (above and value == low)))
    if out or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"{_range_text(type(value), low, high, above, why)}, got {given!r}")
    return value


def valid_values(kind: Any) -> str:
    """What a flag of type ``kind`` accepts, as the flag tables say it (``string`` for any other type)."""
    return {
        bool: "true/false",
        NonNegativeInt: "integer >= 0",
        PositiveInt: "integer >= 1",
        RankList: "`all`, `auto` or ranks like `0,3`",
        NonNegativeFloat: "number >= 0",
        PositiveFloat: "number > 0",
        AboveOneFloat: "number > 1",
    }.get(kind, "string")


def str_to_bool(value: str | bool) -> bool:
    """The argparse ``type`` of a boolean flag given a value (``yes/true/t/y/1``, ``no/false/f/n/0``)."""
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"must be a boolean (true/false), got {value!r}")


def number(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    *,
    above: bool = False,
    why: str = "",
    check_range: bool = True,
) -> Callable[[str], Any]:
    """An argparse ``type``: an integer (``kind`` int) or a finite number (``kind`` float) in a range.

    The message of a bad value names the range: ``must be an integer >= 1, got '0'``, ``must be a number > 0,
    got 'nan'``, ``must be an integer from 0 to 10000, got '-1'``.

    Args:
        kind: ``int`` or ``float``.
        low: The smallest valid value (None: no lower bound).
        high: The largest valid value (None: no upper bound); with ``low``, the range reads "from low to high".
        above: ``low`` itself is not valid (``> low`` instead of ``>= low``).
        why: Words after the range, for a bound that needs a reason (`` (the first step is the warm-up)``).
        check_range: False: only parse, and leave the range (still named in the message) to the code that
            receives the value (for options whose dataclass checks them for its API callers too).

    Returns:
        The parser, named after ``kind`` (argparse's "invalid <name> value" never shows: it raises first).
    """
    must = _range_text(kind, low, high, above, why)

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{must}, got {text!r}") from None
        return _in_range(value, text, low, high, above, why) if check_range else value

    parse.__name__ = kind.__name__
    return parse


def checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a parser that raises ``ValueError`` with the valid values in its message."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped
