"""The step timer's and the memory logger's JSON-lines files (``timing_rank{R}.jsonl``, ``memory_rank{R}.jsonl``),
read by one rule wherever they are read (``analyze``, ``compare``, ``scaling``): a line is a JSON object with an
integer ``step`` and numbers (or the step timer's boolean marks) for values; a last line cut short by a killed run is
dropped, any other line that breaks the rule makes the file unreadable, said with its path and line."""

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
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise RecordsError(f"{path}: cannot be read ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise RecordsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # a last line cut short by a run that was killed: the lines before it hold
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
        records.append(record)
    return records
