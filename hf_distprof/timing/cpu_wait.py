"""How long the calling thread was ready to run but waiting for a CPU: Linux's per-thread run-queue delay.

``/proc/thread-self/schedstat`` holds three numbers: nanoseconds on a CPU, nanoseconds runnable but waiting in a
run queue, and time slices. The second is what a rank loses when its host has more runnable threads than cores
(other jobs, data-loader workers, intra-op thread pools): its own work then takes longer in wall time although
it did no more work. The step timer reads it at the start and end of each step (two ``pread`` calls of a few
microseconds, no sync) and takes this wait out of the pre-sync time the slow-rank verdict compares, so that a
rank starved of CPU by its machine is reported as such instead of as a straggler.

Where the file does not exist (not Linux, no schedstats in the kernel) every read returns None and nothing is
taken out.
"""

from __future__ import annotations

import os
import threading
from os import pread
from threading import get_ident

SCHEDSTAT = "/proc/thread-self/schedstat"


_NOBODY = (-1, -1, -1)


_PID = os.getpid()  # this process's id, kept current in a forked child


def _forked() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class RunQueueClock:
    """Reads the calling thread's cumulative run-queue delay, in seconds.

    The file is opened once per thread and read again with ``pread`` (the kernel regenerates it on each read
    from offset 0). Reads on a thread other than the one that opened it open their own file: the numbers are
    always the calling thread's. The first thread to read (the training thread, at every phase) is served without the
    thread-local lookup; a thread id that comes back after its thread ended, or in a forked child, is not taken for it.

    Args:
        path: The schedstat file (a test can point it elsewhere).
    """

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self.path = path
        self._local = threading.local()
        self._broken = False
        # (thread id, process id, descriptor) of the first reading thread's file, in one attribute so that it is
        # replaced whole.
        self._first = _NOBODY

    def read(self) -> float | None:
        """Seconds this thread has spent runnable but not running since it started; None when unknown."""
        return self.seconds(self.raw())

    def raw(self) -> bytes | None:
        """The file's bytes now (one ``pread``), to be turned into seconds later by :meth:`seconds`: the step timer
        reads at phase boundaries and does the arithmetic on logging steps. None when unknown."""
        ident, pid, first_fd = self._first
        if ident == get_ident() and pid == _PID:
            try:
                return pread(first_fd, 128, 0)
            except OSError:  # that thread ended and this one has its id: this thread's own file, below
                self._first = _NOBODY
        if self._broken:
            return None
        opened = getattr(self._local, "opened", None)  # (process id, descriptor)
        try:
            if opened is None or opened[0] != _PID:  # none yet on this thread, or one a forked child inherited
                opened = (_PID, os.open(self.path, os.O_RDONLY))
                self._local.opened = opened
                if self._first[0] == -1:
                    self._first = (get_ident(), _PID, opened[1])
            return os.pread(opened[1], 128, 0)
        except OSError:
            self._give_up()
            return None

    def _give_up(self) -> None:
        """One failure means the file is not what we expect here: stop trying."""
        self._broken = True
        self._first = _NOBODY

    def seconds(self, raw: bytes | None) -> float | None:
        """The run-queue seconds in a :meth:`raw` reading; None when unknown or garbled (then no more reads)."""
        if raw is None:
            return None
        try:
            return int(raw.split()[1]) / 1e9
        except (ValueError, IndexError):
            self._give_up()
            return None

    def close(self) -> None:
        """Close the calling thread's file."""
        opened = getattr(self._local, "opened", None)
        if opened is not None:
            self._local.opened = None
            if opened[1] == self._first[2] and opened[0] == self._first[1]:
                self._first = _NOBODY
            try:
                os.close(opened[1])
            except OSError:
                pass


def waited(begin: float | None, end: float | None) -> float | None:
    """Run-queue seconds between two reads; None when either is unknown (or the counter went back)."""
    if begin is None or end is None or end < begin:
        return None
    return end - begin
