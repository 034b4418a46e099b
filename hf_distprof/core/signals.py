"""Termination signals that wait for a write in progress.

A scheduler stops a job with SIGTERM (SIGINT from a terminal) at any moment, also while a rank is writing a
trace. Dying in the middle of that write loses the trace and leaves the temporary file behind. Inside
:func:`deferred` the signal is noted instead of acted on; when the block ends, the signal is raised again for
whatever handler was there before (the default one ends the process with the signal's status, as the
scheduler expects). Writes are short (an export takes about a second), far inside the grace period
schedulers and torchrun give before SIGKILL (30 s by default).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

# The signals a job is stopped with; both wait for a write to finish.
TERMINATION_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def deferred(signals: tuple[signal.Signals, ...] = TERMINATION_SIGNALS) -> Iterator[list[int]]:
    """Hold ``signals`` back until the block ends, then raise each one that arrived, once.

    Only the main thread can install signal handlers: elsewhere (an export on a worker thread) the block
    runs unprotected. Nesting is safe: an inner block hands its signals to the outer one's handler. A handler
    installed inside the block replaces the one from before it and receives the held signals.

    Yields:
        The signal numbers that arrived so far (for tests and logging).
    """
    pending: list[int] = []
    previous_handlers: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum not in pending:
            pending.append(signum)
        note_arrival(signum, frame)

    hold.holds_for = previous_handlers  # type: ignore[attr-defined]  # see held_for

    # A handler installed outside Python (getsignal() is None) cannot be put back: leave that signal alone.
    previous = previous_handlers
    previous.update({s: signal.signal(s, hold) for s in signals if signal.getsignal(s) is not None})
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            # A handler installed inside the block (a callback putting back the one it replaced) stays.
            if signal.getsignal(s) is hold:
                signal.signal(s, handler)
        # SIGTERM first: a Ctrl-C held beside it would raise KeyboardInterrupt and drop it.
        for signum in sorted(pending, key=lambda s: s != signal.SIGTERM):
            # Delivered now to the handler in place after the block: the default one ends the process, which is
            # no crash: the empty crash file goes first (no atexit handler runs on a signal's default action).
            try:
                if signal.getsignal(signum) == signal.SIG_DFL:
                    before_default_death(signum)
            finally:  # (a Ctrl-C inside those writes must not keep the signal from its effect)
                signal.raise_signal(signum)  # (its Python handler runs before this returns)
            forget_arrival(signum)  # still here: a handler took it without ending the process


_BEFORE_DEATH: list[Callable[[], None]] = []
_GUARDED: list[Callable[[], None]] = []
_OWNER: dict[Callable[[], None], int] = {}
"""The process each was registered in: a forked child (a multiprocessing worker) runs none of its parent's."""


def _mine(fns: list[Callable[[], None]]) -> list[Callable[[], None]]:
    pid = os.getpid()
    return [fn for fn in fns if _OWNER.get(fn) == pid]


def at_default_death(fn: Callable[[], None], guard: bool = False) -> None:
    """Call ``fn`` before this module (or a caller of :func:`before_default_death`) lets a signal's default action
    end the process, where no ``atexit`` handler runs (the crash file's tidying: :mod:`hf_distprof.crash`).

    With ``guard`` (a callback's rows not yet written), SIGTERM itself is made to run it while ``fn`` is registered:
    where SIGTERM has its default action (a rank that no profiler window holds, a run with the step timer or the
    memory logger alone, stopped by torchrun after another rank failed, or by a scheduler), :func:`_flush_then_die`
    stands in for it, runs what is registered, then lets the default action end the process with the signal's status.
    A handler the script or the profiler installed is left alone (the profiler's runs these too)."""
    if fn not in _BEFORE_DEATH:
        _BEFORE_DEATH.append(fn)
    if guard and fn not in _GUARDED:
        _GUARDED.append(fn)
    _OWNER[fn] = os.getpid()
    rearm()


def forget_at_default_death(fn: Callable[[], None]) -> None:
    """Undo :func:`at_default_death` (a callback's train end: nothing of it is left to tidy); SIGTERM's default
    action is put back when nothing guarded is left (and the stand-in is still in place)."""
    if fn in _BEFORE_DEATH:
        _BEFORE_DEATH.remove(fn)
    if fn in _GUARDED:
        _GUARDED.remove(fn)
    _OWNER.pop(fn, None)
    if not _mine(_GUARDED) and threading.current_thread() is threading.main_thread() and \
            held_for(signal.getsignal(signal.SIGTERM), signal.SIGTERM) is _flush_then_die:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _stop_watch()


def rearm() -> None:
    """Put the stand-in for SIGTERM's default action in place where the default is in place and something registered
    with ``guard`` is left (also after the profiler put the default back at its close)."""
    if _mine(_GUARDED) and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _flush_then_die)
        _start_watch()


_RAN = threading.Event()
"""Set when the main thread runs :func:`_flush_then_die`."""


def _flush_then_die(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's default action, after what :func:`at_default_death` registered (the step timer's last rows, the
    memory logger's lines, the empty crash file's removal)."""
    _RAN.set()
    try:
        note_arrival(signum, frame)
        before_default_death(signum)
    finally:  # (a Ctrl-C inside those writes must not keep the signal from its effect)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


# A Python signal handler runs on the main thread, between bytecodes: a main thread blocked in native code (a collective
# waiting for a rank that died, a device sync) would not run the stand-in until it returns, and SIGTERM, which would
# have ended the process at once, would wait for the launcher's SIGKILL. So while the stand-in is in place, the
# signal's arrival is also written to a pipe (``signal.set_wakeup_fd``, where no one else uses it) that a thread reads:
# when the main thread has not run the stand-in within GRACE_S, that thread runs it, then ends the process as the
# signal's default action would have.
GRACE_S = 2.0
_WATCH: tuple[int, int] | None = None
"""The pipe's read and write ends while the watch runs."""


def _start_watch() -> None:
    """On the main thread, with the stand-in in place: the pipe and the thread reading it (not where another wakeup
    descriptor is set, an event loop's: then the stand-in waits for the main thread)."""
    global _WATCH
    if _WATCH is not None:
        return
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read)
        os.close(write)
        return
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return
    _WATCH = (read, write)
    threading.Thread(target=_watch, args=(read,), name="hf_distprof-sigterm-watch", daemon=True).start()


def _stop_watch() -> None:
    """On the main thread, the stand-in gone: the wakeup descriptor put back (unless another's replaced it since); the
    thread ends when the pipe closes."""
    global _WATCH
    if _WATCH is None:
        return
    _, write = _WATCH
    _WATCH = None
    try:
        current = signal.set_wakeup_fd(-1)
        if current != write:
            signal.set_wakeup_fd(current)  # another's since: left in place, and our end stays open behind it
            return
    except (ValueError, OSError):
        pass
    os.close(write)


def _watch(read: int) -> None:
    try:
        while data := os.read(read, 512):
            if int(signal.SIGTERM) not in data or signal.getsignal(signal.SIGTERM) is not _flush_then_die:
                continue
            note_arrival(signal.SIGTERM, None)  # (the main thread's handler, if it runs, keeps this time)
            where = _main_position()
            # Acted on only when the main thread ran no Python meanwhile (it would have run the stand-in, or a handler
            # of the script's that took the signal and put ours back): it is stuck in native code.
            if not _RAN.wait(GRACE_S) and signal.getsignal(signal.SIGTERM) is _flush_then_die \
                    and where is not None and _main_position() == where:
                # Its rows written from here, within TIDY_S (a main thread stuck in a write holds its file's lock).
                tidy = threading.Thread(target=before_default_death, args=(signal.SIGTERM,),
                                        name="hf_distprof-sigterm-tidy", daemon=True)
                tidy.start()
                tidy.join(TIDY_S)
                _die(signal.SIGTERM)
    except OSError:
        pass
    finally:
        os.close(read)


def _main_position() -> tuple[int, int] | None:
    """Where the main thread is in its Python code (its frame, and the instruction in it); None if unknown."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    return (id(frame), frame.f_lasti) if frame is not None else None


def _die(signum: int) -> None:
    """End the process as ``signum``'s default action does, from a thread (``signal.signal`` is the main thread's)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(int(signum), None)  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(5.0)
    finally:
        os._exit(128 + int(signum))


def _after_fork_in_child() -> None:
    """A forked child (a multiprocessing worker, ``datasets.map(num_proc=...)``) is not the rank: SIGTERM ends it
    without the parent's rows (what the parent registered is not the child's: :func:`_mine`), and the parent's pipe is
    closed in it (a child's SIGTERM would reach the parent's watch)."""
    global _WATCH
    if not _mine(_GUARDED) and signal.getsignal(signal.SIGTERM) is _flush_then_die:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _WATCH is not None:
        read, write = _WATCH
        _WATCH = None
        with contextlib.suppress(ValueError, OSError):
            if (other := signal.set_wakeup_fd(-1)) != write:
                signal.set_wakeup_fd(other)  # another's: put back
        for fd in (read, write):
            with contextlib.suppress(OSError):
                os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_WRITING = threading.Lock()
TIDY_S = 10.0
"""How long a second caller waits for the first one's last writes (the watch thread and the main thread's handler,
the hang watchdog's abort): each write is idempotent, so one after the other, never both at once."""


_ARRIVAL: dict[int, tuple[float, traceback.StackSummary | None]] = {}
ARRIVAL_FRESH_S = 120.0
"""An arrival older than this is another signal's, one a handler took without ending the process."""


def note_arrival(signum: int, frame: FrameType | None) -> None:
    """When a termination signal arrived, and the stack of the frame it interrupted (taken now: the frame runs on; None:
    not known), for the stop file: the first arrival of ``signum`` until it takes effect (a held signal is raised again
    at its block's end, and the writes before it take time: the stop's record must say when and where the signal found
    the rank)."""
    now = time.time()
    kept = _ARRIVAL.get(int(signum))
    if kept is not None and now - kept[0] < ARRIVAL_FRESH_S:
        if kept[1] is None and frame is not None:
            _ARRIVAL[int(signum)] = (kept[0], _stack(frame))
        return
    _ARRIVAL[int(signum)] = (now, _stack(frame) if frame is not None else None)


def _stack(frame: FrameType) -> traceback.StackSummary:
    """The frame's stack, outermost first, its source lines read only when it is formatted (no file is read in a
    signal's handler)."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
    stack.reverse()
    return stack


def arrival(signum: int) -> tuple[float, traceback.StackSummary | None] | None:
    """When ``signum`` arrived (unix time) and the stack it interrupted, as :func:`note_arrival` kept them."""
    kept = _ARRIVAL.get(int(signum))
    return kept if kept is not None and time.time() - kept[0] < ARRIVAL_FRESH_S else None


def forget_arrival(signum: int) -> None:
    """A handler took ``signum`` without ending the process: its arrival is no later stop's."""
    _ARRIVAL.pop(int(signum), None)


_STOPPING: list[int] = []
"""The signal whose default action is about to end the process (:func:`stopping_signal`)."""


def stopping_signal() -> int | None:
    """While :func:`before_default_death` runs what was registered: the signal about to end the process (SIGTERM,
    SIGINT), or None where no signal does (``--hang-abort``'s exit)."""
    return _STOPPING[-1] if _STOPPING else None


def before_default_death(signum: int | None = None) -> None:
    """Run what :func:`at_default_death` registered in this process; a failure there never keeps the signal from its
    effect. One caller at a time: another thread already writing is waited for, at most :data:`TIDY_S`.

    Args:
        signum: The signal whose default action ends the process next (:func:`stopping_signal` while this runs);
            None when the process ends otherwise (``--hang-abort``'s exit).
    """
    if not _WRITING.acquire(timeout=TIDY_S):
        return
    _STOPPING[:] = [] if signum is None else [int(signum)]
    try:
        for fn in _mine(_BEFORE_DEATH):
            try:
                fn()
            except Exception:  # noqa: BLE001, S110 - the process is about to end of its signal either way
                pass
    finally:
        _STOPPING.clear()
        _WRITING.release()


def held_for(handler: Any, signum: int) -> Any:
    """When ``handler`` is :func:`deferred`'s stand-in, the handler it holds ``signum`` for (the one it puts back
    after its block); else ``handler`` itself. A callback that removes its handler inside a deferred block asks this:
    its handler is then the held one, and putting the one before it back makes ``deferred`` leave that in place."""
    held = getattr(handler, "holds_for", None)
    while isinstance(held, dict) and signum in held:  # nested blocks: the outermost's
        handler = held[signum]
        held = getattr(handler, "holds_for", None)
    return handler
