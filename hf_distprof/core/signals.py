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
import signal
import threading
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
        for signum in pending:
            # Delivered now to the handler in place after the block: the default one ends the process, which is
            # no crash: the empty crash file goes first (no atexit handler runs on a signal's default action).
            if signal.getsignal(signum) == signal.SIG_DFL:
                before_default_death()
            signal.raise_signal(signum)


_BEFORE_DEATH: list[Callable[[], None]] = []
_GUARDED: list[Callable[[], None]] = []


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
    rearm()


def forget_at_default_death(fn: Callable[[], None]) -> None:
    """Undo :func:`at_default_death` (a callback's train end: nothing of it is left to tidy); SIGTERM's default
    action is put back when nothing guarded is left (and the stand-in is still in place)."""
    if fn in _BEFORE_DEATH:
        _BEFORE_DEATH.remove(fn)
    if fn in _GUARDED:
        _GUARDED.remove(fn)
    if not _GUARDED and threading.current_thread() is threading.main_thread() and \
            held_for(signal.getsignal(signal.SIGTERM), signal.SIGTERM) is _flush_then_die:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def rearm() -> None:
    """Put the stand-in for SIGTERM's default action in place where the default is in place and something registered
    with ``guard`` is left (also after the profiler put the default back at its close)."""
    if _GUARDED and threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _flush_then_die)


def _flush_then_die(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's default action, after what :func:`at_default_death` registered (the step timer's last rows, the
    memory logger's lines, the empty crash file's removal)."""
    before_default_death()
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


def before_default_death() -> None:
    """Run what :func:`at_default_death` registered; a failure there never keeps the signal from its effect."""
    for fn in _BEFORE_DEATH:
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 - the process is about to end of its signal either way
            pass


def held_for(handler: Any, signum: int) -> Any:
    """When ``handler`` is :func:`deferred`'s stand-in, the handler it holds ``signum`` for (the one it puts back
    after its block); else ``handler`` itself. A callback that removes its handler inside a deferred block asks this:
    its handler is then the held one, and putting the one before it back makes ``deferred`` leave that in place."""
    held = getattr(handler, "holds_for", None)
    while isinstance(held, dict) and signum in held:  # nested blocks: the outermost's
        handler = held[signum]
        held = getattr(handler, "holds_for", None)
    return handler
