"""The step timer's per-step records beside the traces (``timing_rank{R}.jsonl``), read once for the analysis.

A trace holds a few steps; the step timer measured every step of the same run, on every rank, into the same run
folder. The analysis reads those records for three things:

- each traced step's wait for a CPU (the imbalance verdict judges busy time less it, as the timer judges own work);
- the steps inside and outside the profiler's window (the profiler's slowdown);
- the slow-rank verdict over the untraced steps, judged again here with the one engine
  (:func:`hf_distprof.verdicts.judge_own_work`, what the live timer calls), so that a window too short for a
  verdict of its own is weighed with the rest of the run (:func:`hf_distprof.verdicts.across_the_run`).

Rows the step timer writes say whether the profiler traced their step and whether it was the timer's warm-up
(``traced``, ``warmup``) and what the ranks are compared on (``own_work_s``). Older files say neither: their
first row per file is the warm-up, and the verdict is not judged again from them (``timing_summary.json``'s
``imbalance_verdict`` stands in).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_distprof import names
from hf_distprof.runs.load import TIMING_RE
from hf_distprof.verdicts import KEPT_CELLS, SlowRankVerdict, judge_own_work


def _number(value: Any) -> float | None:
    """A finite number >= 0, else None (booleans, strings, NaN, negative values)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


@dataclass
class TimerRecords:
    """Every rank's step records, by step (a step written twice keeps its last row)."""

    rows: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    """rank -> step -> the row."""
    warmup: set[int] = field(default_factory=set)
    """Steps the timer left out as its warm-up (the first of each ``train()`` call), on any rank."""
    traced: set[int] = field(default_factory=set)
    """Steps the profiler ran over (warmup and active phases) by the rows' own marks; empty in older files."""
    marked: bool = False
    """Whether every row carries the ``traced`` / ``warmup`` marks (files of this version)."""

    def cpu_wait(self) -> dict[int, dict[int, float]]:
        """rank -> step -> seconds its training thread waited for a CPU in that step (``cpu_wait_s``)."""
        out: dict[int, dict[int, float]] = {}
        for rank, steps in self.rows.items():
            for step, row in steps.items():
                wait = _number(row.get("cpu_wait_s"))
                if wait is not None:
                    out.setdefault(rank, {})[step] = wait
        return out

    def step_times(self) -> dict[int, float]:
        """step -> its time (the slowest rank's ``step_s``; under DDP they are equal), warm-up left out."""
        out: dict[int, float] = {}
        for steps in self.rows.values():
            for step, row in steps.items():
                t = _number(row.get("step_s"))
                if t is not None and step not in self.warmup:
                    out[step] = max(out.get(step, 0.0), t)
        return out

    def verdict(self, threshold_pct: float, traced: Iterable[int] = ()) -> SlowRankVerdict | None:
        """The slow-rank verdict over the untraced steps, as the live step timer reaches it at train end.

        The steps every rank recorded, less the timer's warm-up and the steps the profiler ran over (its marks,
        plus ``traced``: the steps of the traces, which on-demand and anomaly windows add), among the latest steps
        the timer keeps (:data:`~hf_distprof.verdicts.KEPT_CELLS`); all of those when fewer than 2 remain (the
        timer's own rule).

        Returns:
            None for older files (no marks), fewer than 2 ranks, or a rank without a usable row.
        """
        if not self.marked or len(self.rows) < 2:
            return None
        ranks = sorted(self.rows)
        common = set.intersection(*(set(self.rows[r]) for r in ranks)) - self.warmup
        work: dict[int, dict[int, float]] = {r: {} for r in ranks}
        for r in ranks:
            for step in common:
                value = _number(self.rows[r][step].get("own_work_s"))
                if value is not None:
                    work[r][step] = value
        kept = sorted(set.intersection(*(set(w) for w in work.values())))[-max(64, KEPT_CELLS // len(ranks)):]
        skip = self.traced | set(traced)
        untraced = [s for s in kept if s not in skip]
        judged = untraced if len(untraced) >= 2 else kept
        if not judged:
            return None
        step_time = [max(_number(self.rows[r][s].get("step_s")) or 0.0 for r in ranks) for s in judged]
        return judge_own_work({r: [work[r][s] for s in judged] for r in ranks}, threshold_pct, step_time)


def read_timer_records(files: Iterable[str | Path]) -> TimerRecords:
    """The step timer's records in the folders of ``files`` (the traces); empty without any.

    A file that cannot be read, a line that is not a JSON object, or a row without an integer step is skipped.
    """
    out = TimerRecords()
    marks: list[bool] = []
    for folder in sorted({Path(f).parent for f in files}):
        for log in sorted(folder.glob(names.TIMING_LOG_NAME.format(rank="*"))):
            found = TIMING_RE.match(log.name)
            if not found:
                continue
            try:
                lines = log.read_text(encoding="utf-8").splitlines()
            except OSError:
                continue
            rank = int(found.group(1))
            first = True
            for line in lines:
                try:
                    row = json.loads(line) if line.strip() else None
                except (ValueError, RecursionError):
                    continue
                if not isinstance(row, dict):
                    continue
                step = row.get("step")
                if isinstance(step, bool) or not isinstance(step, int):
                    continue
                out.rows.setdefault(rank, {})[step] = row
                marked = isinstance(row.get("warmup"), bool) and isinstance(row.get("traced"), bool)
                marks.append(marked)
                if (row.get("warmup") is True) if marked else first:
                    out.warmup.add(step)
                if marked and row["traced"]:
                    out.traced.add(step)
                first = False
    out.marked = bool(marks) and all(marks)
    return out
