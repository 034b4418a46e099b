"""Compact summaries written at export, off the training thread: one background thread per trace, joined at close.

Writing a trace's compact file (:mod:`hf_distprof.analysis.read.compact`) parses the trace just written, which takes
a fraction of a second to seconds; a thread does it while training goes on. The profiler callback joins the
threads when it closes, before its exit handlers are removed, so a SIGTERM or SIGINT during a write (they reach
the callback's handler on the main thread, which closes) waits for the file to be whole, and the process never
ends with a temporary file left. A failed write is one warning: the trace is already written and
``hf-distprof analyze`` reads its JSON instead.
"""

from __future__ import annotations

import threading
from pathlib import Path

from hf_distprof import dist

logger = dist.get_logger(__name__)


def _write(trace: Path) -> None:
    from hf_distprof.analysis.read.compact import write_compact  # the analysis is imported only when a trace is

    try:
        write_compact(trace)
    except Exception as err:  # noqa: BLE001 - a failed summary must not stop training
        logger.warning(f"could not write the compact summary of {trace}: {err!r}; analyze reads the trace instead")


class CompactExports:
    """The compact files being written beside traces, each on its own thread."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def submit(self, trace: Path) -> None:
        """Start writing ``trace``'s compact file on a background thread."""
        self._threads = [t for t in self._threads if t.is_alive()]
        # Not a daemon: an interpreter that exits normally waits for the file rather than leave a temporary one.
        thread = threading.Thread(target=_write, args=(trace,), name=f"hf_distprof-compact-{trace.name}")
        thread.start()
        self._threads.append(thread)

    def busy(self) -> bool:
        """Whether a compact file is being written now (its thread competes with training for the GIL)."""
        if not self._threads:  # every step asks, twice: most of them with no thread ever started
            return False
        self._threads = [t for t in self._threads if t.is_alive()]  # a finished thread needs no join
        return bool(self._threads)

    def join(self) -> None:
        """Wait until every compact file started so far is written (or has failed)."""
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()
