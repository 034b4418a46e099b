"""``ProfilerCallback``: one torch.profiler trace per rank over a schedule of optimizer steps."""

from __future__ import annotations

import atexit
import gzip
import os
import signal
import threading
import warnings
from pathlib import Path
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard
from hf_distprof.core import signals
from hf_distprof.callbacks.profiler.capture import RECORD, RECORD_AND_SAVE, WARMUP
from hf_distprof.callbacks.profiler import schedule as traced
from hf_distprof.callbacks.profiler.schedule import (
    base_schedule, first_active_step, records_nothing, schedule_warning, scheduled_steps)
from hf_distprof.callbacks.profiler.triggers import CaptureTriggers
from hf_distprof.callbacks.profiler.manifest import RunManifest, window_reasons
from hf_distprof.callbacks.profiler.compact_export import CompactExports
from hf_distprof.callbacks.profiler.window_policy import WindowPolicy
from hf_distprof.callbacks.parallelism import report_parallelism
from hf_distprof.config import ProfilingArguments

logger = dist.get_logger(__name__)

SUMMARY_ROWS = 25
PAUSE_NAME = "hf_distprof/between_steps"
"""The range around an evaluation or a checkpoint between two traced steps (the analysis's
``hf_distprof.analysis.read.pauses.PAUSE_NAME``, the same name: the training ranks import no analysis code). Inside
it, an empty range ``<PAUSE_NAME>: evaluation`` or ``: checkpoint`` marks each that ended (which the range's name, set
before the Trainer decides to save after an evaluation, cannot say)."""
# How the windows opened on demand or on anomaly (hf_distprof.callbacks.profiler.capture) drive the profiler.
_PHASE_ACTIONS = {WARMUP: ProfilerAction.WARMUP, RECORD: ProfilerAction.RECORD,
                  RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE}


def supported_activities() -> list[ProfilerActivity]:
    """CPU always; CUDA when this build supports it and a device is present (asking for more only warns)."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and ProfilerActivity.CUDA in torch.profiler.supported_activities():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _why_unwritable(folder: Path) -> str:
    try:
        stats = os.statvfs(folder)
    except OSError as err:
        return f"cannot read the file system: {err.strerror}"
    if stats.f_bavail * stats.f_frsize < 1 << 20:
        return "No space left on device"
    return "the folder may not be writable"


NAMED_TAIL = 1 << 16
"""The end of a trace, in bytes, where Kineto writes its ``traceName`` (the file it wrote)."""


def write_trace(prof: profile, trace: Path) -> None:
    """Export ``prof``'s trace to ``trace`` (gzipped JSON) atomically, leaving no temporary file on failure.

    torch's own ``*.gz`` export goes through a temporary JSON file in the system's temp folder that it does not
    remove when gzipping fails (a full disk): a whole uncompressed trace left behind. Here both temporary files
    sit beside the trace, hidden, and are removed whatever happens.
    """
    with paths.atomic_path(trace, suffix=".json.gz") as tmp:
        raw = tmp.with_name(tmp.name.removesuffix(".gz"))
        try:
            prof.export_chrome_trace(str(raw))
            if not raw.is_file():  # kineto reports a failed write in its log only
                raise OSError(f"torch.profiler wrote no trace ({_why_unwritable(trace.parent)})")
            with open(raw, "rb") as source, gzip.open(tmp, "wb", compresslevel=6) as target:
                left = raw.stat().st_size - NAMED_TAIL
                while left > 0:
                    chunk = source.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    target.write(chunk)
                    left -= len(chunk)
                # Kineto names the trace by the file it wrote ("traceName", at the end): the final name, not ours.
                target.write(source.read().replace(str(raw).encode(), str(trace).encode()))
        finally:
            # Kineto writes "<raw>.tmp" and renames it; a failed write (full disk) leaves that one behind too.
            for leftover in (raw, raw.with_name(raw.name + ".tmp")):
                leftover.unlink(missing_ok=True)


IDLE_LOOKAHEAD = 256
"""Steps of the flags' schedule looked ahead at once for idle ones (:meth:`ProfilerCallback._advance`)."""


class ProfilerCallback(TrainerCallback):  # type: ignore[misc]
    """Drives ``torch.profiler`` over optimizer steps and writes one gzipped Kineto trace per rank.

    The profiler starts at ``on_train_begin``, steps once per optimizer step (``on_step_end``, so
    gradient accumulation does not shrink the window) and stops at ``on_train_end``. Profiler step
    numbers are aligned with ``state.global_step``: ``ProfilerStep#4`` in the trace is optimizer step 4.
    Ranks not in ``--profile-ranks`` build no profiler. An export that fails becomes one warning and
    training goes on; an exception, SIGTERM or SIGINT stops the profiler and flushes what was recorded,
    and a signal that arrives while a trace is being written waits until it is complete.
    With ``--profile-on-demand`` or ``--profile-on-anomaly``, :class:`~.triggers.CaptureTriggers`
    (on every rank) adds windows to the schedule, the same on every rank. With ``--profile-ranks auto`` or
    ``--max-trace-mb``, :class:`~.window_policy.WindowPolicy` decides at each window's first step
    which ranks trace it and how many steps it records.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.prof: profile | None = None
        self.run_dir: Path | None = None
        self.written: list[Path] = []
        self._failed_exports = 0
        self._lock = threading.RLock()  # close() may run again from a signal handler while it runs
        self._pause: Any = None  # the open range around an evaluation or a checkpoint, while the profiler records
        self._previous_handlers: dict[int, Any] = {}  # signal -> the handler ours replaced
        self._pid = os.getpid()  # the process whose profiler the handlers close
        self._exports = 0  # on_trace_ready calls so far
        self._offset = 0  # global_step when training (re)started
        self._last_step = 0  # last optimizer step that completed
        self._base: Callable[[int], ProfilerAction] | None = None  # the flags' schedule, counting from 0
        self._triggers: CaptureTriggers | None = None  # --profile-on-demand / --profile-on-anomaly
        self._manifest: RunManifest | None = None  # this rank's part of the run manifest, on every rank
        self._policy: WindowPolicy | None = None  # --profile-ranks auto / --max-trace-mb
        self.step_timer: Any = None  # set by build_callbacks: --profile-ranks auto reads its step times
        self.agree_every: int | None = None  # a fixed capture-agreement cadence (tests); None: measured
        self._compacts = CompactExports()  # each trace's compact summary, written on a thread
        # The flags' schedule alone (no trigger, no window policy): the last step known to be idle, so that the steps
        # before a window cost one comparison (``_advance``), and whether Dynolog wants every ``prof.step()``.
        self._idle_through = 0
        self._kineto_daemon = False

    # ---- Trainer hooks -------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._idle_through = 0  # this call's schedule is shifted to its own first step
        self.written = []  # this call's files ("profiler wrote: ..." listed an earlier call's too)
        if self._triggers is not None:
            # A train() call that ended without on_train_end (an exception; auto_find_batch_size's retry): its
            # gather in flight is read (every rank has it) and its SIGUSR1 handler put back before new ones.
            self._triggers.close()
            traced.unregister(self._triggers.plan)
            self._triggers = None
        if self._policy is not None:
            traced.unregister(self._policy)  # (a train() that ended without on_train_end)
            self._policy = None
        # Every rank takes part in agreeing on the run folder and in the parallelism report, profiled or not
        # (a broadcast and a gather).
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        report_parallelism(kwargs.get("model"), args, state, self.run_dir)
        self._manifest = RunManifest.start(self.run_dir, self.args)  # hosts and clock offsets: collectives
        self._manifest.planned(self.args, state.global_step, state.max_steps)  # a folder without a trace says why
        if self.run_dir is None:
            return  # nowhere to write (already warned): no profiler, training goes on
        if self.args.profile_ranks == "auto" or self.args.max_trace_mb is not None:
            self._policy = WindowPolicy(self.args, self.run_dir, self._scheduled, state.global_step, self.step_timer)
            traced.register(self._policy)  # the steps --max-trace-mb keeps from the profiler are not traced
        if self.args.profile_on_demand or self.args.profile_on_anomaly or self._policy is not None:
            # On every rank, profiled or not: a request or a slow step on any rank opens the window everywhere.
            self._triggers = CaptureTriggers(self.args, self.run_dir, state.global_step, state.max_steps,
                                             scheduled_steps(self.args, state.global_step), policy=self._policy,
                                             every=self.agree_every)
            self._triggers.exporting = self._compacts.busy
            self._triggers.report_to = args.report_to
            self._triggers.tensorboard_dir = tensorboard.tensorboard_dir(args.output_dir, self.run_dir)
            traced.register(self._triggers.plan)  # the step timer, memory views and --nsys-window count its windows
        if self.step_timer is not None:
            self.step_timer.profiler_busy = self._compacts.busy  # steps it overlaps are left out of its verdicts
            self.step_timer.before_fetch = self._end_pause  # the next step's data wait starts there
        rank = dist.get_rank()
        ranks = self.args.profile_rank_set
        if ranks is not None:
            world = dist.get_world_size()
            missing = sorted(r for r in ranks if r >= world)
            if missing and rank == 0:
                none = ": no rank is profiled" if len(missing) == len(ranks) else ""
                logger.warning(f"--profile-ranks names ranks {missing} but the world size is {world}{none}")
            if rank not in ranks:
                return
        message = schedule_warning(self.args, state.max_steps, state.global_step)
        on_request = self._triggers is not None and self._triggers.plan.listening
        if on_request and state.max_steps < first_active_step(self.args):
            message = None  # no regular window: profiling on demand or on anomaly only, as asked
        if message is not None:
            # The same on every profiled rank: the console hears it once, every rank's log keeps it.
            (logger.warning if rank == min(ranks or [0]) else logger.info)(message)
        nothing = records_nothing(self.args, state.global_step, state.max_steps)
        if nothing and not on_request:
            return  # no window: no profiler either (its warm-up steps would only cost time)
        a = self.args
        # (No regular window to warm up for when training ends before it: the windows asked for alone.)
        self._base = base_schedule(a) if not nothing else lambda step: ProfilerAction.NONE
        self._kineto_daemon = bool(os.environ.get("KINETO_USE_DAEMON"))
        # Profiler step numbers follow the Trainer's 1-based global_step (also when resuming from a
        # checkpoint), so ProfilerStep#N in the trace is optimizer step N; the schedule is shifted to match.
        self._offset = state.global_step
        offset = self._offset
        # torch says at a window's start after the first that it "clears events at the end of each cycle" (set
        # acc_events=True): each window is exported at its end, so nothing is lost; the advice is not for our users.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle",
                                category=UserWarning, module=r"torch\.profiler")
        self.prof = profile(
            activities=supported_activities(),
            schedule=self._action,
            on_trace_ready=self._export_and_record,
            record_shapes=a.profiler_record_shapes,
            profile_memory=a.profiler_profile_memory,
            with_stack=a.profiler_with_stack,
            with_flops=a.profiler_with_flops,
        )
        self.prof.step_num = offset
        self._last_step = offset
        self.prof.start()
        if self._policy is not None:
            self._policy.window_start(offset + 1)
        self.prof.step()  # now recording ProfilerStep#<offset+1>, the first step of this run
        self._install_exit_handlers()
        self._begin_pause(bool(getattr(args, "eval_on_start", False)))  # the Trainer evaluates before step 1

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        prof = self.prof
        if prof is not None and prof.step_num < self._idle_through and state.global_step < state.max_steps \
                and prof.current_action == ProfilerAction.NONE:
            # An idle step before an idle one, on the flags' schedule alone: what ``_advance`` does, and nothing else
            # (no trigger, no window policy: ``_idle_through`` stays 0 with either).
            self._last_step = state.global_step
            self._skip_step(prof)
            return
        if self._triggers is not None:
            # Before the profiler steps into the next step, whose action an agreement here may set.
            self._triggers.step_end(state.global_step)
        if self.prof is not None:
            self._last_step = state.global_step
            if self._policy is not None and state.global_step < state.max_steps:  # (no window after the last step)
                self._policy.window_start(state.global_step + 1)  # after the agreement, before stepping into it
            if state.global_step >= state.max_steps:
                # Close right after the last real step so the trace holds no step that never ran.
                if self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                    self._step_ends_before_export(state.global_step)
                self.close()
            elif self.prof.current_action == ProfilerAction.RECORD_AND_SAVE:
                # The window's last step: step() stops the trace, then exports it. A signal in between would
                # find the window neither recording nor written, so signals wait for the whole transition.
                self._step_ends_before_export(state.global_step)
                with signals.deferred():
                    self.prof.step()
            else:
                self._advance(self.prof)
            self._begin_pause(control.should_evaluate or control.should_save)
        self._step_boundary()

    def _begin_pause(self, now: bool) -> None:
        """When ``now``, the Trainer evaluates or saves now (after a step's or an epoch's end, or before the first step
        with ``eval_on_start``), inside the step the profiler just opened: while it records, a range around that work,
        up to the next step's first fetch (or its ``on_step_begin``, or a checkpoint's end), where the analysis starts
        the step (an evaluation in a traced step read as a 1.8 s step and a what-if finding). Several evaluations (a
        dict of eval datasets) and a checkpoint decided after them (``save_strategy="best"``) are all in it."""
        if now and self._pause is None and self.prof is not None and \
                self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            pause = torch.autograd.profiler.record_function(PAUSE_NAME)
            pause.__enter__()
            self._pause = pause

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._begin_pause(control.should_evaluate or control.should_save)  # eval_strategy / save_strategy "epoch"

    def _end_pause(self) -> None:
        pause, self._pause = self._pause, None
        if pause is not None:
            pause.__exit__(None, None, None)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._end_pause()  # (without the step timer, whose loader hook ends it at the step's first fetch)

    def _advance(self, prof: profile) -> None:
        """Step the profiler into the next optimizer step. From an idle step into another idle one, ``prof.step()``
        would only close one ``ProfilerStep#N`` range and open the next, which nothing records (about 15 us per step
        on CPU): the step number moves on alone then, and ``step()`` runs from the step before a window on."""
        if prof.current_action == ProfilerAction.NONE and self._action(prof.step_num + 1) == ProfilerAction.NONE \
                and not self._kineto_daemon:  # Dynolog's step counter wants every step()
            self._skip_step(prof)
            if self._triggers is None and self._policy is None and self._idle_through <= prof.step_num:
                # The flags' schedule is a function of the step alone: the idle steps ahead, found once per 256.
                ahead = prof.step_num + 1
                while ahead <= prof.step_num + IDLE_LOOKAHEAD and self._scheduled(ahead) == ProfilerAction.NONE:
                    ahead += 1
                self._idle_through = ahead - 1
            return
        prof.step()

    @staticmethod
    def _skip_step(prof: profile) -> None:
        """The step number moves on alone: the range ``step()`` or ``start()`` opened last closed once, as ``step()``
        would."""
        opened = getattr(prof, "step_rec_fn", None)
        if opened is not None:
            prof.step_rec_fn = None
            opened.__exit__(None, None, None)
        prof.step_num += 1

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._step_boundary()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._mark_pause("checkpoint")
        self._end_pause()
        self._step_boundary(pause=True)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._mark_pause("evaluation")
        self._step_boundary(pause=True)  # (the range goes on: another evaluation or a checkpoint may follow)

    def _mark_pause(self, what: str) -> None:
        """An empty range inside the open pause naming what just ended in it (an evaluation, a checkpoint)."""
        if self._pause is not None:
            with torch.autograd.profiler.record_function(f"{PAUSE_NAME}: {what}"):
                pass

    def _step_ends_before_export(self, step: int) -> None:
        """The step timer ends this step before the trace is written, so that the export (0.4-2 s) is neither this
        step's time nor the next step's data wait."""
        if self.step_timer is not None:
            self.step_timer.end_step_before_export(step)

    def _step_boundary(self, pause: bool = False) -> None:
        # The anomaly clock restarts after exports, logging, checkpoints and evaluation: they are not steps; nor is
        # the step after a checkpoint or an evaluation judged (``pause``): it waits for the slowest rank's.
        if self._triggers is not None:
            self._triggers.boundary(pause)

    def _action(self, step: int) -> ProfilerAction:
        """The profiler's schedule on this rank: :meth:`_scheduled`, after the window policy's decisions
        (``--profile-ranks auto``, ``--max-trace-mb``)."""
        action = self._scheduled(step)
        return action if self._policy is None else self._policy.filter(step, action)

    def _scheduled(self, step: int) -> ProfilerAction:
        """The schedule of every rank: the flags' cycle shifted to ``global_step``, plus the windows opened on
        demand or on anomaly in the steps the cycle leaves idle."""
        if step <= self._offset or self._base is None:
            return ProfilerAction.NONE
        action = self._base(step - self._offset - 1)
        if action == ProfilerAction.NONE and self._triggers is not None:
            return _PHASE_ACTIONS.get(self._triggers.plan.phase(step) or "", ProfilerAction.NONE)
        return action

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.close()
        if self._triggers is not None:
            self._triggers.close()
            traced.unregister(self._triggers.plan)
            self._triggers = None
        if self._policy is not None:
            traced.unregister(self._policy)
        if self._manifest is not None:
            self._manifest.finish(self._failed_exports, state.global_step)  # a gather: rank 0 writes manifest.json
            self._manifest = None
        if self.written:
            logger.info("profiler wrote: " + ", ".join(str(p) for p in self.written))

    # ---- stopping ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the profiler, exporting a window that was still being recorded. Safe to call twice.

        SIGTERM and SIGINT wait until the trace is written; the exit handlers are removed at the end, so a
        signal that arrived meanwhile then reaches the handler that was there before ours.
        """
        with signals.deferred():
            with self._lock:
                prof, self.prof = self.prof, None
            if prof is None:
                return
            self._end_pause()
            try:
                self._stop_and_flush(prof)
            finally:
                self._compacts.join()  # before the handlers go: a signal meanwhile waits for these files too
                self._remove_exit_handlers()

    def _stop_and_flush(self, prof: profile) -> None:
        # RECORD_AND_SAVE: stopped in the window's last step, before that step's end exported it.
        recording = prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        exports = self._exports
        try:
            with warnings.catch_warnings():
                # torch warns "Incorrect schedule: RECORD followed by NONE" when stopped mid-window.
                warnings.simplefilter("ignore", UserWarning)
                prof.stop()
        except Exception as err:  # noqa: BLE001 - never let profiling break training
            logger.warning(f"stopping the profiler failed: {err!r}")
            return
        # A window cut short by the end of training, an exception or a signal holds the steps it has. torch
        # 2.13 exports it from stop() (on_trace_ready); a version that does not is exported here, once.
        if recording and self._exports == exports:
            self._export_and_record(prof)

    def _install_exit_handlers(self) -> None:
        self._pid = os.getpid()
        atexit.register(self.close)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in signals.TERMINATION_SIGNALS:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None):
                continue  # ignored on purpose, or a handler from outside Python we could not put back
            self._previous_handlers[signum] = previous
            signal.signal(signum, self._on_signal)

    def _remove_exit_handlers(self) -> None:
        atexit.unregister(self.close)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handlers.items():
            # Put the old handler back only where ours is still installed (a later handler stays), also while a
            # deferred block holds it (close() runs in one: the block then leaves the old handler in place).
            if signals.held_for(signal.getsignal(signum), signum) == self._on_signal:
                signal.signal(signum, previous)
        self._previous_handlers = {}
        signals.rearm()  # the step timer's and memory logger's rows still wait for SIGTERM's default action

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        signals.note_arrival(signum, frame)  # the stop file's time and place: before the window's export
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker): the rank's profiler is not its own
            signal.signal(signum, previous if callable(previous) or previous == signal.SIG_IGN else signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        before = len(self.written)
        self.close()
        self._said_cut_short(signum, [p for p in self.written[before:] if p.name.endswith(paths.TRACE_SUFFIX)])
        if callable(previous):
            try:
                previous(signum, frame)  # SIGINT's default raises KeyboardInterrupt: training unwinds as usual
            finally:
                signals.forget_arrival(signum)  # taken without ending the process: no later stop's arrival
        else:
            # Default disposition: end with the signal's status, as if we had never been here. Stopped, not crashed:
            # the empty crash file goes (no atexit handler runs on the default action).
            signals.before_default_death(signum)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _said_cut_short(self, signum: int, traces: list[Path]) -> None:
        """One line where the signal stopped a window: what was written and where (a Ctrl-C mid-window left only a
        traceback through this handler, and no word that the window's steps so far were saved). Rank 0 warns; the
        other ranks say it in their logs."""
        if not traces:
            return
        name = signal.Signals(signum).name
        said = (f"{name} during a profiler window: the window was stopped and its steps so far written "
                f"({', '.join(p.name for p in traces)}, in {traces[0].parent}; hf-distprof analyze reads them); {name} "
                "then goes on to the training as it would without hf_distprof")
        (logger.warning if dist.get_rank() == 0 else logger.info)(said)

    # ---- export --------------------------------------------------------------------------------

    def _export_and_record(self, prof: profile) -> None:
        """``on_trace_ready``: :meth:`_export`, then the window, and why it was taken, in the run manifest."""
        if not self._export(prof) or self._manifest is None:
            return  # no trace on this rank: its part of the manifest does not claim the window
        last = self._last_step
        first = last - self._recorded_steps(last) + 1
        scheduled = self._base is not None and self._base(first - self._offset - 1) != ProfilerAction.NONE
        reasons, detail = window_reasons(first, scheduled, self._triggers.plan.windows if self._triggers else [])
        self._manifest.window_written(first, last, reasons, detail, self._action(last) == ProfilerAction.RECORD)

    def _export(self, prof: profile) -> bool:
        """``on_trace_ready``: write the trace and its summary atomically; failures only warn.

        SIGTERM and SIGINT wait until both files are written (or failed), then take effect.

        Returns:
            Whether the trace was written (its summary may still have failed).
        """
        assert self.run_dir is not None
        self._exports += 1
        last = self._last_step
        if last <= self._offset or self._action(last) not in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            # Stopped (an exception, a signal) inside the window's first recorded step: no step of it ended, so none
            # names the trace, and what it holds is one unfinished step (on a peer of a rank that died, a wait for
            # it), which the analysis would read as a step (it was named after the warm-up step before it).
            logger.warning(f"the profiler window was stopped inside its first step ({last + 1}), before any of its "
                           "steps ended: no trace written")
            return False
        first = last - self._recorded_steps(last) + 1
        rank, host = dist.get_rank(), dist.get_hostname()
        trace = self.run_dir / paths.trace_file_name(rank, host, first, last)
        with signals.deferred():
            try:
                write_trace(prof, trace)
            except Exception as err:  # noqa: BLE001 - an export failure must not stop training
                self._failed_exports += 1
                logger.warning(f"could not write profiler trace {trace}: {err!r}; training goes on")
                return False
            self.written.append(trace)
            self._compacts.submit(trace)
            if self._policy is not None:
                self._policy.exported(trace, last - first + 1)
            summary = self.run_dir / paths.summary_file_name(rank, host, first, last)
            try:
                paths.atomic_write_text(summary, self._summary_text(prof, first, last))
            except Exception as err:  # noqa: BLE001
                logger.warning(f"could not write profiler summary {summary}: {err!r}")
                return True
            self.written.append(summary)
        return True

    def _recorded_steps(self, last_step: int) -> int:
        """Recorded steps in the window ending at ``last_step`` (fewer when training stopped mid-window).

        Counted back through the schedule actually followed, the regular cycle's windows and the extra ones
        alike: every recorded step before a window's last is RECORD; the step before its first is not.
        """
        count, step = 1, last_step - 1
        while step > self._offset and self._action(step) == ProfilerAction.RECORD:
            count, step = count + 1, step - 1
        return count

    def _summary_text(self, prof: profile, first: int, last: int) -> str:
        header = (
            f"hf_distprof profiler summary: rank {dist.get_rank()} of {dist.get_world_size()}, "
            f"host {dist.get_hostname()}, optimizer steps {first}-{last}\n"
        )
        try:
            averages, paused_ms, what = _outside_pauses(prof)
            if paused_ms:
                header += (f"({what or 'an evaluation or a checkpoint'} between steps, {paused_ms:.1f} ms in all, left "
                           "out: it is no step's work)\n")
            # hf_distprof's own ranges (the step timer's phases, its collectives) are spans, not operators: their self
            # time is mostly the waits between ops (a trial's table opened with "hf_distprof/backward 34.69%").
            # (With a pause left out, the steps' own ranges still span it: their totals would read above 100%.)
            averages[:] = [e for e in averages if not e.key.startswith("hf_distprof/")
                           and not (paused_ms and e.key.startswith("ProfilerStep"))]
            parts = [header, f"\nTop {SUMMARY_ROWS} operators by self CPU time (hf_distprof's own ranges left out)\n"]
            parts.append(averages.table(sort_by="self_cpu_time_total", row_limit=SUMMARY_ROWS))
            if ProfilerActivity.CUDA in supported_activities():
                parts.append(f"\n\nTop {SUMMARY_ROWS} operators by self device time (hf_distprof's own ranges left "
                             "out)\n")
                parts.append(averages.table(sort_by="self_device_time_total", row_limit=SUMMARY_ROWS))
        except Exception as err:  # noqa: BLE001 - key_averages() can fail on stack records (see FACTS)
            warnings.warn(f"profiler summary unavailable: {err!r}", stacklevel=2)
            return header + f"\n(operator table unavailable: {err!r})\n"
        return "".join(parts) + "\n"


def _outside_pauses(prof: profile) -> tuple[Any, float, str]:
    """The window's operator averages without what ran inside our between-steps range (an evaluation, a checkpoint:
    a trial's table of "optimizer steps 8-10" held 412 calls of addmm where its steps made 12), that range's
    length in all (ms; 0 without one), and what ran in it ("an evaluation and a checkpoint"; "" when unmarked)."""
    events = prof.events()
    pauses = [(e.time_range.start, e.time_range.end) for e in events if e.name == PAUSE_NAME]
    if not pauses:
        return prof.key_averages(), 0.0, ""
    marked = list(dict.fromkeys(e.name[len(PAUSE_NAME) + 2:] for e in events if e.name.startswith(f"{PAUSE_NAME}: ")))
    what = " and ".join(("an " if m[0] in "aeiou" else "a ") + m for m in marked)
    from torch.autograd.profiler_util import EventList

    kept = EventList([e for e in events if not any(a <= e.time_range.start <= b for a, b in pauses)],
                     use_device=getattr(events, "_use_device", None),
                     profile_memory=getattr(events, "_profile_memory", False),
                     with_flops=getattr(events, "_with_flops", False))
    kept._tree_built = True  # (each kept event keeps its place in the window's tree: its self time stays its own)
    return kept.key_averages(), sum(b - a for a, b in pauses) / 1e3, what
