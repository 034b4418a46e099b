"""Text that several commands print alike: rank ranges (``ranks 0-3, 5``), byte counts and Markdown tables."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any


SHOWN_PCT = 0.05
"""The smallest percentage the outputs state: one decimal place rounds anything less to 0.0, so a share under it is
left out of a sentence, and a peer waited for less than it is not named (the judge names the same peers the text
lists)."""


def step_base(gpu: bool) -> str:
    """What a percentage of "the step" is of: on GPU traces the step's GPU span (from its first GPU activity to its
    last, as HTA's figures are), else the step's wall time."""
    return "the step's GPU span" if gpu else "the step"


def format_bytes(size: float) -> str:
    """A byte count in binary units, like "1.50 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def rank_spans(ranks: Iterable[int], empty: str = "-") -> str:
    """``[0, 1, 2, 3, 6]`` -> ``'0-3, 6'`` (sorted, runs compressed); ``empty`` for no rank."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or empty


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'ranks 0-2, 5'``; ``[3]`` -> ``'rank 3'``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_spans(ranks, empty="")


def who(ranks: Sequence[int], title: str = "") -> str:
    """A finding's ranks after its title: ``' (rank 1)'``, ``' (ranks 0-2, 5)'``; ``''`` for none, or when ``title``
    names them already ("Rank 1 holds the others back ...": not "... (rank 1)" again). The text, the report and the box
    say it alike."""
    if not ranks:
        return ""
    named = format_ranks(ranks)
    return "" if re.search(rf"(?<![\w-]){re.escape(named)}(?![\w-])", title, re.IGNORECASE) else f" ({named})"


def flag_name(field_name: str) -> str:
    """``profiler_wait_steps`` -> ``--profiler-wait-steps``."""
    return "--" + field_name.replace("_", "-")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header, its separator, one line per row (cells as given, not escaped)."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(row)} |" for row in rows)]


def flag_table(
    cls: type,
    valid: Callable[[dataclasses.Field[Any]], str],
    default: Callable[[dataclasses.Field[Any]], str] = lambda f: f"`{f.default}`",
) -> str:
    """The flags of a dataclass as the guide's Markdown table: flag, default, valid values, description.

    Every field is a ``--flag-name`` whose help is ``metadata["help"]``.

    Args:
        cls: The flags' dataclass.
        valid: A field's valid values, as the table shows them.
        default: A field's default, as the table shows it (in backticks unless a caller says otherwise).

    Returns:
        The table, one line per field after the header, ending in a newline.
    """
    rows = [[f"`{flag_name(f.name)}`", default(f), valid(f), f.metadata["help"]] for f in dataclasses.fields(cls)]
    return "\n".join(markdown_table(["flag", "default", "valid values", "description"], rows)) + "\n"


def apart(value: float, bound: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, or more (up to 4) where those read as ``bound`` though the two differ: a
    ratio of 1.2452 against a 1.25 threshold reads "1.245", not "1.25 ...; below 1.25"."""
    for places in range(digits, 5):
        text = f"{value:.{places}f}"
        if value == bound or float(text) != bound:
            return text
    return text


def calls(per_step: float) -> str:
    """"11 calls", or "10.7 calls per step" on average (trial V: "in 10.6667 calls")."""
    return f"{per_step:g} calls" if float(per_step).is_integer() else f"{per_step:.1f} calls per step"
