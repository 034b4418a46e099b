"""Stages 1 and 2 in worker processes: each trace file read and analysed on its own, a slim result sent back.

As Kineto's loader does, each worker parses one rank's trace (or its compact file) and returns the rank's result,
not its events: the parent does the cross-rank work on those.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank.analyze import analyze_rank
from hf_distprof.analysis.read.events import ParsedTrace, parse_trace
from hf_distprof.analysis.read.trace_io import TraceReadError
from hf_distprof.analysis.results.rank import FileError, RankResult
from hf_distprof.core.names import COMPACT_SUFFIX

PROGRESS_MIN_FILES = 8


def analyze_file(
    path: str, options: AnalysisOptions, read_compact: bool = True, write_compact: bool = False
) -> RankResult | FileError:
    """Parse and analyse one trace file; a bad file becomes a :class:`FileError` naming it.

    Runs in a worker process, so it returns the small result rather than the parsed events. The trace's
    compact file (:mod:`hf_distprof.analysis.read.compact`) stands in for its JSON when there is a usable one
    and ``read_compact``; ``write_compact`` writes one when there is none.
    """
    try:
        shapes = True if options.message_sizes == "shapes" else None  # None: parse_trace's default
        return analyze_rank(_load(path, shapes, read_compact, write_compact), options)
    except TraceReadError as exc:
        return FileError(path=exc.path, reason=exc.reason)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        # A JSON document shaped like a trace but with malformed events (an "X" event without "ts" ...).
        return FileError(path=str(path), reason=f"malformed trace event ({type(exc).__name__}: {exc})")


def _load(path: str, shapes: bool | None, read_compact: bool, write_compact: bool) -> ParsedTrace:
    """The parsed trace: :func:`~hf_distprof.analysis.read.compact.load_trace`, whose module (msgpack, hashing) is
    imported only when there is a compact file to read or one to write; else the JSON, as ``load_trace`` reads it."""
    if not write_compact and not (read_compact and os.path.isfile(str(path) + COMPACT_SUFFIX)):
        return parse_trace(path, shapes=shapes)
    from hf_distprof.analysis.read.compact import load_trace

    return load_trace(path, shapes, read_compact, write_compact)


def _start_method() -> str:
    """``fork`` when this process has a single OS thread (the CLI), else ``spawn``.

    Forking a process with other threads (a training process: torch's thread pools, NCCL/gloo threads)
    can deadlock the child, so then the workers are spawned, which re-imports this light package in each.
    A single-threaded process forks safely and saves that start-up (~0.1-0.2 s per worker). The thread
    count is read from ``/proc/self/task``, which sees native threads that ``threading`` does not.
    """
    try:
        single_threaded = len(os.listdir("/proc/self/task")) == 1
    except OSError:  # not Linux
        single_threaded = False
    return "fork" if single_threaded else "spawn"


PARALLEL_BYTES = 16 * 2**20
"""With ``workers=0`` (the default), files of less than this in all are read in this process: starting worker processes
costs more than they save (the 8 shared DLRM traces, 1 MB in all, take 60 ms one after the other)."""


def worker_count(files: list[str], workers: int) -> int:
    """How many processes read ``files``: ``workers`` when given; else one per file, at most one per CPU core, when
    the files are large enough to pay for them (:data:`PARALLEL_BYTES`), else 1."""
    if workers:
        return workers
    try:
        size = sum(os.path.getsize(f) for f in files)
    except OSError:
        size = PARALLEL_BYTES  # a file that cannot be sized is read (and its error reported) by the workers
    return min(len(files), os.cpu_count() or 1) if size >= PARALLEL_BYTES else 1


def _worker_init() -> None:
    """A worker's set-up: the cyclic garbage collector off for the worker's life.

    A rank's analysis builds hundreds of thousands of small objects (tuples, lists) and no reference cycles, so the
    collector's passes find nothing and cost ~15% of a rank's time; the worker's memory goes when it exits."""
    gc.disable()


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while ranks are analysed in this process, or their results compared (see
    :func:`_worker_init`: the analysis makes no reference cycles), then as it was.

    Only on the main thread (the CLI, a notebook): the collector is the whole process's, and a training rank analyses
    its run in a thread of its own while training may go on; there it stays as the user set it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_all(
    files: list[str], options: AnalysisOptions, read_compact: bool = True, write_compact: bool = False,
    meanwhile: Callable[[], object] | None = None,
) -> list[RankResult | FileError]:
    """Every file read and analysed (:func:`analyze_file`), in worker processes when they pay (:func:`worker_count`).

    ``meanwhile`` runs in this process while the workers work (once they are started; before the first file when
    the files are read here): what the caller needs next and the workers do not (the later stages' imports)."""
    workers = worker_count(files, options.workers)
    show = options.progress
    if show is None:
        show = len(files) >= PROGRESS_MIN_FILES and sys.stderr.isatty()
    bar = None
    if show:
        from tqdm import tqdm  # imported only when a bar is shown

        bar = tqdm(total=len(files), desc="analysing traces", unit="file", file=sys.stderr)
    results: list[RankResult | FileError] = []
    try:
        if workers <= 1 or len(files) == 1:
            if meanwhile is not None:
                meanwhile()
            with collector_paused():
                for path in files:
                    results.append(analyze_file(path, options, read_compact, write_compact))
                    if bar is not None:
                        bar.update(1)
        else:
            # Imported only here: a run read in this process (small traces, compact files read one by one) does not
            # pay for them (~15 ms of the CLI's start).
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context(_start_method())
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init) as pool:
                futures = [pool.submit(analyze_file, path, options, read_compact, write_compact) for path in files]
                if meanwhile is not None:
                    meanwhile()  # the workers are running (forked at the first submit)
                for future in as_completed(futures):
                    results.append(future.result())
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


