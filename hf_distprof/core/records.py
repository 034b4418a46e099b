"""The step timer's and the memory logger's JSON-lines files (``timing_rank{R}.jsonl``, ``memory_rank{R}.jsonl``),
read by one rule wherever they are read (``analyze``, ``compare``, ``scaling``): a line is a JSON object with an
integer ``step`` and numbers (or the step timer's boolean marks) for values; a last line cut short by a killed run is
dropped. Any other line that breaks the rule is said with its path and line: ``compare`` and ``scaling`` refuse the
run (:func:`read_records`), ``analyze`` reads the other lines (:func:`read_records_skipping`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

MARK_KEYS = frozenset({"warmup", "traced", "profiler_busy", "after_pause"})
"""The step timer's marks of a step in ``timing_rank{R}.jsonl`` (booleans: its warm-up, a step the profiler ran over
or was still busy during, the step after a pause)."""


class RecordsError(ValueError):
    """A records file that breaks the rule; the message names the file (and the line)."""


def is_number(value: Any, integer: bool = False) -> bool:
    """A finite JSON number (an integer when ``integer``), or null where a number may be missing."""
    if value is None:
        return not integer
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    return math.isfinite(value)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of ``path``, in file order.

    Raises:
        RecordsError: The file cannot be read, is not UTF-8, or a line other than a cut-short last one is not a record.
    """
    return [record for record in _records(path, _lines(path), skip=False) if record is not None]


def read_records_skipping(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record of ``path`` that is one, and why each line that is not was skipped (``"line 7: not JSON
    (...)"``): one garbled line must not cost a rank all its records (the analysis then re-judged the ranks without
    the slow one, and cleared it).

    Raises:
        RecordsError: The file cannot be read or is not UTF-8.
    """
    skipped: list[str] = []
    records = [r for r in _records(path, _lines(path), skip=True, skipped=skipped) if r is not None]
    return records, skipped


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise RecordsError(f"{path}: cannot be read ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise RecordsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def _records(path: Path, lines: list[str], skip: bool, skipped: list[str] | None = None) -> list[dict[str, Any] | None]:
    """Each line's record (None for a blank one or a cut-short last one); a line that is not a record raises
    :class:`RecordsError`, or with ``skip`` is None and its reason (after the path) goes to ``skipped``."""
    out: list[dict[str, Any] | None] = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(_record(path, number, line, last=number == len(lines)))
        except RecordsError as err:
            if not skip:
                raise
            if skipped is not None:
                skipped.append(str(err).removeprefix(f"{path}, "))
            out.append(None)
    return out


def _record(path: Path, number: int, line: str, last: bool) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        if last:
            return None  # a last line cut short by a run that was killed: the lines before it hold
        raise RecordsError(f"{path}, line {number}: not JSON ({err.msg})") from err
    except RecursionError as err:
        raise RecordsError(f"{path}, line {number}: not a record (nested too deeply)") from err
    if not isinstance(record, dict) or "step" not in record:
        raise RecordsError(f"{path}, line {number}: a record without a 'step'")
    # The step timer and the memory logger write numbers, and the step timer its marks of a step (booleans):
    # anything else is not their file.
    wrong = next((k for k, v in record.items()
                  if not (is_number(v, integer=k == "step") or (k in MARK_KEYS and isinstance(v, bool)))), None)
    if wrong is not None:
        raise RecordsError(f"{path}, line {number}: {wrong!r} is {record[wrong]!r}, not a number")
    return record
