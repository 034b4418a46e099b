"""A rank that dies leaves its stack: ``faulthandler`` writes every thread's Python stack into ``rank{R}_crash.txt``
in the run folder when the process gets a fatal signal (SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL), and the file is
removed at a clean exit when nothing was written. An uncaught Python exception that ends the rank (the commonest
crash, whose traceback otherwise reaches only the launcher's console) leaves ``rank{R}_exception.txt``: its time and
traceback, written from ``sys.excepthook`` before the hook that was there prints it as usual.
A rank that a termination signal's default action ends (SIGTERM: a scheduler, a user, the launcher once another rank
failed) leaves ``rank{R}_stopped.txt``: the signal, its time and every thread's stack then, so that a stop can be
ordered against its peers' exceptions. ``hf-distprof hang-report RUN_FOLDER`` reads these files beside the
hang dumps and says which rank died, of what, where (:mod:`hf_distprof.runs.hang_report`).

Armed on every rank of a run with any hf_distprof flag, as soon as its run folder exists
(:func:`hf_distprof.paths.run_dir`). A script that enabled ``faulthandler`` itself (``python -X faulthandler``,
``PYTHONFAULTHANDLER``) keeps it where it pointed it: this module then leaves it alone.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from hf_distprof import dist
from hf_distprof.core import signals
from hf_distprof.core.names import CRASH_NAME, EXCEPTION_NAME, STOPPED_NAME
from hf_distprof.core.stacks import format_stacks

logger = dist.get_logger(__name__)

_FILE: IO[str] | None = None
_PATH: Path | None = None
_PID = 0
"""The process that armed the crash file."""
_EXCEPTION: Path | None = None
"""Where an uncaught exception's traceback goes (this rank's file in the latest run folder)."""
_EXCEPTION_RANK = 0
_EXCEPTION_PID = 0
_PREVIOUS_HOOK: Any = None


def record_crashes(run_dir: Path, rank: int) -> Path | None:
    """Have ``faulthandler`` write this process's stacks into ``run_dir / rank{R}_crash.txt`` on a fatal signal.

    A later run folder in the same process takes the file over (the earlier one is closed, and removed when empty).

    Returns:
        The file, or None when the script enabled ``faulthandler`` itself or the file cannot be opened (one line in
        the log).
    """
    global _FILE, _PATH, _PID
    _record_exceptions(run_dir / EXCEPTION_NAME.format(rank=rank), rank)
    path = run_dir / CRASH_NAME.format(rank=rank)
    if _PATH == path:
        return path
    if _FILE is None and faulthandler.is_enabled():
        return None  # the script's own: it points where the user asked
    finish()
    try:
        handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to its descriptor
    except OSError as err:
        logger.warning(f"cannot write {path}: {err!r}; a crash of this rank would leave no stack")
        return None
    faulthandler.enable(file=handle, all_threads=True)
    _FILE, _PATH, _PID = handle, path, os.getpid()
    return path


def _stopped() -> None:
    """Before a signal's default action ends the rank: ``rank{R}_stopped.txt`` beside its exception file (the signal,
    its time, every thread's stack; also where the script's own faulthandler left no crash file), then the empty crash
    file goes (:func:`finish`), whatever failed before."""
    try:
        signum = signals.stopping_signal()
        if signum is not None and _EXCEPTION is not None and _EXCEPTION_PID == os.getpid():
            arrived = signals.arrival(signum)  # when and where the signal found the rank, before what it waited for
            now = arrived[0] if arrived is not None else time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal-{signum}"
            _EXCEPTION.with_name(STOPPED_NAME.format(rank=_EXCEPTION_RANK)).write_text(
                f"hf_distprof: rank {_EXCEPTION_RANK} on host {dist.get_hostname()} stopped by {name} at {stamp} (unix "
                f"{now:.6f})\n\n{format_stacks(_interrupted(arrived[1] if arrived is not None else None))}",
                encoding="utf-8")
    except Exception:  # noqa: BLE001, S110 - the folder is gone or read-only: the stop goes unrecorded, the rank ends
        pass
    finally:
        finish()


def _record_exceptions(path: Path, rank: int) -> None:
    """Have an uncaught exception's traceback written into ``path`` (a later run folder takes it over)."""
    global _EXCEPTION, _EXCEPTION_RANK, _EXCEPTION_PID, _PREVIOUS_HOOK
    _EXCEPTION, _EXCEPTION_RANK, _EXCEPTION_PID = path, rank, os.getpid()
    # A rank stopped by SIGTERM through our handlers: stopped, not crashed, and when, in its stop file beside this one
    # (registered in this process: a forked child, a multiprocessing worker stopped so, leaves the rank's files alone).
    signals.at_default_death(_stopped)
    if sys.excepthook is not _on_uncaught:
        _PREVIOUS_HOOK = sys.excepthook
        sys.excepthook = _on_uncaught


def _on_uncaught(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook``: the traceback into this rank's exception file, then the hook from before (which prints
    it). Ctrl-C is a stop, not a crash: no file."""
    path = _EXCEPTION
    if path is not None and not issubclass(kind, KeyboardInterrupt) and _EXCEPTION_PID == os.getpid():
        try:
            now = time.time()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
            head = (f"hf_distprof: rank {_EXCEPTION_RANK} on host {dist.get_hostname()} ended by an uncaught "
                    f"exception at {stamp} (unix {now:.6f})\n")
            path.write_text(head + "".join(traceback.format_exception(kind, value, tb)), encoding="utf-8")
        except Exception:  # noqa: BLE001, S110 - the traceback is printed below in any case
            pass
    (_PREVIOUS_HOOK or sys.__excepthook__)(kind, value, tb)


def _interrupted(where: Any = None) -> dict[int, Any]:
    """Every thread's frame, the main thread's at the code the signal interrupted: ``where``, the stack of the frame its
    handler was given when it arrived; else the handler's own frames (here, :mod:`hf_distprof.core.signals`, a
    callback's ``_on_signal``) left out of the thread that runs it."""
    frames = sys._current_frames()
    if where is not None:
        frames[threading.main_thread().ident or -1] = where
        return frames
    me = threading.get_ident()
    frame = frames.get(me)
    ours = {__file__, signals.__file__}
    while frame is not None and (frame.f_code.co_filename in ours or frame.f_code.co_name == "_on_signal"):
        frame = frame.f_back
    if frame is None:
        frames.pop(me, None)
    else:
        frames[me] = frame
    return frames


def finish() -> None:
    """Stop recording (a clean exit, or a new run folder): the file is closed, and removed when it is empty; in the
    process that armed it only (a forked child's exit leaves the rank's file alone)."""
    global _FILE, _PATH
    if _FILE is None or _PATH is None or _PID != os.getpid():
        return
    faulthandler.disable()
    handle, path = _FILE, _PATH
    _FILE = _PATH = None
    try:
        handle.close()
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:  # the folder is gone or read-only now: nothing to tidy
        pass


def current() -> Path | None:
    """The crash file this process writes into, if any."""
    return _PATH


atexit.register(finish)  # a clean exit (dist.finish runs the atexit handlers too) leaves no empty file


def _forget_in_child() -> None:
    """A forked child (a DataLoader or multiprocessing worker) is not the rank: its fatal signal is not written into
    the rank's crash file (which would then say the rank crashed), nor its exception into the rank's."""
    global _FILE, _PATH, _EXCEPTION
    if _FILE is not None:
        faulthandler.disable()
        handle, _FILE, _PATH = _FILE, None, None
        try:
            handle.close()  # (the child's copy of the descriptor)
        except OSError:
            pass
    _EXCEPTION = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
