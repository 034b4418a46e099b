"""What every tracker adapter shares: the :class:`Answer`, the figure names, and the once-per-tracker warning.

Kept free of any tracker library (and of torch) so that importing :mod:`hf_distprof.trackers` costs nothing until
a tracker is actually written to.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The version of the naming scheme below (figure names, tags, artifact layout), the same number as analysis.json's
# "schema_version". Written with every answer (hf_distprof/schema_version) so that a dashboard built on these names
# can tell when they change.
from hf_distprof.core.names import SCHEMA_VERSION  # noqa: F401

PREFIX = "hf_distprof/"
ANSWER_TAG = "hf_distprof/answer"
"""TensorBoard text tag, Trackio Markdown key, and (``.md``) the MLflow / W&B file of the Markdown answer."""
FINDINGS_KEY = "hf_distprof/findings"
"""The findings' count (a key figure, every tracker), and ``hf_distprof/findings.json`` in MLflow: the table."""
FINDINGS_TABLE_KEY = "hf_distprof/findings_table"
"""The findings table in W&B and Trackio (under ``FINDINGS_KEY`` until schema version 2, it hid the count there)."""
SCHEMA_KEY = "hf_distprof/schema_version"
STEP_KEY = "train/global_step"
"""The Trainer's own x-axis key in W&B and Trackio (its callbacks log every row with it, without an explicit
step): our rows carry it too, so they line up with the loss on that axis."""
ARTIFACT_TYPE = "hf_distprof-report"

logger = logging.getLogger("hf_distprof.trackers")


@dataclass
class Answer:
    """What one run's analysis says, in tracker-neutral form.

    Plain data only, so that the analysis never depends on a tracker and a tracker adapter never depends on the
    analysis.

    Attributes:
        text: Markdown: the verdict box and the findings table, already formatted.
        scalars: Key figures, named like ``hf_distprof/exposed_comm_pct`` or ``hf_distprof/whatif/<name>_s``.
        summary: Headline values (``verdict``, ``slowest_rank``, ``exposed_comm_pct``, ...); names without the
            ``hf_distprof/`` prefix get it added (:func:`summary_name`).
        table: The findings table, ``(columns, rows)``.
        artifacts: Files (or folders) to attach: report.html, analysis.json, timing_summary.json, ...; those that
            do not exist are skipped.
        step: The step the scalars belong to: the run's last step.
    """

    text: str
    scalars: dict[str, float] = field(default_factory=dict)
    summary: dict[str, str | float | int | None] = field(default_factory=dict)
    table: tuple[list[str], list[list[str | float | int | None]]] = field(default_factory=lambda: ([], []))
    artifacts: list[Path] = field(default_factory=list)
    step: int = 0


class NoRun(Exception):
    """The tracker has no run open to log into; we never open one on the user's behalf."""


class Skip(Exception):
    """Nothing to send to this tracker, for a reason that is not a failure (the message says which)."""


def summary_name(key: str) -> str:
    """The tracker-side name of a summary value: ours are all under ``hf_distprof/`` so that they never collide
    with the user's own summary keys (a bare ``verdict`` could)."""
    return key if key.startswith(PREFIX) else PREFIX + key


def as_number(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a real number (str, None, bool) or not finite.

    Non-finite figures are dropped rather than sent: MLflow and TensorBoard would chart a NaN as a gap at best,
    and Trackio stores it as the string ``"NaN"``; a missing figure says "not computed" just as well.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def numbers_of(figures: Mapping[str, object]) -> dict[str, float]:
    """The finite numeric entries of ``figures``, as floats (numpy scalars included)."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        number = as_number(value)
        if number is not None:
            out[key] = number
    return out


def log_live(run: Any, figures: Mapping[str, object], step: int) -> None:
    """``run.log`` of the finite figures in one row with ``train/global_step = step`` (W&B's and Trackio's runs log
    alike); nothing when none is finite."""
    numbers = numbers_of(figures)
    if numbers:
        run.log({**numbers, STEP_KEY: step})


def plain(value: object) -> str | float | int | bool | None:
    """A JSON-plain form of a summary or table value (numpy scalars become Python numbers, anything else
    unknown becomes its ``str``), so that every tracker stores the same thing."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


def answer_numbers(answer: Answer) -> dict[str, float]:
    """The figures charted at ``answer.step``: the scalars, then each numeric summary value under its summary
    name (unless a scalar already has that name), so a headline number is comparable across runs even when the
    analysis did not list it among the scalars."""
    out = numbers_of(answer.scalars)
    for key, value in answer.summary.items():
        name = summary_name(key)
        number = as_number(value)
        if number is not None and name not in out:
            out[name] = number
    return out


def answer_summary(answer: Answer) -> dict[str, str | float | int | bool | None]:
    """``answer.summary`` under the tracker-side names, values made JSON-plain."""
    return {summary_name(key): plain(value) for key, value in answer.summary.items()}


def answer_strings(answer: Answer) -> dict[str, str]:
    """The non-numeric, non-empty summary values (verdict, bottleneck kind, ...) as strings, under their summary
    names: what becomes tags (MLflow) or hparams (TensorBoard)."""
    out: dict[str, str] = {}
    for key, value in answer.summary.items():
        if value is None or as_number(value) is not None:
            continue
        out[summary_name(key)] = str(plain(value))
    return out


def table_rows(answer: Answer) -> tuple[list[str], list[list[str | float | int | bool | None]]]:
    """The findings table with plain values, each row padded or cut to the number of columns (W&B and Trackio
    both reject ragged rows)."""
    columns = [str(c) for c in answer.table[0]]
    width = len(columns)
    rows: list[list[str | float | int | bool | None]] = []
    for row in answer.table[1]:
        cells = [plain(v) for v in row][:width]
        rows.append(cells + [None] * (width - len(cells)))
    return columns, rows


def attachable(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """The existing files and folders among ``paths``, each with a unique relative name inside the attachment.

    The name is the file's own; two files of the same name (the timing summaries of two folders) are told apart
    by a folder in front: their parent folder's name, then a counter. The last part always stays the file's own
    name, because MLflow's ``log_artifact`` cannot rename a file.
    """
    out: list[tuple[Path, str]] = []
    taken: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            logger.debug("not attaching %s: it does not exist", path)
            continue
        name = path.name
        if name in taken:
            name = f"{path.parent.name or 'root'}/{path.name}"
        counter = 2
        while name in taken:
            name = f"{counter}/{path.name}"
            counter += 1
        taken.add(name)
        out.append((path, name))
    return out


_ARTIFACT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def artifact_name(run_name: str) -> str:
    """``hf_distprof-<run>``, with the characters W&B and Trackio refuse in artifact names replaced by ``-``."""
    cleaned = _ARTIFACT_NAME.sub("-", run_name).strip("-.") or "run"
    return f"hf_distprof-{cleaned}"


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(tracker: str, message: str) -> None:
    """One ``logging.warning`` per tracker per process; later problems with the same tracker go to DEBUG.

    Live figures are sent at every logging step: a tracker that is missing or broken must not flood the log.
    """
    with _warned_lock:
        first = tracker not in _warned
        _warned.add(tracker)
    if first:
        logger.warning(message)
    else:
        logger.debug(message)


def forget_warnings() -> None:
    """Let every tracker warn once more: for a process that trains several times (a sweep), between runs."""
    with _warned_lock:
        _warned.clear()
