"""What the profiler decides when a window starts: which ranks trace it (``--profile-ranks auto``) and how many
steps it records (``--max-trace-mb``).

Owned by the profiler callback on every rank. The evidence travels with the note each rank sends on agreement
steps (:mod:`~.triggers`): this rank's new pre-sync step times, and the bytes per step of its
first trace. Every rank takes the same gathered notes, so when a window starts (the profiler is about to step
into its first step) every rank decides alike from what it holds: the same ranks, the same steps, no collective.
The decisions themselves are pure: :mod:`~.rank_targeting`, :mod:`~.trace_budget`.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerAction

from hf_distprof import dist, paths
from hf_distprof.callbacks.profiler.capture import Note
from hf_distprof.config import ProfilingArguments
from hf_distprof.core.names import PROFILE_RANKS_NAME
from hf_distprof.callbacks.profiler.rank_targeting import AUTO, VIEW_STEPS, RankChoice, RankView, choose_ranks
from hf_distprof.callbacks.profiler.trace_budget import TraceBudget

logger = dist.get_logger(__name__)

# This rank's untraced step times waiting for the next agreement step: no more than the view keeps (every rank
# receives every rank's rows, so at 1000+ ranks each extra row is kilobytes per logging step).
ROWS_KEPT = VIEW_STEPS


@dataclass(frozen=True)
class _Window:
    first: int
    first_recorded: int
    traced_here: bool
    allowed: int | None  # active steps the trace budget allows; None: as scheduled


class WindowPolicy:
    """Decides, at each window's first step, whether this rank traces it and how many steps it records.

    Args:
        args: The profiling flags (``--profile-ranks``, ``--max-trace-mb``, the window's length and options).
        run_dir: The run folder (rank 0 writes ``profile_ranks.json`` there).
        scheduled: The profiler's schedule before these decisions, by optimizer step (the regular cycle and the
            extra windows): the same on every rank.
        offset: ``global_step`` when training (re)started.
        step_timer: The step timer callback (``flush()``, ``step_listeners``): where ``auto`` gets its step times.
    """

    def __init__(self, args: ProfilingArguments, run_dir: Path, scheduled: Callable[[int], ProfilerAction],
                 offset: int, step_timer: Any = None) -> None:
        self.args = args
        self.run_dir = run_dir
        self.scheduled = scheduled
        self.offset = offset
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.auto = args.profile_ranks == AUTO
        self.budget = TraceBudget(args.max_trace_mb, args.profiler_active_steps) if args.max_trace_mb else None
        self.view = RankView()
        self.choices: list[RankChoice] = []
        self._rows: deque[tuple[int, float]] = deque(maxlen=ROWS_KEPT)
        self._bytes_per_step: float | None = None  # this rank's, from its first trace
        self._window: _Window | None = None
        self._cuts: list[tuple[int, int]] = []  # (first, last): steps --max-trace-mb kept from the profiler
        self._flush: Callable[[], Any] = lambda: None
        if self.auto:
            if step_timer is None:
                logger.warning("--profile-ranks auto: no step timer to read step times from; every window goes to "
                               "the first and the last rank")
            else:
                # A second train() call builds a new policy: the previous run's stops listening.
                step_timer.step_listeners[:] = [f for f in step_timer.step_listeners
                                                if not isinstance(getattr(f, "__self__", None), WindowPolicy)]
                step_timer.step_listeners.append(self.add_timing)
                self._flush = step_timer.flush

    @property
    def listening(self) -> bool:
        """Whether agreement steps carry anything for this policy (the same answer on every rank)."""
        return self.auto or self.budget is not None

    # ---- evidence, between and on agreement steps --------------------------------------------------

    def add_timing(self, timing: Any) -> None:
        """A step timer listener: keep the step's pre-sync work (less its wait for a CPU, as the slow-rank verdict
        judges it) unless the profiler ran over that step."""
        if self.scheduled(timing.step) == ProfilerAction.NONE:
            self._rows.append((int(timing.step), float(timing.own_work_s)))

    def note_fields(self) -> dict[str, Any]:
        """What this rank adds to its note on an agreement step (the step times not sent yet)."""
        rows: tuple[tuple[int, float], ...] = ()
        if self.auto:
            self._flush()  # the steps finished so far; this step's own goes with the next agreement
            rows = tuple(self._rows)
            self._rows.clear()
        return {"pre_sync": rows, "trace_bytes_per_step": self._bytes_per_step}

    def agree(self, step: int, notes: Sequence[Note]) -> None:
        """Take every rank's note, gathered on agreement step ``step`` (the same list on every rank)."""
        if self.auto:
            self.view.add(step, {n.rank: n.pre_sync for n in notes})
        if self.budget is not None and self.budget.add(step, [(n.rank, n.trace_bytes_per_step) for n in notes]):
            message = self.budget.message(self._options())
            if message:
                (logger.warning if self.rank == 0 else logger.info)(f"step {step}: {message}")

    def exported(self, trace: Path, steps: int) -> None:
        """The profiler wrote ``trace`` holding ``steps`` recorded steps; the first one is the measurement."""
        if self._bytes_per_step is not None or steps < 1:
            return
        try:
            size = trace.stat().st_size
        except OSError as err:  # gone already (a user's clean-up): the next trace measures
            logger.warning(f"--max-trace-mb: cannot read the size of {trace}: {err!r}")
            return
        self._bytes_per_step = size / steps
        if self.budget is not None:
            message = self.budget.first_window_message(size, steps)
            if message:  # (on the console once: each rank's own figure is in its log)
                (logger.warning if self.rank == min(self._tracers(), default=self.rank) else logger.info)(message)

    # ---- the profiler's side ------------------------------------------------------------------------

    def window_start(self, step: int) -> None:
        """Before the profiler steps into ``step``: when a window starts there, decide it for this rank."""
        if self.scheduled(step) == ProfilerAction.NONE:
            return
        before = self.scheduled(step - 1) if step - 1 > self.offset else ProfilerAction.NONE
        if before in (ProfilerAction.WARMUP, ProfilerAction.RECORD):
            return  # inside a window already decided
        first_recorded = step
        while self.scheduled(first_recorded) == ProfilerAction.WARMUP:
            first_recorded += 1
        traced_here = True
        if self.auto:
            choice = choose_ranks(self.view, self.world_size, step, self.args.imbalance_threshold_pct)
            traced_here = self.rank in choice.ranks
            self._record(choice)
        allowed = self.budget.allowed_steps() if self.budget is not None else None
        if allowed is not None and allowed < self.args.profiler_active_steps:
            what = "skipped" if allowed == 0 else f"records {allowed} of {self.args.profiler_active_steps} active steps"
            logger.info(f"--max-trace-mb: the window from step {step} {what}")
            last = first_recorded
            while self.scheduled(last) == ProfilerAction.RECORD and last - first_recorded < 1_000_000:
                last += 1  # (to its RECORD_AND_SAVE step: the window's last)
            # The steps no rank's profiler runs over now (the budget is the same on every rank): not traced.
            self._cuts.append((step if allowed == 0 else first_recorded + allowed, last))
        self._window = _Window(step, first_recorded, traced_here and allowed != 0, allowed)

    def phase(self, step: int) -> str | None:
        """No window of its own (the schedule's registry reads :meth:`cut` of this policy)."""
        return None

    def cut(self, step: int) -> bool:
        """Whether ``--max-trace-mb`` kept the profiler from ``step`` (a shortened window's later steps, a skipped
        window's all): :func:`~hf_distprof.callbacks.profiler.schedule.traced_steps` counts it untraced."""
        return any(first <= step <= last for first, last in self._cuts)

    def filter(self, step: int, action: ProfilerAction) -> ProfilerAction:
        """The profiler's action at ``step`` after this rank's decisions for the current window."""
        window = self._window
        if action == ProfilerAction.NONE or window is None or step < window.first:
            return action
        if not window.traced_here:
            return ProfilerAction.NONE
        if window.allowed is None or step < window.first_recorded:
            return action
        position = step - window.first_recorded
        if position == window.allowed - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE if position >= window.allowed else action

    # ---- internals ----------------------------------------------------------------------------------

    def _tracers(self) -> list[int]:
        """The ranks that trace the current window (the lowest one's console speaks for them)."""
        if self.auto and self.choices:
            return list(self.choices[-1].ranks)
        ranks = self.args.profile_rank_set
        return sorted(r for r in ranks if r < self.world_size) if ranks is not None else list(range(self.world_size))

    def _record(self, choice: RankChoice) -> None:
        self.choices.append(choice)
        ranks = ", ".join(map(str, choice.ranks))
        message = f"--profile-ranks auto: the window from step {choice.window_first} is traced on ranks {ranks}; " \
                  f"why: {choice.reason}"
        if self.rank != 0:
            logger.info(message)
            return
        logger.warning(message)
        record = {"world_size": self.world_size, "windows": [c.to_json() for c in self.choices]}
        try:
            paths.atomic_write_text(self.run_dir / PROFILE_RANKS_NAME, json.dumps(record, indent=2) + "\n")
        except OSError as err:
            logger.warning(f"could not write {self.run_dir / PROFILE_RANKS_NAME}: {err!r}; the choice is in the log")

    def _options(self) -> dict[str, bool]:
        a = self.args
        return {"with_stack": a.profiler_with_stack, "profile_memory": a.profiler_profile_memory,
                "record_shapes": a.profiler_record_shapes, "with_flops": a.profiler_with_flops}
