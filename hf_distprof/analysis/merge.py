"""Merge per-rank traces into one gzipped Chrome/Perfetto trace: one process per rank, clocks aligned.

Clock alignment (``align="collectives"``, the default): every rank's timestamps are shifted onto rank
``min``'s clock by the analysis's offsets (:func:`hf_distprof.analysis.across.align.clock_offsets`: another host's as
the run manifest measured it while the traces agree with it, else the median, over all collectives matched across
ranks, of the difference between the ends of the same collective). This removes
clock skew between hosts and the different ``baseTimeNanoseconds`` of each trace. ``align="none"`` only
applies ``baseTimeNanoseconds``, trusting the hosts' clocks (fine on one host). Without a matched
collective, ``collectives`` falls back to ``clock``, else to ``none``.

``align="clock"``: ``baseTimeNanoseconds`` corrected by the clock offsets the run manifest measured at train start
(:mod:`hf_distprof.callbacks.profiler.manifest`: each host's clock against rank 0's, within half the shortest
ping-pong round trip). It removes the hosts' clock offsets as they were at start, whatever the trace holds (no
collective needed, and a rank that really leaves a collective late stays late); it cannot remove drift after the
start, a clock stepped during the run, or a network path slower one way than the other (within the stated
uncertainty). Without a manifest covering every rank, ``clock`` falls back to ``none``. """

from __future__ import annotations

import errno
import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hf_distprof.analysis.across.align import align as align_ranks
from hf_distprof.analysis.api import analyze_paths
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.read.trace_io import iter_trace_events
from hf_distprof.analysis.results.rank import FileError
from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.core.files import atomic_path

ALIGN_MODES = ("collectives", "clock", "none")
_PROCESS_META = frozenset({"process_name", "process_labels", "process_sort_index"})


@dataclass
class MergeResult:
    """What ``merge_traces`` wrote."""

    output: str
    ranks: list[int]
    shifts_us: dict[int, float]
    """Microseconds added to each rank's timestamps."""
    align: str
    """The alignment actually used ("collectives", "clock" or "none")."""
    matched_collectives: int
    n_events: int
    errors: list[FileError]
    clock_uncertainty_us: float | None = None
    """With ``align == "clock"``: the largest uncertainty of the manifest's offsets used."""


def merge_traces(
    paths: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    align: str = "collectives",
    options: AnalysisOptions | None = None,
) -> MergeResult:
    """Write one gzipped trace holding every rank's events, one process per rank named ``rank N``.

    Args:
        paths: Trace files and/or folders (one file per rank).
        output: The merged trace to write (``.json.gz``); written atomically.
        align: ``"collectives"``, ``"clock"`` or ``"none"`` (see the module docstring).
        options: Options of the analysis pass that finds the collectives (parallelism).

    Returns:
        What was written, with the shift applied to each rank.

    Raises:
        ValueError: ``align`` is not a valid mode, or no trace could be read.
        FileNotFoundError: A path does not exist, or a folder holds no trace.
        OSError: ``output`` cannot be written (see :func:`write_merged`).
    """
    _check_align(align)
    return write_merged(analyze_paths(paths, options), output, align)


def write_merged(result: AnalysisResult, output: str | os.PathLike[str], align: str = "collectives") -> MergeResult:
    """Write the merged trace of an analysed run (the second half of :func:`merge_traces`).

    Args:
        result: The analysis of the run's traces; its ranks' files are read again and rewritten.
        output: The merged trace to write (``.json.gz``). Written to a temporary file in the same folder,
            renamed onto ``output`` only when complete, and removed on failure.
        align: ``"collectives"``, ``"clock"`` or ``"none"`` (see the module docstring).

    Returns:
        What was written, with the shift applied to each rank.

    Raises:
        ValueError: ``align`` is not a valid mode, or ``result`` holds no rank.
        OSError: ``output`` cannot be written (its folder is missing, it is a folder ...); the error
            names ``output``.
    """

    _check_align(align)
    if not result.ranks:
        reasons = "; ".join(f"{e.path}: {e.reason}" for e in result.errors)
        raise ValueError(f"no trace could be read ({reasons})")
    ranks = result.ranks
    alignment = result.alignment if result.alignment is not None else align_ranks(ranks)
    matched = alignment.matched
    clocks = {c.rank: c for c in result.run.clocks if c.offset_us is not None} if result.run is not None else {}
    measured = all(r.rank in clocks for r in ranks)
    used = "collectives" if align == "collectives" and matched else "clock" if measured and align != "none" else "none"
    ref = ranks[0]
    shifts: dict[int, float] = {}
    uncertainty = None
    if used == "collectives":
        shifts = {r.rank: -alignment.offsets[r.rank] for r in ranks}
    else:
        shifts = {r.rank: (r.base_time_ns - ref.base_time_ns) / 1e3 for r in ranks}
    if used == "clock":
        # An event stamped t on rank r happened at t - offset_r on rank 0's clock.
        ref_offset = float(clocks[ref.rank].offset_us or 0.0)
        shifts = {r: s - (float(clocks[r].offset_us or 0.0) - ref_offset) for r, s in shifts.items()}
        uncertainty = max(float(clocks[r.rank].uncertainty_us or 0.0) for r in ranks)
    out = Path(output)
    if out.is_dir():  # checked first: otherwise the whole trace is written before the rename fails
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(out))
    n_events = 0
    try:
        with atomic_path(out) as tmp, gzip.open(tmp, "wb", compresslevel=6) as fh:
            fh.write(b'{"displayTimeUnit": "ms", "traceEvents": [')
            first = True
            for r in ranks:
                # A rank combined from several windows lists each file: one process, its threads numbered once.
                for chunk in _rank_events(r.path.split(", "), r.rank, shifts[r.rank], len(ranks)):
                    if not chunk:
                        continue
                    if not first:
                        fh.write(b",")
                    fh.write(orjson.dumps(chunk)[1:-1])
                    first = False
                    n_events += len(chunk)
            fh.write(b"]}")
    except OSError as exc:
        # Only the output can fail here (an unreadable input trace raises TraceReadError, a ValueError);
        # the temporary file's name means nothing to the caller, so the error names the output.
        raise type(exc)(exc.errno, exc.strerror or str(exc), str(out)) from exc
    return MergeResult(str(out), [r.rank for r in ranks], shifts, used, len(matched), n_events, result.errors,
                       uncertainty)


def _check_align(align: str) -> None:
    if align not in ALIGN_MODES:
        raise ValueError(f"align must be one of {', '.join(ALIGN_MODES)}, got {align!r}")


def _rank_events(paths: list[str], rank: int, shift: float, n_ranks: int) -> Any:
    """Yield the rank's events (from each of its traces) rewritten: pid = rank, threads renumbered, timestamps shifted.

    Threads of all the rank's original processes (the CPU process, one per GPU) share one process now, so they are
    renumbered and named after their origin, once each: the trace's own name for the thread (``CPU thread 1234
    (python3)``; its first, when it has several), else one made from its ids (``GPU 0 tid 7``), given after the
    last event (a viewer takes a thread's name from whichever record it keeps: two names were a coin flip)."""
    yield [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    tids: dict[tuple[Any, Any], int] = {}
    labels: dict[Any, str] = {}
    named: set[int] = set()
    for chunk in (c for path in paths for c in iter_trace_events(path, {})):
        out = []
        for ev in chunk:
            if not isinstance(ev, dict):
                continue
            name = ev.get("name")
            if ev.get("ph") == "M":
                if name == "process_labels":
                    labels[ev.get("pid")] = str((ev.get("args") or {}).get("labels", ""))
                if name in _PROCESS_META:
                    continue
            key = (ev.get("pid"), ev.get("tid"))
            tid = tids.setdefault(key, len(tids) + 1)
            ev = dict(ev)
            ev["pid"] = rank
            ev["tid"] = tid
            if name == "thread_name" and ev.get("ph") == "M":
                if tid in named:
                    continue
                named.add(tid)
                ev["args"] = {"name": f"{_origin(key[0], labels)} {(ev.get('args') or {}).get('name', '')}".strip()}
            if isinstance(ev.get("ts"), (int, float)):
                ev["ts"] = ev["ts"] + shift
            if "id" in ev and isinstance(ev["id"], int):
                ev["id"] = ev["id"] * n_ranks + rank  # flow ids must not collide between ranks
            out.append(ev)
        yield out
    yield [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": _thread(key, labels)}}
           for key, tid in tids.items() if tid not in named]


def _origin(pid: Any, labels: dict[Any, str]) -> str:
    """The original process a thread came from: its label (``CPU``, ``GPU 0``), a named pseudo-process of Kineto's
    (``Spans``, ``Traces``) as it is, else its id."""
    if pid in labels and labels[pid]:
        return labels[pid]
    return pid if isinstance(pid, str) and pid else f"pid {pid}"


def _thread(key: tuple[Any, Any], labels: dict[Any, str]) -> str:
    """A thread's made name: ``GPU 0 tid 7``, ``CPU tid 1234``, ``Spans PyTorch Profiler``; events without a
    process or a thread (a global instant), ``(no thread)``."""
    pid, tid = key
    if pid in (None, "") and tid in (None, ""):  # (Kineto's global instants: "Record Window End")
        return "(no thread)"
    origin = _origin(pid, labels)
    if isinstance(tid, str) and tid:
        return f"{origin} {tid}"
    return f"{origin} tid {tid}"
