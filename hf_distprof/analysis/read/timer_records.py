"""The step timer's per-step records beside the traces (``timing_rank{R}.jsonl``), read once for the analysis.

A trace holds a few steps; the step timer measured every step of the same run, on every rank, into the same run
folder. The analysis reads those records for three things:

- each traced step's wait for a CPU (the imbalance verdict judges busy time less it, as the timer judges own work);
- the steps inside and outside the profiler's window (the profiler's slowdown);
- the slow-rank verdict over the untraced steps, judged again here with the one engine
  (:func:`hf_distprof.core.verdicts.judge_own_work`, what the live timer calls), so that a window too short for a
  verdict of its own is weighed with the rest of the run (:func:`hf_distprof.core.verdicts.across_the_run`).

Rows the step timer writes say whether the profiler traced their step and whether it was the timer's warm-up
(``traced``, ``warmup``) and what the ranks are compared on (``own_work_s``). Older files say neither: their
first row per file is the warm-up, and the verdict is not judged again from them (``timing_summary.json``'s
``imbalance_verdict`` stands in).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_distprof.core import names
from hf_distprof.core.names import TIMING_RE
from hf_distprof.core.stats import finite
from hf_distprof.core.verdicts import KEPT_CELLS, OWN_WORK, SlowRankVerdict, judge_own_work, judge_slow_rank

# The phases of a step the timer records, each by its keys in order of preference.
PHASE_KEYS = {
    "data": ("data_load_s", "data_s"),
    "forward": ("forward_s",),
    "backward": ("backward_compute_s", "backward_s"),
    "optimizer": ("optimizer_s",),
}


def _number(value: Any) -> float | None:
    """A finite number >= 0, else None (booleans, strings, NaN, negative values)."""
    number = finite(value)
    return number if number is not None and number >= 0 else None


@dataclass
class TimerRecords:
    """Every rank's step records, by step (a step written twice keeps its last row)."""

    rows: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    """rank -> step -> the row."""
    warmup: set[int] = field(default_factory=set)
    """Steps the timer left out as its warm-up (the first of each ``train()`` call), on any rank."""
    traced: set[int] = field(default_factory=set)
    """Steps the profiler ran over (warmup and active phases) by the rows' own marks; empty in older files."""
    busy: set[int] = field(default_factory=set)
    """Untraced steps during which the profiler was still busy with a written trace (its compact summary's thread
    takes the GIL): left out of the verdict and of the profiler's slowdown, on neither side."""
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

    def own_work(self) -> dict[int, dict[int, float]]:
        """rank -> step -> the step's own work as the timer judges it (``own_work_s``); empty for older files."""
        out: dict[int, dict[int, float]] = {}
        for rank, steps in self.rows.items():
            for step, row in steps.items():
                value = _number(row.get("own_work_s"))
                if value is not None:
                    out.setdefault(rank, {})[step] = value
        return out

    def step_times(self) -> dict[int, float]:
        """step -> its time (the slowest rank's ``step_s``; under DDP they are equal), warm-up left out."""
        out: dict[int, float] = {}
        for steps in self.rows.values():
            for step, row in steps.items():
                t = _number(row.get("step_s"))
                if t is not None and step not in self.warmup and step not in self.busy:
                    out[step] = max(out.get(step, 0.0), t)
        return out

    def verdict(self, threshold_pct: float, traced: Iterable[int] = (), material: bool = True
                ) -> SlowRankVerdict | None:
        """The slow-rank verdict over the untraced steps, as the live step timer reaches it at train end.

        The steps every rank recorded, less the timer's warm-up and the steps the profiler ran over (its marks,
        plus ``traced``: the steps of the traces, which on-demand and anomaly windows add), among the latest steps
        the timer keeps (:data:`~hf_distprof.core.verdicts.KEPT_CELLS`); all of those when fewer than 2 remain (the
        timer's own rule).

        With ``material=False`` the excess is not held against the step time (:func:`judge_slow_rank`'s materiality):
        the question is then only whether it is real (beyond the noise, persistent), whatever it costs.

        Returns:
            None for older files (no marks), fewer than 2 ranks, or a rank without a usable row.
        """
        judged = self.judged_steps(traced)
        if not judged:
            return None
        ranks = sorted(self.rows)
        step_time = [max(self._own_step(self.rows[r][s]) for r in ranks) for s in judged]
        work = {r: [float(self.rows[r][s]["own_work_s"]) for s in judged] for r in ranks}
        if not material:
            return judge_slow_rank(work, threshold_pct, what=OWN_WORK)
        return judge_own_work(work, threshold_pct, step_time)

    @staticmethod
    def _own_step(row: dict[str, Any]) -> float:
        """The step less the wait for a CPU (``own_step_s``; the step time in rows written before it)."""
        own = _number(row.get("own_step_s"))
        return own if own is not None else (_number(row.get("step_s")) or 0.0)

    def own_steps(self) -> dict[int, float]:
        """step -> the step time less the ranks' wait for a CPU (the largest over ranks), on every rank's steps."""
        out: dict[int, float] = {}
        for steps in self.rows.values():
            for step, row in steps.items():
                out[step] = max(out.get(step, 0.0), self._own_step(row))
        return out

    def judged_steps(self, traced: Iterable[int] = ()) -> list[int]:
        """The steps :meth:`verdict` judges, in order (empty for older files or fewer than 2 ranks)."""
        if not self.marked or len(self.rows) < 2:
            return []
        ranks = sorted(self.rows)
        common = set.intersection(*(set(self.rows[r]) for r in ranks)) - self.warmup
        usable = [s for s in common if all(_number(self.rows[r][s].get("own_work_s")) is not None for r in ranks)]
        kept = sorted(usable)[-max(64, KEPT_CELLS // len(ranks)):]
        skip = self.traced | self.busy | set(traced)
        untraced = [s for s in kept if s not in skip]
        return untraced if len(untraced) >= 2 else kept

    def phases(self, steps: Iterable[int]) -> dict[str, dict[int, list[float]]]:
        """phase -> rank -> its seconds in each of ``steps`` (data: inside the loader, else the data wait; forward;
        backward compute, else the whole backward; optimizer); a phase some row lacks is left out."""
        steps = list(steps)
        out: dict[str, dict[int, list[float]]] = {}
        for phase, keys in PHASE_KEYS.items():
            values: dict[int, list[float]] = {}
            for rank, rows in sorted(self.rows.items()):
                got = [next((v for v in (_number(rows[s].get(k)) for k in keys) if v is not None), None)
                       if s in rows else None for s in steps]
                if any(v is None for v in got):
                    break
                values[rank] = [float(v or 0.0) for v in got]
            else:
                if steps and values:
                    out[phase] = values
        return out


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
                if row.get("profiler_busy") is True:
                    out.busy.add(step)
                first = False
    out.marked = bool(marks) and all(marks)
    return out
