"""What opens an extra profiler window while training runs: ``PROFILE_NOW``, SIGUSR1, a slow step.

The runtime side of :mod:`hf_distprof.capture`, owned by the profiler callback on every rank (also on ranks
that ``--profile-ranks`` leaves out: a request or a slow step on any rank counts). Per step it costs one clock
read and, with ``--profile-on-anomaly``, one median over the last 20 step times; no device sync, no collective.
On agreement steps (``global_step`` a multiple of the Trainer's logging interval, the same on every rank) it
looks for ``PROFILE_NOW`` and does one small all-gather of every rank's :class:`~hf_distprof.capture.Note`; with
``--profile-ranks auto`` or ``--max-trace-mb`` the note also carries what those decide from
(:mod:`hf_distprof.window_policy`), and the agreement steps happen for them alone too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hf_distprof import dist
from hf_distprof.capture import FILE_REQUEST, SIGNAL_REQUEST, Anomaly, CapturePlan, Note, SlowStepDetector
from hf_distprof.config import ProfilingArguments
from hf_distprof.names import PROFILE_NOW_NAME

if TYPE_CHECKING:
    from hf_distprof.window_policy import WindowPolicy

logger = dist.get_logger(__name__)

# The signal that asks for a window (SIGUSR2 stays free for whatever else the job uses).
REQUEST_SIGNAL = signal.SIGUSR1


class CaptureTriggers:
    """Notes requests and slow steps on this rank and agrees with the other ranks on logging steps.

    Args:
        args: The profiling flags (``--profile-on-demand``, ``--profile-on-anomaly`` and the window's length).
        run_dir: The run folder (where ``PROFILE_NOW`` is looked for).
        start_step: ``global_step`` when training (re)started.
        max_steps: The run's last optimizer step.
        logging_steps: The Trainer's logging interval (``state.logging_steps``): the agreement steps.
        busy: Whether the regular schedule traces a step.
        policy: ``--profile-ranks auto`` / ``--max-trace-mb``: what this rank adds to its note, and who takes the
            gathered notes besides the plan.
    """

    def __init__(self, args: ProfilingArguments, run_dir: Path, start_step: int, max_steps: int,
                 logging_steps: int, busy: Callable[[int], bool], policy: WindowPolicy | None = None) -> None:
        self.run_dir = run_dir
        self.policy = policy
        self.max_steps = max_steps
        self.interval = max(1, int(logging_steps))
        self.plan = CapturePlan(
            args.profiler_warmup_steps, args.profiler_active_steps, max_steps, busy, on_demand=args.profile_on_demand,
            max_anomaly_captures=args.max_anomaly_captures if args.profile_on_anomaly else 0,
            anomaly_factor=args.anomaly_factor,
        )
        self.detector = SlowStepDetector(args.anomaly_factor, start_step) if args.profile_on_anomaly else None
        self._anomaly: Anomaly | None = None  # the worst since the previous agreement step
        self._signalled = False
        self._previous_handler: Any = None
        self._mark = time.perf_counter()
        self.exporting: Callable[[], bool] = lambda: False  # the profiler sets its compact writer's ``busy``
        if args.profile_on_demand:
            self._install_signal_handler()
            if dist.get_rank() == 0:
                # How to ask, with the exact path and a pid: the launcher's pid would be the wrong one to signal.
                logger.warning(f"--profile-on-demand: `touch {run_dir / PROFILE_NOW_NAME}` or `kill -USR1 "
                               f"{os.getpid()}` (rank 0; any rank will do) opens one profiler window from the next "
                               f"logging step on")

    def step_end(self, step: int) -> None:
        """At the end of optimizer step ``step``, before the profiler is stepped into ``step + 1``."""
        seconds = time.perf_counter() - self._mark
        if self.detector is not None and self.plan.watching_anomalies:
            # A step during which this rank wrote a compact summary (a thread parsing the trace just written)
            # is the profiler's doing, like a traced one: never an anomaly, never in the median.
            traced = self.plan.traced(step) or self.exporting()
            anomaly = self.detector.add(step, seconds, traced=traced)
            if anomaly is not None and (self._anomaly is None or anomaly.ratio > self._anomaly.ratio):
                self._anomaly = anomaly
        # Every rank reaches the same agreement steps: the same step numbers, the same plan state.
        listening = self.plan.listening or (self.policy is not None and self.policy.listening)
        if step % self.interval == 0 and step < self.max_steps and listening:
            self._agree(step)

    def boundary(self) -> None:
        """Start the next step's clock here: what ran before (exports, logging, checkpoints) is not a step."""
        self._mark = time.perf_counter()

    def close(self) -> None:
        """Put back the SIGUSR1 handler that was there before (where ours is still the one installed)."""
        if self._previous_handler is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(REQUEST_SIGNAL) == self._on_signal:
            signal.signal(REQUEST_SIGNAL, self._previous_handler)
        self._previous_handler = None

    # ---- internals -----------------------------------------------------------------------------

    def _agree(self, step: int) -> None:
        demand: list[str] = []
        request_file = self.run_dir / PROFILE_NOW_NAME
        seen_file = self.plan.on_demand and request_file.exists()
        if seen_file:
            demand.append(FILE_REQUEST)
        if self._signalled:
            self._signalled = False
            demand.append(SIGNAL_REQUEST)
        extra = self.policy.note_fields() if self.policy is not None else {}
        note = Note(dist.get_rank(), tuple(demand), self._anomaly, **extra)
        self._anomaly = None
        notes = dist.all_gather_object(note)
        if seen_file:
            # Consumed by every rank that saw it; after the gather, so every rank looked before any removes it.
            try:
                request_file.unlink(missing_ok=True)
            except OSError as err:
                logger.warning(f"could not remove {request_file}: {err!r}; it will open another window")
        if self.policy is not None:
            self.policy.agree(step, notes)
        decision = self.plan.agree(step, notes)
        if decision.message:
            # The whole story on rank 0's console; every rank's own log has it too.
            (logger.warning if dist.get_rank() == 0 else logger.info)(decision.message)

    def _install_signal_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("--profile-on-demand: not on the main thread, so SIGUSR1 is not watched (PROFILE_NOW is)")
            return
        previous = signal.getsignal(REQUEST_SIGNAL)
        if previous is None:
            logger.warning("--profile-on-demand: SIGUSR1 has a handler from outside Python, left in place; "
                           "use PROFILE_NOW")
            return
        self._previous_handler = previous
        signal.signal(REQUEST_SIGNAL, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the next agreement step reads it (nothing else is safe inside a signal handler).
        self._signalled = True
