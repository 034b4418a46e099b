"""When an extra profiler window opens, on demand or on a slow step: the decisions, as pure code.

Between agreement steps each rank only notes what it saw: a request (``PROFILE_NOW`` in the run folder,
SIGUSR1) or a step slower than ``--anomaly-factor`` times its own running median (:class:`SlowStepDetector`).
Agreement steps follow their own cadence, independent of the Trainer's logging interval: every
:func:`agreement_interval` steps (1 to :data:`MAX_AGREE_EVERY`, from the measured step time and the agreement's
own cost), the same step numbers on every rank. On an agreement step each rank starts a small non-blocking
all-gather of its :class:`Note` (:func:`encode_note`); one step later every rank reads it, by then long done,
and hands the same list to its own :class:`CapturePlan`, which therefore opens the same window on every rank:
its warm-up starts at the first free step after the reading step, so every rank starts tracing at the same
optimizer step without a blocking collective on any step. The profiler's schedule asks
:meth:`CapturePlan.phase` about every step its own schedule leaves idle.

Nothing here reads a clock, a file or a process group: :mod:`hf_distprof.callbacks.profiler.triggers` does that.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hf_distprof.core.names import ANOMALY, ON_DEMAND  # noqa: F401 (re-exported: Window.causes)

# The first optimizer steps of a train() call pay one-off costs (allocator and cache warm-up, DDP's bucket
# rebuild): they are never judged and never enter the median.
WARMUP_SKIP_STEPS = 3
# The running median covers this rank's last steps that the profiler did not trace.
HISTORY_STEPS = 20
# No verdict before the median has this many steps behind it.
MIN_HISTORY_STEPS = 5
# How far past the agreement step a free slot for the window is looked for (a schedule repeating with no idle
# steps leaves none).
SEARCH_HORIZON_STEPS = 10_000

# Agreement steps come at most this many steps apart: a request or an anomaly waits at most this many steps, plus
# the one step its gather travels, plus the window's warm-up, before recording starts (8 at the defaults).
MAX_AGREE_EVERY = 5
# Agreements come every step when one costs at most this share of a step, else as often as that share allows.
AGREEMENT_COST_SHARE = 0.001
# Steps of the pre-sync times one note carries (--profile-ranks auto); a note has a fixed length on the wire.
NOTE_ROWS = 16

# What a window does at one step, as CapturePlan.phase says it (the profiler maps them to ProfilerAction).
WARMUP = "warmup"
RECORD = "record"
RECORD_AND_SAVE = "record_and_save"

# Where an on-demand request came from (Note.demand).
FILE_REQUEST = "PROFILE_NOW"
SIGNAL_REQUEST = "SIGUSR1"

# What opened an extra window (Window.causes; the run manifest's "reasons"): ON_DEMAND, ANOMALY (core.names).


@dataclass(frozen=True)
class Anomaly:
    """One step that took longer than the factor times the running median of the steps before it."""

    step: int
    step_s: float
    median_s: float

    @property
    def ratio(self) -> float:
        """The step's time over the median."""
        return self.step_s / self.median_s if self.median_s > 0 else float("inf")


@dataclass(frozen=True)
class Note:
    """What one rank saw since the previous agreement step; gathered from every rank on agreement steps.

    Attributes:
        rank: The rank that saw it.
        demand: The on-demand requests seen (:data:`FILE_REQUEST`, :data:`SIGNAL_REQUEST`), in that order.
        anomaly: The slowest step against the median since the previous agreement step, if any was over the
            factor.
        pre_sync: ``--profile-ranks auto``: this rank's ``(step, pre-sync seconds)`` of the untraced steps
            finished since its previous note (:mod:`hf_distprof.callbacks.profiler.rank_targeting`).
        trace_bytes_per_step: ``--max-trace-mb``: bytes per recorded step of this rank's first trace; None
            before it (:mod:`hf_distprof.callbacks.profiler.trace_budget`).
    """

    rank: int
    demand: tuple[str, ...] = ()
    anomaly: Anomaly | None = None
    pre_sync: tuple[tuple[int, float], ...] = ()
    trace_bytes_per_step: float | None = None
    step_s: float | None = None
    """This rank's median untraced step time, seconds (the cadence)."""
    agree_s: float | None = None
    """What this rank's agreements cost it so far (median seconds of starting and reading the gather)."""


_NOTE_HEAD = 10  # rank, 2 demand flags, anomaly (flag, step, s, median), bytes per step, step_s, agree_s
NOTE_LENGTH = _NOTE_HEAD + 1 + 2 * NOTE_ROWS


def _opt(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _back(value: float) -> float | None:
    return None if math.isnan(value) else value


def encode_note(note: Note) -> list[float]:
    """``note`` as :data:`NOTE_LENGTH` floats, for one fixed-size all-gather (the last :data:`NOTE_ROWS` rows)."""
    a = note.anomaly
    rows = note.pre_sync[-NOTE_ROWS:]
    values = [float(note.rank), float(FILE_REQUEST in note.demand), float(SIGNAL_REQUEST in note.demand),
              float(a is not None), float(a.step) if a else 0.0, a.step_s if a else 0.0, a.median_s if a else 0.0,
              _opt(note.trace_bytes_per_step), _opt(note.step_s), _opt(note.agree_s), float(len(rows))]
    for step, seconds in rows:
        values += [float(step), float(seconds)]
    values += [math.nan] * (NOTE_LENGTH - len(values))
    return values


def decode_note(values: Sequence[float]) -> Note:
    """The :class:`Note` that :func:`encode_note` made ``values`` of."""
    if len(values) != NOTE_LENGTH:
        raise ValueError(f"a capture note has {NOTE_LENGTH} values, got {len(values)}")
    demand = tuple(source for source, flag in ((FILE_REQUEST, values[1]), (SIGNAL_REQUEST, values[2])) if flag)
    anomaly = Anomaly(int(values[4]), values[5], values[6]) if values[3] else None
    count = int(values[_NOTE_HEAD])
    rows = tuple((int(values[_NOTE_HEAD + 1 + 2 * i]), values[_NOTE_HEAD + 2 + 2 * i]) for i in range(count))
    return Note(int(values[0]), demand, anomaly, rows, _back(values[7]), _back(values[8]), _back(values[9]))


def agreement_interval(notes: Sequence[Note], max_every: int = MAX_AGREE_EVERY) -> int:
    """Steps until the next agreement, from every rank's notes (so the same on every rank).

    Every step when an agreement costs at most :data:`AGREEMENT_COST_SHARE` of a step (the slowest rank's cost
    against the median rank's step time), else as rarely as keeps it there, at most every ``max_every`` steps;
    ``max_every`` while nothing is measured yet.
    """
    steps = sorted(n.step_s for n in notes if n.step_s is not None and n.step_s > 0)
    costs = [n.agree_s for n in notes if n.agree_s is not None and n.agree_s >= 0]
    if not steps or not costs:
        return max_every
    step_s = steps[len(steps) // 2]
    return max(1, min(max_every, math.ceil(max(costs) / (AGREEMENT_COST_SHARE * step_s) - 1e-9)))


@dataclass(frozen=True)
class Window:
    """An extra profiler window: warm-up from ``first``, recorded from ``first_recorded`` to ``last``."""

    first: int
    first_recorded: int
    last: int
    agreed_at: int
    reason: str
    causes: tuple[str, ...] = ()
    """:data:`ON_DEMAND` and/or :data:`ANOMALY`: what opened it."""

    def phase(self, step: int) -> str | None:
        """What the profiler does at ``step`` in this window; None outside it."""
        if step < self.first or step > self.last:
            return None
        if step < self.first_recorded:
            return WARMUP
        return RECORD_AND_SAVE if step == self.last else RECORD


@dataclass(frozen=True)
class Decision:
    """The outcome of one agreement step: the window opened (None: none) and what to log ("": nothing)."""

    window: Window | None
    message: str


class SlowStepDetector:
    """One rank's step times against their running median; names the steps slower than ``factor`` times it.

    Args:
        factor: A step slower than this many times the median is an anomaly (``--anomaly-factor``).
        start_step: ``global_step`` when training (re)started; the :data:`WARMUP_SKIP_STEPS` after it are skipped.
        history: Steps in the running median.
        min_history: Steps the median needs before any verdict.
    """

    def __init__(self, factor: float, start_step: int = 0, history: int = HISTORY_STEPS,
                 min_history: int = MIN_HISTORY_STEPS) -> None:
        self.factor = factor
        self.start_step = start_step
        self.min_history = min_history
        self._times: deque[float] = deque(maxlen=history)

    def add(self, step: int, seconds: float, traced: bool = False) -> Anomaly | None:
        """Take one step's wall time; returns the anomaly when it is one.

        Args:
            step: The optimizer step (``global_step`` after it).
            seconds: Its wall time.
            traced: Whether the profiler ran over it: such a step is slowed by the profiler itself, so it is
                neither judged nor counted.
        """
        if traced or step <= self.start_step + WARMUP_SKIP_STEPS:
            return None
        anomaly = None
        if len(self._times) >= self.min_history:
            median = statistics.median(self._times)
            if seconds > self.factor * median:
                anomaly = Anomaly(step, seconds, median)
        # The slow step enters the median too: a slowdown that lasts becomes the new normal after a few steps,
        # rather than an anomaly at every step.
        self._times.append(seconds)
        return anomaly


class CapturePlan:
    """The extra windows of one run, decided identically on every rank from the same gathered notes.

    Args:
        warmup_steps: Warm-up steps of each window (``--profiler-warmup-steps``).
        active_steps: Recorded steps of each window (``--profiler-active-steps``).
        max_steps: The run's last optimizer step; no window starts recording after it.
        busy: Whether the regular schedule traces a step (warm-up or active): windows never overlap it.
        on_demand: Whether ``--profile-on-demand`` is on.
        max_anomaly_captures: Windows that anomalies may open (``--max-anomaly-captures``); 0 when
            ``--profile-on-anomaly`` is off.
        anomaly_factor: ``--anomaly-factor``, for the log message.
    """

    def __init__(self, warmup_steps: int, active_steps: int, max_steps: int, busy: Callable[[int], bool],
                 on_demand: bool = False, max_anomaly_captures: int = 0, anomaly_factor: float = 2.0) -> None:
        self.warmup_steps = warmup_steps
        self.active_steps = active_steps
        self.max_steps = max_steps
        self.busy = busy
        self.on_demand = on_demand
        self.max_anomaly_captures = max_anomaly_captures
        self.anomaly_factor = anomaly_factor
        self.windows: list[Window] = []
        self.anomaly_captures = 0

    @property
    def watching_anomalies(self) -> bool:
        """Whether an anomaly may still open a window."""
        return self.anomaly_captures < self.max_anomaly_captures

    @property
    def listening(self) -> bool:
        """Whether agreement steps still have anything to agree on (the same answer on every rank)."""
        return self.on_demand or self.watching_anomalies

    def phase(self, step: int) -> str | None:
        """What the extra windows do at ``step``: :data:`WARMUP`, :data:`RECORD`, :data:`RECORD_AND_SAVE` or None."""
        for window in reversed(self.windows):  # the latest first: a plan holds few windows
            phase = window.phase(step)
            if phase is not None:
                return phase
        return None

    def traced(self, step: int) -> bool:
        """Whether the profiler runs over ``step``, by the regular schedule or an extra window."""
        return self.busy(step) or self.phase(step) is not None

    def agree(self, step: int, notes: Sequence[Note]) -> Decision:
        """Decide, on agreement step ``step``, from every rank's notes, whether a window opens and where.

        A window opens at the first step after ``step`` from which its warm-up and active steps are free of
        the regular schedule's and of other windows. A request that comes while an extra window is still to
        run is folded into it. An anomaly counts against ``--max-anomaly-captures`` only when it opens a
        window.

        Args:
            step: The agreement step (the same on every rank).
            notes: One note per rank, as gathered (the same list on every rank).

        Returns:
            The window opened, if any, and the message to log.
        """
        demand = [(n.rank, source) for n in notes for source in n.demand]
        anomalies = [n for n in notes if n.anomaly is not None] if self.watching_anomalies else []
        if not demand and not anomalies:
            return Decision(None, "")
        why = "; ".join(filter(None, (_demand_text(demand), self._anomaly_text(anomalies))))
        pending = next((w for w in self.windows if w.last > step), None)
        if pending is not None:
            return Decision(None, f"{why}: the window opened at step {pending.agreed_at} (steps "
                                  f"{pending.first}-{pending.last}) covers it; no other window")
        start = self._free_start(step + 1)
        if start is None:
            return Decision(None, f"{why}: no room for a window ({self.warmup_steps} warm-up + {self.active_steps} "
                                  f"active steps) between step {step + 1} and the end of training (step "
                                  f"{self.max_steps}) outside the regular schedule's; no window")
        window = Window(first=start, first_recorded=start + self.warmup_steps,
                        last=start + self.warmup_steps + self.active_steps - 1, agreed_at=step, reason=why,
                        causes=(ON_DEMAND,) * bool(demand) + (ANOMALY,) * bool(anomalies))
        self.windows.append(window)
        if anomalies:
            self.anomaly_captures += 1
        recorded = f"{window.first_recorded}-{window.last}"
        if window.last > self.max_steps:
            recorded += f", cut at step {self.max_steps} by the end of training"
        warmup = {0: "", 1: f"warm-up {window.first}, "}.get(
            self.warmup_steps, f"warm-up {window.first}-{window.first_recorded - 1}, ")
        return Decision(window, f"profiling window opened at step {step}: {warmup}recorded {recorded}, "
                                f"on every profiling rank; why: {why}")

    def _free_start(self, earliest: int) -> int | None:
        """The first step from ``earliest`` on where a whole window fits (cut at the end of training)."""
        length = self.warmup_steps + self.active_steps
        latest = min(self.max_steps - self.warmup_steps, earliest + SEARCH_HORIZON_STEPS)
        for start in range(earliest, latest + 1):
            end = min(start + length - 1, self.max_steps)
            if not any(self.traced(s) for s in range(start, end + 1)):
                return start
        return None

    def _anomaly_text(self, notes: Sequence[Note]) -> str:
        if not notes:
            return ""
        slowest = sorted(notes, key=lambda n: -n.anomaly.ratio if n.anomaly else 0.0)
        parts = [f"rank {n.rank}'s step {n.anomaly.step} took {n.anomaly.step_s:.3f} s, {n.anomaly.ratio:.1f}x its "
                 f"running median of {n.anomaly.median_s:.3f} s" for n in slowest if n.anomaly is not None]
        captures = f"anomaly capture {self.anomaly_captures + 1} of {self.max_anomaly_captures}"
        return (f"--profile-on-anomaly ({captures}; over --anomaly-factor {self.anomaly_factor:g}): "
                + "; ".join(parts))


def _demand_text(demand: Sequence[tuple[int, str]]) -> str:
    """``on demand: PROFILE_NOW on ranks 0, 1, SIGUSR1 on rank 1`` (a shared run folder: every rank sees the file)."""
    if not demand:
        return ""
    parts = []
    for source in (FILE_REQUEST, SIGNAL_REQUEST):
        ranks = sorted({rank for rank, s in demand if s == source})
        if ranks:
            parts.append(f"{source} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}")
    return "on demand: " + ", ".join(parts)
