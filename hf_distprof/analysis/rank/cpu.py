"""CPU analyzer (pure): where the training loop's thread spends one step.

On a CPU (gloo) run a collective's own time sits in ``gloo:*`` spans on gloo worker threads, while the
main thread only enqueues it (``c10d::allreduce_``, a few microseconds) and later blocks in the DDP
reducer until it completes. That block is not an event in the trace: it shows up as a gap on the main
thread while a collective is in flight. So the step is split, in this order of precedence, into
data loading (``enumerate(DataLoader)`` annotations), communication (``c10d::*`` ops, plus gaps while a
collective runs), compute (inside any other op or annotation) and other (gaps with no collective).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache
from typing import NamedTuple

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.read.events import STEP_PREFIX, SYNC_NAMES, ParsedTrace, Span
from hf_distprof.analysis.results.rank import CpuBreakdown

DATA_LOADING_PREFIX = "enumerate(DataLoader)"
BACKWARD_PREFIXES = ("autograd::engine::evaluate_function",)
# Ops in which the training thread blocks until a collective completes (FSDP2's waits on CPU backends).
# "FSDP::all_gather_copy_out" is a copy, not a wait; hence the exact name or the "(" of a module name.
WAIT_NAMES = ("FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::post_backward_rs_wait")
WAIT_PREFIXES = tuple(f"{n} (" for n in WAIT_NAMES) + ("_c10d_functional::wait_tensor",)


_STEP, _LOADING, _ENQUEUE, _BUSY, _BACKWARD, _WAIT, _SYNC = range(7)


PHASE_PREFIX = "hf_distprof/"
"""The step timer's phase ranges in a trace (``hf_distprof/data``, ``/forward``, ``/backward``, ``/optimizer``)."""
OURS_PREFIX = "hf_distprof/ours"
"""hf_distprof's own work: the range (``hf_distprof/ours <what>``, :func:`hf_distprof.dist.ours`, the same name) around
every collective hf_distprof issues itself. What runs inside one is ours, not the user's: neither compute nor
communication (``other``), and its collectives are not the user's (:mod:`hf_distprof.analysis.rank.analyze`)."""


@lru_cache(maxsize=65536)
def _op_kind(name: str) -> int:
    """What a main-thread op of this name counts as (names repeat, so this is cached)."""
    # ProfilerStep#N and the step timer's phase ranges (hf_distprof/forward ...) span work, they are not work:
    # what they enclose is counted by its own ops.
    if name.startswith(STEP_PREFIX) or name.startswith(PHASE_PREFIX):
        return _STEP
    if name in SYNC_NAMES:
        return _SYNC
    if name.startswith(DATA_LOADING_PREFIX):
        return _LOADING
    if name.startswith("c10d::"):
        return _ENQUEUE
    if name.startswith(BACKWARD_PREFIXES):
        return _BACKWARD
    if name in WAIT_NAMES or name.startswith(WAIT_PREFIXES):
        return _WAIT
    return _BUSY


class MainThreadSplit(NamedTuple):
    """One step of the main thread as disjoint interval lists (see :func:`split_main_thread`)."""

    loading: list[iv.Interval]
    compute: list[iv.Interval]
    communication: list[iv.Interval]
    """Enqueueing collectives, plus gaps and wait-op self time while one of this rank's collectives runs."""
    comm_in_step: list[iv.Interval]
    """The collectives' own spans, clipped to the step."""
    backward: list[iv.Interval]
    gpu_wait: list[iv.Interval] = []
    """GPU traces: inside a CUDA call that waits for the GPU (``cudaStreamSynchronize`` ... within ``.item()``, a
    device-to-host copy): the host waits, it does not compute. Taken out of the ops around it."""


def _nested_in(merged: list[iv.Interval], starts: list[float], span: iv.Interval) -> bool:
    """Whether ``span`` lies inside one of the disjoint intervals ``merged`` (``starts`` are theirs)."""
    i = bisect_right(starts, span[0]) - 1
    return i >= 0 and span[1] <= merged[i][1]


def main_thread_ranges(trace: ParsedTrace, prefix: str) -> list[Span]:
    """The training thread's ops and annotations whose name starts with ``prefix``, sorted.

    From a compact file the names are looked up once in its string table, not op by op.
    """
    if trace.main_op_columns is not None:
        import numpy as np  # in the worker only (see hf_distprof.analysis.rank.analyze.analyze_rank)

        starts, ends, ids, table = trace.main_op_columns
        wanted = [k for k, name in enumerate(table) if name.startswith(prefix)]
        if not wanted:
            return []
        found = np.flatnonzero(np.isin(np.asarray(ids), wanted)).tolist()
        return [(starts[i], ends[i], table[ids[i]]) for i in found]
    return [op for op in trace.main_ops if op[2].startswith(prefix)]


def without_ours(split: MainThreadSplit, ours: list[iv.Interval]) -> MainThreadSplit:
    """``split`` less the time the training thread spent in hf_distprof's own ranges (``ours``, sorted, disjoint):
    enqueueing or waiting for a collective of ours, or packing its data, is neither the user's communication nor
    compute, so it counts as other. Collectives of ours in flight are already left out of ``comm``."""
    if not ours:
        return split
    return split._replace(compute=iv.subtract(split.compute, ours),
                          communication=iv.subtract(split.communication, ours),
                          gpu_wait=iv.subtract(split.gpu_wait, ours))


def split_main_thread(
    ops: list[Span],
    comm: list[iv.Interval],
    start: float,
    end: float,
    op_starts: list[float] | None = None,
    waits_block: bool = True,
) -> MainThreadSplit:
    """Split one step of the main thread into data loading, compute and communication intervals.

    Args:
        ops: The main thread's CPU ops and annotations (sorted by start); only those that start within
            the step count (an op belongs to the step that issued it).
        comm: Disjoint intervals during which this rank has a collective in flight.
        start: Step start (us).
        end: Step end (us).
        op_starts: ``[op[0] for op in ops]``, to find the step's ops by bisection (computed when None).
        waits_block: Whether the thread blocks inside FSDP's wait ops (CPU backends). On GPU they only
            enqueue a stream wait, and count as compute like any other op.

    Returns:
        Disjoint interval lists; what none of them covers is "other".
    """
    loading: list[iv.Interval] = []
    enqueue: list[iv.Interval] = []
    busy: list[iv.Interval] = []
    backward: list[iv.Interval] = []
    waits: list[iv.Interval] = []
    syncs: list[iv.Interval] = []
    if op_starts is None:
        op_starts = [op[0] for op in ops]
    lo, hi = bisect_left(op_starts, start), bisect_left(op_starts, end)
    for s, e, name in ops[lo:hi]:
        kind = _op_kind(name)
        if kind == _STEP:
            continue
        # (max(s, start), min(e, end)), spelled out: this loop runs once per CPU op of the trace.
        span = (start if start > s else s, end if end < e else e)
        if kind == _LOADING:
            loading.append(span)
        elif kind == _ENQUEUE:
            enqueue.append(span)
        elif kind == _WAIT and waits_block:
            waits.append(span)
        elif kind == _SYNC:
            syncs.append(span)
        else:
            busy.append(span)
            if kind == _BACKWARD:
                backward.append(span)
    return combine_split(loading, enqueue, waits, busy, iv.merge(busy), iv.merge(backward), comm, start, end, syncs)


def combine_split(
    loading: list[iv.Interval],
    enqueue: list[iv.Interval],
    waits: list[iv.Interval],
    busy: list[iv.Interval],
    busy_m: list[iv.Interval],
    backward_m: list[iv.Interval],
    comm: list[iv.Interval],
    start: float,
    end: float,
    syncs: list[iv.Interval] | None = None,
) -> MainThreadSplit:
    """The step's split from its ops' spans (clipped to the step), sorted by what they count as.

    Args:
        loading: Data-loading ops.
        enqueue: ``c10d::*`` ops.
        waits: Ops that block until a collective completes (only where they do).
        busy: Every other op (read only when ``waits`` holds some).
        busy_m: ``iv.merge(busy)``.
        backward_m: ``iv.merge`` of the backward ops among ``busy``.
        comm: As for :func:`split_main_thread`.
        start: Step start (us).
        end: Step end (us).
        syncs: CUDA calls that wait for the GPU (inside the ops that make them).
    """
    loading_m = iv.merge(loading)
    enqueue_m = iv.subtract(iv.merge(enqueue), loading_m)
    taken = iv.merge(loading_m + enqueue_m)
    comm_in_step = iv.clip(comm, start, end)
    waiting: list[iv.Interval] = []
    if waits:
        # Self time of the wait ops: ops nested in a wait (FSDP's copy-in, the c10d enqueue) are work, ops
        # enclosing one (FSDP::pre_forward, the ProfilerStep) are not, so only nested ones are taken out.
        waits_m = iv.merge(waits)
        wait_starts = [w[0] for w in waits_m]
        nested = iv.merge(b for b in busy if _nested_in(waits_m, wait_starts, b))
        wait_self = iv.subtract(iv.subtract(waits_m, nested), taken)
        # Waiting with a collective in flight is communication; the rest of the self time is neither
        # communication nor compute ("other", like a gap with nothing in flight).
        waiting = iv.intersect(wait_self, comm_in_step)
        taken = iv.merge(taken + wait_self)
    gpu_wait: list[iv.Interval] = []
    if syncs:
        gpu_wait = iv.subtract(iv.merge(syncs), taken)
        taken = iv.merge(taken + gpu_wait)
    compute_m = iv.subtract(busy_m, taken)
    gaps = iv.subtract([(start, end)], iv.merge(taken + compute_m))
    waiting = iv.merge(waiting + iv.intersect(gaps, comm_in_step))
    return MainThreadSplit(
        loading=loading_m,
        compute=compute_m,
        communication=iv.merge(enqueue_m + waiting),
        comm_in_step=comm_in_step,
        backward=backward_m,
        gpu_wait=gpu_wait,
    )


def breakdown_of(split: MainThreadSplit, duration: float) -> CpuBreakdown:
    """The totals of a :class:`MainThreadSplit` of a step lasting ``duration`` us."""
    communication = iv.total(split.communication)
    compute = iv.total(split.compute)
    loading_us = iv.total(split.loading)
    gpu_wait = iv.total(split.gpu_wait)
    comm_busy = iv.total(split.comm_in_step)
    overlap = iv.total(iv.intersect(split.comm_in_step, split.backward))
    return CpuBreakdown(
        duration_us=duration,
        compute_us=compute,
        communication_us=communication,
        data_loading_us=loading_us,
        other_us=max(0.0, duration - compute - communication - loading_us - gpu_wait),
        comm_busy_us=comm_busy,
        comm_backward_overlap_pct=100.0 * overlap / comm_busy if comm_busy > 0 else None,
        gpu_wait_us=gpu_wait,
    )
