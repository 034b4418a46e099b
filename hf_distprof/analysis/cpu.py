"""CPU analyzer (pure): where the training loop's thread spends one step.

On a CPU (gloo) run a collective's own time sits in ``gloo:*`` spans on gloo worker threads, while the
main thread only enqueues it (``c10d::allreduce_``, a few microseconds) and later blocks in the DDP
reducer until it completes. That block is not an event in the trace: it shows up as a gap on the main
thread while a collective is in flight. So the step is split, in this order of precedence, into
data loading (``enumerate(DataLoader)`` annotations), communication (``c10d::*`` ops, plus gaps while a
collective runs), compute (inside any other op or annotation) and other (gaps with no collective).
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache

from hf_distprof.analysis import intervals as iv
from hf_distprof.analysis.events import STEP_PREFIX, Span
from hf_distprof.analysis.model import CpuBreakdown

DATA_LOADING_PREFIX = "enumerate(DataLoader)"
BACKWARD_PREFIXES = ("autograd::engine::evaluate_function",)


_STEP, _LOADING, _ENQUEUE, _BUSY, _BACKWARD = range(5)


@lru_cache(maxsize=65536)
def _op_kind(name: str) -> int:
    """What a main-thread op of this name counts as (names repeat, so this is cached)."""
    if name.startswith(STEP_PREFIX):
        return _STEP
    if name.startswith(DATA_LOADING_PREFIX):
        return _LOADING
    if name.startswith("c10d::"):
        return _ENQUEUE
    if name.startswith(BACKWARD_PREFIXES):
        return _BACKWARD
    return _BUSY


def cpu_breakdown(
    ops: list[Span], comm: list[iv.Interval], start: float, end: float, op_starts: list[float] | None = None
) -> CpuBreakdown:
    """Split one step of the main thread into compute / communication / data loading / other.

    Args:
        ops: The main thread's CPU ops and annotations (sorted by start); only those that start within
            the step count (an op belongs to the step that issued it).
        comm: Disjoint intervals during which this rank has a collective in flight.
        start: Step start (us).
        end: Step end (us).
        op_starts: ``[op[0] for op in ops]``, to find the step's ops by bisection (computed when None).

    Returns:
        The breakdown; its categories add up to the step duration.
    """
    loading: list[iv.Interval] = []
    enqueue: list[iv.Interval] = []
    busy: list[iv.Interval] = []
    backward: list[iv.Interval] = []
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
        else:
            busy.append(span)
            if kind == _BACKWARD:
                backward.append(span)
    step = [(start, end)]
    loading_m = iv.merge(loading)
    enqueue_m = iv.subtract(iv.merge(enqueue), loading_m)
    taken = iv.merge(loading_m + enqueue_m)
    compute_m = iv.subtract(iv.merge(busy), taken)
    taken = iv.merge(taken + compute_m)
    gaps = iv.subtract(step, taken)
    comm_in_step = iv.clip(comm, start, end)
    waiting = iv.intersect(gaps, comm_in_step)
    duration = end - start
    communication = iv.total(enqueue_m) + iv.total(waiting)
    compute = iv.total(compute_m)
    loading_us = iv.total(loading_m)
    comm_busy = iv.total(comm_in_step)
    overlap = iv.total(iv.intersect(comm_in_step, iv.merge(backward)))
    return CpuBreakdown(
        duration_us=duration,
        compute_us=compute,
        communication_us=communication,
        data_loading_us=loading_us,
        other_us=max(0.0, duration - compute - communication - loading_us),
        comm_busy_us=comm_busy,
        comm_backward_overlap_pct=100.0 * overlap / comm_busy if comm_busy > 0 else None,
    )
