"""``HangWatchdogCallback``: when no optimizer step ends for ``--hang-timeout`` seconds, dump every thread's stack.

A hung distributed run gives no error and no trace: every rank waits for one that never arrives. Each rank
runs a watchdog thread that knows when the last optimizer step ended (``on_step_end`` writes one float: no
lock, no collective, nothing else per step). When the deadline passes it writes
``hang_rank{R}_{host}.txt`` into the run folder (every thread's Python stack, named, in a format
``hf-distprof hang-report`` reads), dumps PyTorch's flight recorder for that rank where it records
(``flight_recorder_rank{R}_{host}.pkl``, GPU with ``TORCH_NCCL_TRACE_BUFFER_SIZE``), logs where it wrote, and
with ``--hang-abort`` ends the process with status 3 so the scheduler sees a failure.

A thread that needs the GIL cannot run while the main thread holds it inside a C call; as a backstop the
watchdog keeps ``faulthandler.dump_traceback_later`` armed (re-armed by the watchdog itself, never per step),
which dumps from C without the GIL into ``hang_rank{R}_{host}.faulthandler.txt``.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths
from hf_distprof.config import ProfilingArguments
from hf_distprof.core import signals
from hf_distprof.core.stacks import format_stacks

logger = dist.get_logger(__name__)

STARTUP_FACTOR = 5.0
"""The first step (start-up: data loader workers, compilation, allocator warm-up) gets this many timeouts."""
ABORT_STATUS = 3
"""Exit status of a rank ended by ``--hang-abort``."""
TIDY_S = 10.0
"""Seconds ``--hang-abort`` waits for the last rows to be written before it ends the rank anyway."""
BACKSTOP_FACTOR = 2.0
"""The GIL-free backstop dumps when the watchdog thread itself has not run for this many timeouts."""


def dump_flight_recorder(target: Path) -> bool:
    """Write this rank's NCCL flight recorder buffer to ``target``; False where it does not record.

    The recorder runs only on NCCL with ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (or ``TORCH_FR_BUFFER_SIZE``) > 0,
    set before the process group was created.
    """
    import torch

    if not torch.cuda.is_available():
        return False
    if int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or os.environ.get("TORCH_FR_BUFFER_SIZE") or 0) <= 0:
        return False
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is None:
        return False
    with paths.atomic_path(target, suffix=".pkl") as tmp:
        tmp.write_bytes(dump())
    return True


class HangWatchdogCallback(TrainerCallback):  # type: ignore[misc]
    """Dumps every thread's stack on every rank when training stops making progress.

    Args:
        args: The profiling flags (``--hang-timeout``, ``--hang-abort``).
        clock: Seconds, monotonic (tests pass a fake).
        exit_process: Ends the process (tests pass a fake); called with :data:`ABORT_STATUS`.
    """

    def __init__(
        self, args: ProfilingArguments, clock: Any = time.monotonic, exit_process: Any = os._exit
    ) -> None:
        self.args = args
        self.timeout = float(args.hang_timeout)
        self.run_dir: Path | None = None
        self.dumps: list[Path] = []
        self._clock = clock
        self._exit = exit_process
        self._deadline = float("inf")
        self._last_step = 0
        self._last_end = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop: IO[str] | None = None
        self._backstop_pid: int | None = None  # the process that opened it
        self._fired_for: int | None = None  # the last step a dump was written for (once per stall)

    # ---- Trainer hooks -------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        self._last_step = state.global_step
        self._last_end = self._clock()
        self._deadline = self._last_end + STARTUP_FACTOR * self.timeout
        self._stop.clear()
        self._open_backstop()
        self._thread = threading.Thread(target=self._watch, name="hf_distprof-hang-watchdog", daemon=True)
        self._thread.start()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # The only per-step work: two attribute writes the watchdog reads.
        self._last_step = state.global_step
        self._last_end = now = self._clock()
        self._deadline = now + self.timeout

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the watchdog and its backstop. Safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._discard_backstop()

    # ---- the watchdog thread -------------------------------------------------------------------

    def _watch(self) -> None:
        """Sleep until the deadline, dump when it passed without a step; keep the backstop armed."""
        period = max(0.05, min(self.timeout / 4, 5.0))
        while not self._stop.is_set():
            self._arm_backstop()
            if self._clock() >= self._deadline and self._fired_for != self._last_step:
                self._fired_for = self._last_step
                self.dump()
                if self.args.hang_abort:
                    logger.error(f"--hang-abort: ending this rank with status {ABORT_STATUS}")
                    self._discard_backstop()
                    # os._exit runs no atexit handler: the step timer's and the memory logger's last rows go to their
                    # files now, and the empty crash file goes (a hang is not a crash; its dump is beside it). On a
                    # thread of its own, waited for a few seconds: a wedged driver or file system must not keep the
                    # rank from ending, which is what the flag promises.
                    tidy = threading.Thread(target=signals.before_default_death, name="hf_distprof-hang-tidy",
                                            daemon=True)
                    tidy.start()
                    tidy.join(TIDY_S)
                    for handler in _all_handlers():
                        handler.flush()
                    self._exit(ABORT_STATUS)
                    return
            self._stop.wait(period)

    def dump(self) -> Path | None:
        """Write ``hang_rank{R}_{host}.txt`` (and the flight recorder where it records); returns the file."""
        rank, host = dist.get_rank(), dist.get_hostname()
        waited = self._clock() - self._last_end
        header = (
            "hf_distprof hang dump\n"
            f"rank: {rank}\nworld_size: {dist.get_world_size()}\nhost: {host}\npid: {os.getpid()}\n"
            f"last_step: {self._last_step}\nseconds_since_last_step: {waited:.1f}\ntimeout_s: {self.timeout:g}\n"
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n\n"
        )
        folder = self.run_dir if self.run_dir is not None else Path(self.args.profiler_output_dir)
        target = folder / paths.HANG_DUMP_NAME.format(rank=rank, host=host)
        try:
            paths.atomic_write_text(target, header + format_stacks())
        except OSError as err:
            logger.error(f"no optimizer step for {waited:.0f} s; could not write {target}: {err!r}")
            return None
        self.dumps.append(target)
        seconds = f"{waited:.0f}" if waited >= 10 else f"{waited:.2g}"  # (a sub-second timeout read "for 0 s")
        logger.error(
            f"no optimizer step has ended for {seconds} s (last: step {self._last_step}; --hang-timeout "
            f"{self.timeout:g}): every thread's stack is in {target}; `hf-distprof hang-report {folder}` "
            "compares the ranks"
        )
        recorder = folder / paths.FLIGHT_RECORDER_NAME.format(rank=rank, host=host)
        try:
            if dump_flight_recorder(recorder):
                self.dumps.append(recorder)
                logger.error(f"flight recorder of this rank: {recorder}")
        except Exception as err:  # noqa: BLE001 - the stacks are written; the recorder is a bonus
            logger.warning(f"could not dump the flight recorder: {err!r}")
        return target

    # ---- the GIL-free backstop -------------------------------------------------------------------

    def _open_backstop(self) -> None:
        folder = self.run_dir
        if folder is None:
            return
        path = folder / paths.HANG_BACKSTOP_NAME.format(rank=dist.get_rank(), host=dist.get_hostname())
        try:
            self._backstop = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to its fd
        except OSError as err:
            logger.warning(f"cannot open {path}: {err!r}; the hang watchdog runs without its backstop")
            return
        # A rank that ends before train end (an exception, SIGTERM) tidies it too (a trial: empty files left behind).
        self._backstop_pid = os.getpid()
        atexit.register(self._discard_backstop)
        signals.at_default_death(self._discard_backstop, guard=True)

    def _discard_backstop(self) -> None:
        """Disarm the backstop; its file goes when it never fired (empty). In the process that armed it only (a forked
        child's exit leaves the rank's alone)."""
        if self._backstop is None or self._backstop_pid != os.getpid():
            return
        atexit.unregister(self._discard_backstop)
        signals.forget_at_default_death(self._discard_backstop)
        faulthandler.cancel_dump_traceback_later()
        backstop, self._backstop = self._backstop, None
        if backstop is None:
            return
        backstop.close()
        path = Path(backstop.name)
        if path.exists() and path.stat().st_size == 0:
            path.unlink()

    def _arm_backstop(self) -> None:
        """(Re-)arm faulthandler's C-level dump; it fires only if this thread stops running (the GIL is held)."""
        if self._backstop is None:
            return
        faulthandler.dump_traceback_later(
            BACKSTOP_FACTOR * self.timeout + 10, repeat=False, file=self._backstop, exit=self.args.hang_abort
        )


def _all_handlers() -> list[Any]:
    import logging

    handlers = list(logging.getLogger().handlers)
    for name in ("hf_distprof", __name__):
        handlers += logging.getLogger(name).handlers
    return handlers
