"""What opens an extra profiler window while training runs: ``PROFILE_NOW``, SIGUSR1, a slow step.

The runtime side of :mod:`~.capture`, owned by the profiler callback on every rank (also on ranks
that ``--profile-ranks`` leaves out: a request or a slow step on any rank counts). Per step it costs one clock
read and, with ``--profile-on-anomaly``, one median over the last 20 step times; no device sync, no blocking
collective. Agreement steps come on their own cadence, whatever the Trainer's logging interval
(:func:`hf_distprof.callbacks.profiler.capture.agreement_interval`: every step where steps are long, at most every
:data:`~.capture.MAX_AGREE_EVERY` steps): there this rank looks for ``PROFILE_NOW`` and starts a small
non-blocking all-gather of its :class:`~.capture.Note` (fixed-size floats), which every rank reads
one step later. With ``--profile-ranks auto`` or ``--max-trace-mb`` the note also carries what those decide from
(:mod:`hf_distprof.callbacks.profiler.window_policy`), and the agreement steps happen for them alone too.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hf_distprof import dist, trackers
from hf_distprof.callbacks.profiler.capture import (
    FILE_REQUEST,
    MAX_AGREE_EVERY,
    SIGNAL_REQUEST,
    Anomaly,
    CapturePlan,
    Note,
    SlowStepDetector,
    agreement_interval,
    decode_note,
    encode_note,
)
from hf_distprof.callbacks.profiler.schedule import after_window
from hf_distprof.config import ProfilingArguments
from hf_distprof.core.names import PROFILE_NOW_NAME

CAPTURES_TAG = "hf_distprof/captures"  # the trackers' event of each window opened on demand or on anomaly

if TYPE_CHECKING:
    from hf_distprof.callbacks.profiler.window_policy import WindowPolicy

logger = dist.get_logger(__name__)

# The signal that asks for a window (SIGUSR2 stays free for whatever else the job uses).
REQUEST_SIGNAL = signal.SIGUSR1
# Step times and agreement costs in this rank's medians (the cadence's evidence).
CADENCE_HISTORY = 20


class CaptureTriggers:
    """Notes requests and slow steps on this rank and agrees with the other ranks on its own cadence.

    Args:
        args: The profiling flags (``--profile-on-demand``, ``--profile-on-anomaly`` and the window's length).
        run_dir: The run folder (where ``PROFILE_NOW`` is looked for).
        start_step: ``global_step`` when training (re)started.
        max_steps: The run's last optimizer step.
        busy: Whether the regular schedule traces a step.
        policy: ``--profile-ranks auto`` / ``--max-trace-mb``: what this rank adds to its note, and who takes the
            gathered notes besides the plan.
        every: Agree every this many steps, fixed (tests); None: :func:`~.capture.agreement_interval`.
    """

    def __init__(self, args: ProfilingArguments, run_dir: Path, start_step: int, max_steps: int,
                 busy: Callable[[int], bool], policy: WindowPolicy | None = None, every: int | None = None) -> None:
        self.run_dir = run_dir
        self.policy = policy
        self.max_steps = max_steps
        self.fixed_every = every
        self.interval = every or MAX_AGREE_EVERY
        self.next_agreement = start_step + self.interval
        self.agreements = 0  # started so far (tests, the benchmark)
        self._pending: tuple[int, dist.PendingGather, bool] | None = None  # (read at step, gather, file seen)
        self._step_times: deque[float] = deque(maxlen=CADENCE_HISTORY)
        self._costs: deque[float] = deque(maxlen=CADENCE_HISTORY)
        self.plan = CapturePlan(
            args.profiler_warmup_steps, args.profiler_active_steps, max_steps, busy, on_demand=args.profile_on_demand,
            max_anomaly_captures=args.max_anomaly_captures if args.profile_on_anomaly else 0,
            anomaly_factor=args.anomaly_factor,
        )
        self.detector = SlowStepDetector(args.anomaly_factor, start_step) if args.profile_on_anomaly else None
        self._anomaly: Anomaly | None = None  # the worst since the previous agreement step
        self._cost_so_far = 0.0  # seconds the agreement in flight has cost this rank so far
        self._measured = False  # whether the cadence has been set from measurements yet
        self._signalled = False
        self._previous_handler: Any = None
        self._mark = time.perf_counter()
        self._after_pause = False  # a checkpoint or an evaluation ended since the last step
        self.exporting: Callable[[], bool] = lambda: False  # the profiler sets its compact writer's ``busy``
        self.report_to: Any = None  # the Trainer's report_to, set by the profiler: where each decision is told
        self.tensorboard_dir: Path | None = None  # and the TensorBoard folder of the run's scalars (with tensorboard)
        if args.profile_on_demand:
            self._install_signal_handler()
            if dist.get_rank() == 0:
                # How to ask, with the exact path and a pid: the launcher's pid would be the wrong one to signal.
                logger.warning(f"--profile-on-demand: `touch {run_dir / PROFILE_NOW_NAME}` or `kill -USR1 "
                               f"{os.getpid()}` (rank 0; any rank will do) opens one profiler window within "
                               f"{MAX_AGREE_EVERY + 1} steps")

    def step_end(self, step: int) -> None:
        """At the end of optimizer step ``step``, before the profiler is stepped into ``step + 1``."""
        seconds = time.perf_counter() - self._mark
        # The step after a checkpoint or an evaluation holds this rank's wait for the slowest rank's (every rank
        # leaves it at its own time): the pause's doing, like a traced step. One such wait, 2.4x the median step
        # after a checkpoint on the other rank, once took a run's only anomaly capture.
        # So does the step after a window, on every rank (the slowest rank's export: schedule.after_window).
        traced = self.plan.traced(step) or after_window(self.plan.traced, step) or self.exporting() or self._after_pause
        self._after_pause = False
        if not traced:
            self._step_times.append(seconds)
        if self.detector is not None and self.plan.watching_anomalies:
            # A step during which this rank wrote a compact summary (a thread parsing the trace just written)
            # is the profiler's doing, like a traced one: never an anomaly, never in the median.
            anomaly = self.detector.add(step, seconds, traced=traced)
            if anomaly is not None and (self._anomaly is None or anomaly.ratio > self._anomaly.ratio):
                self._anomaly = anomaly
        # Every rank reaches the same agreement steps: the same step numbers, the same plan state.
        if self._pending is not None and step >= self._pending[0]:
            self._finish_agreement(step)
        listening = self.plan.listening or (self.policy is not None and self.policy.listening)
        if step >= self.next_agreement and step < self.max_steps and listening:
            self._start_agreement(step)

    def boundary(self, pause: bool = False) -> None:
        """Start the next step's clock here: what ran before (exports, logging, checkpoints) is not a step. After a
        ``pause`` (a checkpoint, an evaluation) the next step is not judged either."""
        self._mark = time.perf_counter()
        self._after_pause = self._after_pause or pause

    def close(self) -> None:
        """Read a gather still on its way (every rank started it), say that a request came too late for a window
        (its file removed: left in the folder it read as pending), then put back the SIGUSR1 handler that was there
        before (where ours is still the one installed)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending[1].result()
            except Exception as err:  # noqa: BLE001 - a group torn down under us: nothing left to agree on
                logger.info(f"the last capture agreement was not read: {err!r}")
        request_file = self.run_dir / PROFILE_NOW_NAME
        if self.plan.on_demand and request_file.exists():
            try:
                request_file.unlink(missing_ok=True)
            except OSError:
                pass
            logger.warning(  # (every rank that sees it: on a shared folder, the first to look removes it)
                f"--profile-on-demand: {request_file} came too late: training ended before a window could record "
                "(it opens within 5 + 1 + warm-up steps); removed, no window opened")
        if self._previous_handler is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(REQUEST_SIGNAL) == self._on_signal:
            signal.signal(REQUEST_SIGNAL, self._previous_handler)
        self._previous_handler = None

    # ---- internals -----------------------------------------------------------------------------

    def _start_agreement(self, step: int) -> None:
        """Look for requests and start gathering every rank's note; read at the next step end."""
        began = time.perf_counter()
        demand: list[str] = []
        seen_file = self.plan.on_demand and (self.run_dir / PROFILE_NOW_NAME).exists()
        if seen_file:
            demand.append(FILE_REQUEST)
        if self._signalled:
            self._signalled = False
            demand.append(SIGNAL_REQUEST)
        extra = self.policy.note_fields() if self.policy is not None else {}
        step_s = statistics.median(self._step_times) if self._step_times else None
        agree_s = statistics.median(self._costs) if self._costs else None
        note = Note(dist.get_rank(), tuple(demand), self._anomaly, step_s=step_s, agree_s=agree_s, **extra)
        self._anomaly = None
        self._pending = (step + 1, dist.all_gather_floats_async(encode_note(note)), seen_file)
        self.next_agreement = step + self.interval
        self.agreements += 1
        self._cost_so_far = time.perf_counter() - began

    def _finish_agreement(self, step: int) -> None:
        """Read the notes gathered since the previous step (the same list on every rank) and decide on them."""
        assert self._pending is not None
        began = time.perf_counter()
        _, gather, seen_file = self._pending
        self._pending = None
        notes = [decode_note(values) for values in gather.result()]
        self._costs.append(self._cost_so_far + time.perf_counter() - began)
        if seen_file:
            # Consumed by every rank that saw it; after the gather, so every rank looked before any removes it.
            request_file = self.run_dir / PROFILE_NOW_NAME
            try:
                request_file.unlink(missing_ok=True)
            except OSError as err:
                logger.warning(f"could not remove {request_file}: {err!r}; it will open another window")
        if self.policy is not None:
            self.policy.agree(step, notes)
        decision = self.plan.agree(step, notes)
        if self.fixed_every is None:
            interval = agreement_interval(notes)
            # A cost near a step boundary would flip the cadence between neighbours at every agreement: it moves
            # by two steps or more, or the first time it is measured.
            if abs(interval - self.interval) < 2 and self._measured:
                interval = self.interval
            self._measured = self._measured or any(n.agree_s is not None for n in notes)
            if interval != self.interval:
                steps = sorted(n.step_s for n in notes if n.step_s)
                costs = [n.agree_s for n in notes if n.agree_s is not None]
                logger.info(f"step {step}: capture agreements every {interval} step(s) from now on (median step "
                            f"{steps[len(steps) // 2] if steps else float('nan'):.3f} s, an agreement costs up to "
                            f"{1e3 * max(costs, default=float('nan')):.2f} ms)")
            self.interval = interval
            self.next_agreement = min(self.next_agreement, step - 1 + self.interval)  # from the gather read now
        if decision.message:
            # The whole story on rank 0's console; every rank's own log has it too; rank 0's trackers get it as an
            # event at this step.
            (logger.warning if dist.get_rank() == 0 else logger.info)(decision.message)
            if dist.get_rank() == 0:
                trackers.send_text(self.report_to, CAPTURES_TAG, decision.message, step,
                                   tensorboard_dir=self.tensorboard_dir)

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
