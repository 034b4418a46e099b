"""Vectorised (numpy) forms of the per-step analyzers, exactly equal to the pure-Python ones they stand in for.

The reference implementations (:mod:`~hf_distprof.analysis.rank.intervals`, :func:`~hf_distprof.analysis.rank.gpu.
gpu_breakdown`, :func:`~hf_distprof.analysis.rank.gpu.kernel_stats`, :func:`~hf_distprof.analysis.rank.cpu.
split_main_thread`) loop over every event in Python; these sort and scan whole columns at once. They are used
only where they give the very same result, value and type: on columns whose numbers are all Python ints
(Kineto's microsecond timestamps, and GPU times once rounded like HTA's), where every sum is exact in int64
and in any order. A column with a float, or numbers out of int64's range, goes through the reference code.

Interval lists handed back to the rest of the analysis are plain lists of ``(int, int)`` tuples, as the
reference code gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_distprof.analysis.rank import cpu, exposure
from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.kernels import COMMUNICATION, COMPUTATION, MEMORY, kernel_category, nccl_kind
from hf_distprof.analysis.read.events import GpuEvent, ParsedTrace, Step
from hf_distprof.analysis.results.rank import Collective, GpuBreakdown, KernelStat

# A kernel category as the bit of HTA's kernel-type table (see gpu._TYPE_BITS); other kernels are 0.
COMP_BIT, COMM_BIT, MEM_BIT = 1, 2, 4
_CATEGORY_BITS = {COMPUTATION: COMP_BIT, COMMUNICATION: COMM_BIT, MEMORY: MEM_BIT}
# Up to this, float64 holds every int exactly: the kernel-type table's sums (floats in the reference) are exact
# when the whole trace spans less (the segments of one sweep are disjoint, so no sum exceeds the span).
_EXACT = 2**53

Arrays = tuple[np.ndarray, np.ndarray]
_INT = {int}


def int_column(values: Sequence[Any]) -> np.ndarray | None:
    """``values`` as an int64 array when they are all ints (no float, none beyond int64), else None.

    (Also None with a bool among them, which the reference code then takes; the parser rejects bools as times.)
    """
    if not values:
        return None
    # Every value an int (not a bool, float, None ...): then the conversion with the dtype given is twice as fast as
    # numpy's own discovery of it, and accepts the very columns that discovery makes int64.
    if set(map(type, values)) != _INT:
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:  # beyond int64
        return None


@dataclass
class GpuColumns:
    """A trace's GPU events as int64 columns, with each event's category bit."""

    starts: np.ndarray
    ends: np.ndarray
    bits: np.ndarray

    @classmethod
    def of(cls, gpu: GpuEvent) -> GpuColumns | None:
        """The columns of ``gpu``, or None when the reference code must run (a float time, a huge span)."""
        starts, ends = int_column(gpu.start), int_column(gpu.end)
        if starts is None or ends is None:
            return None
        low, high = min(int(starts.min()), int(ends.min())), max(int(starts.max()), int(ends.max()))
        if high - low >= _EXACT:
            return None
        return cls(starts, ends, category_bits(gpu.name))

    def per_step(self, step_starts: Sequence[Any], issued: np.ndarray) -> list[np.ndarray] | None:
        """:func:`~hf_distprof.analysis.rank.device.assign_gpu_events_to_steps` with each event's launch time (or its
        own start) given: the indices of each step's events, in file order; None when not all are ints."""
        starts = int_column(step_starts)
        if starts is None:
            return None
        step = np.maximum(np.searchsorted(starts, issued, side="right") - 1, 0)
        order = np.argsort(step, kind="stable")
        bounds = np.cumsum(np.bincount(step, minlength=len(starts)))[:-1]
        return np.split(order, bounds)

    def hta_selection(self, trace: ParsedTrace, issued: np.ndarray) -> np.ndarray:
        """:func:`~hf_distprof.analysis.rank.device.hta_selection`, with each event's launch time (or its own
        start)."""
        selected = np.arange(len(self.starts))
        if len(trace.steps) <= 1:
            return selected
        launched = np.fromiter(map(trace.launches.__contains__, trace.gpu.correlation), dtype=bool, count=len(selected))
        return selected[launched & (issued < trace.steps[-1].start)]

    def breakdown(self, indices: np.ndarray, tiny_kernel_us: float) -> GpuBreakdown | None:
        """:func:`gpu_breakdown` of the events at ``indices``."""
        return gpu_breakdown(self.starts[indices], self.ends[indices], self.bits[indices], tiny_kernel_us)

    def merged(self, bit: int) -> Arrays:
        """The union of the events of one category."""
        return merge(self.starts[self.bits == bit], self.ends[self.bits == bit])


def set_exposure(collectives: Sequence[Collective], hiding: Arrays) -> None:
    """:func:`~hf_distprof.analysis.rank.exposure.set_exposure` with ``hidden_when_covered`` (GPU), ``hiding`` as the
    columns of disjoint sorted intervals."""
    spans = [t for c in collectives for t in (c.start_us, c.end_us)]
    times = int_column(spans)
    if times is None or not len(hiding[0]):
        exposure.set_exposure(list(collectives), as_list(hiding), hidden_when_covered=True)
        return
    starts, ends = hiding
    # Covered time before t: whole intervals that start at or before it, less what the last one lacks.
    before = np.concatenate(([0], np.cumsum(ends - starts)))
    k = np.searchsorted(starts, times, side="right")
    last = np.maximum(k - 1, 0)
    upto = before[k] - np.where(k > 0, np.maximum(ends[last] - times, 0), 0)
    covered = (upto[1::2] - upto[0::2]).tolist()
    for c, cov in zip(collectives, covered):
        # The reference sums from 0.0, exactly (ints), so the covered time is a float.
        c.exposed_us = c.duration_us - float(cov)


def category_bits(names: Sequence[str]) -> np.ndarray:
    """The category bit of each kernel name (computed once per distinct name)."""
    bits = {name: _CATEGORY_BITS.get(kernel_category(name), 0) for name in set(names)}
    return np.fromiter(map(bits.__getitem__, names), dtype=np.int8, count=len(names))


def merge(starts: np.ndarray, ends: np.ndarray) -> Arrays:
    """:func:`~hf_distprof.analysis.rank.intervals.merge` on columns: (starts, ends) of the disjoint union."""
    if len(starts) <= 1:
        return starts, ends
    if (starts[1:] < starts[:-1]).any():
        # By start alone: among equal starts the order changes neither the groups nor their bounds.
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A new interval starts where a start lies beyond every end before it (touching intervals merge).
    breaks = starts[1:] > running_end[:-1]
    first = np.concatenate(([True], breaks))
    last = np.concatenate((breaks, [True]))
    return starts[first], running_end[last]


def as_list(merged: Arrays) -> list[iv.Interval]:
    """Columns as the reference code's list of tuples (Python ints)."""
    return list(zip(merged[0].tolist(), merged[1].tolist()))


def _total(merged: Arrays) -> int:
    return int((merged[1] - merged[0]).sum())


def gpu_breakdown(starts: np.ndarray, ends: np.ndarray, bits: np.ndarray, tiny_kernel_us: float) -> GpuBreakdown | None:
    """:func:`~hf_distprof.analysis.rank.gpu.gpu_breakdown` on int64 columns (``bits``: :func:`category_bits`)."""
    if not len(starts):
        return None
    merged_all = merge(starts, ends)
    kernel_time = int(merged_all[1][-1] - merged_all[0][0])
    idle = kernel_time - _total(merged_all)
    by_bit = {}
    for bit in (COMP_BIT, COMM_BIT, MEM_BIT):
        mask = bits == bit
        by_bit[bit] = merge(starts[mask], ends[mask])
    from hf_distprof.analysis.rank.gpu import breakdown_from_totals

    category_overlap, overlap = _kernel_types(by_bit)
    return breakdown_from_totals(
        kernel_time, idle, _total(by_bit[COMP_BIT]), _total(by_bit[COMM_BIT]), overlap, _total(by_bit[MEM_BIT]),
        len(starts), int(np.count_nonzero((ends - starts) < tiny_kernel_us)), category_overlap,
    )


def _kernel_types(by_bit: dict[int, Arrays]) -> tuple[dict[str, float], int]:
    """:func:`~hf_distprof.analysis.rank.gpu.category_overlap` (same labels, in the same order) and the time that
    computation and communication overlap (``total(intersect(comm, comp))``), from one sweep."""
    from hf_distprof.analysis.rank.gpu import _MASK_LABELS

    times = np.concatenate([m[k] for m in by_bit.values() for k in (0, 1)])
    if not len(times):
        return {}, 0
    deltas = np.concatenate(
        [np.full(len(m[0]), sign * bit, dtype=np.int64) for bit, m in by_bit.items() for sign in (1, -1)]
    )
    order = np.lexsort((deltas, times))  # the reference sorts (time, delta) pairs
    times = times[order]
    running = np.cumsum(deltas[order])[:-1]
    lengths = times[1:] - times[:-1]
    counted = (running > 0) & (lengths > 0)
    masks = running[counted]
    lengths = lengths[counted]
    if not len(masks):
        return {}, 0
    both = (masks & (COMP_BIT | COMM_BIT)) == (COMP_BIT | COMM_BIT)
    overlap = int(lengths[both].sum())
    sums = np.bincount(masks, weights=lengths, minlength=8).tolist()
    # Labels in the order the reference's sweep first meets them; its float sums of ints are exact here.
    present = sorted((int(np.argmax(masks == m)), m) for m in np.flatnonzero(sums).tolist())
    return {_MASK_LABELS[m]: float(sums[m]) for _, m in present}, overlap


def kernel_stats(
    starts: np.ndarray, ends: np.ndarray, names: Sequence[str], top: int
) -> tuple[dict[str, float], dict[str, int], list[KernelStat]]:
    """:func:`~hf_distprof.analysis.rank.gpu.kernel_stats` on int64 columns."""
    distinct = list(set(names))
    code_of = {name: k for k, name in enumerate(distinct)}
    codes = np.fromiter(map(code_of.__getitem__, names), dtype=np.int64, count=len(names))
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    durations = (ends - starts)[order]
    bounds = np.flatnonzero(np.concatenate(([True], sorted_codes[1:] != sorted_codes[:-1])))
    groups = zip(
        sorted_codes[bounds].tolist(),
        np.diff(np.append(bounds, len(codes))).tolist(),
        np.add.reduceat(durations, bounds).tolist(),
        np.minimum.reduceat(durations, bounds).tolist(),
        np.maximum.reduceat(durations, bounds).tolist(),
    )
    # In order of each name's first event (``order[bounds]``, the sort being stable), as the reference's dict.
    stats = [
        KernelStat(distinct[code], kernel_category(distinct[code]), nccl_kind(distinct[code]), n, total, low, high)
        for _, (code, n, total, low, high) in sorted(zip(order[bounds].tolist(), groups))
    ]
    cat_us: dict[str, float] = {}
    cat_n: dict[str, int] = {}
    for stat in stats:
        cat_us[stat.category] = cat_us.get(stat.category, 0.0) + stat.total_us
        cat_n[stat.category] = cat_n.get(stat.category, 0) + stat.count
    kept: list[KernelStat] = []
    for cat in sorted(cat_us):
        ranked = sorted((s for s in stats if s.category == cat), key=lambda s: -s.total_us)
        kept.extend(ranked[:top])
    return cat_us, cat_n, kept


@dataclass
class MainOpColumns:
    """The training thread's ops as int64 columns, with what each counts as (``cpu._op_kind``)."""

    starts: np.ndarray
    ends: np.ndarray
    kinds: np.ndarray

    @classmethod
    def of(cls, trace: ParsedTrace) -> MainOpColumns | None:
        """The columns of the trace's main-thread ops (not empty), or None when the reference code must run (a
        float time among the ops' or the steps' times)."""
        if trace.main_op_columns is not None:  # read from a compact file: columns already
            op_starts, op_ends, ids, table = trace.main_op_columns
            kind_of = np.array([cpu._op_kind(name) for name in table], dtype=np.int8)
            kinds = kind_of[np.array(ids, dtype=np.intp)]
        else:
            op_starts, op_ends, names = zip(*trace.main_ops)
            kinds_by_name = {name: cpu._op_kind(name) for name in set(names)}
            kinds = np.fromiter(map(kinds_by_name.__getitem__, names), dtype=np.int8, count=len(names))
        starts, ends = int_column(op_starts), int_column(op_ends)
        if starts is None or ends is None or int_column([t for s in trace.steps for t in (s.start, s.end)]) is None:
            return None
        return cls(starts, ends, kinds)

    def step_bounds(self, steps: Sequence[Step]) -> list[int]:
        """For each step, the index of its first op and of the first op after it (the ops that start within
        it, as :func:`~hf_distprof.analysis.rank.cpu.split_main_thread` finds them): ``[lo0, hi0, lo1, hi1 ...]``."""
        return np.searchsorted(self.starts, [t for s in steps for t in (s.start, s.end)]).tolist()

    def split(
        self, lo: int, hi: int, comm: list[iv.Interval], start: int, end: int, waits_block: bool
    ) -> cpu.MainThreadSplit:
        """:func:`~hf_distprof.analysis.rank.cpu.split_main_thread` of the step whose ops are ``ops[lo:hi]``."""
        kinds = self.kinds[lo:hi]
        starts = np.maximum(self.starts[lo:hi], start)
        ends = np.minimum(self.ends[lo:hi], end)

        def spans(mask: np.ndarray) -> Arrays:
            return starts[mask], ends[mask]

        busy = (kinds != cpu._STEP) & (kinds != cpu._LOADING) & (kinds != cpu._ENQUEUE) & (kinds != cpu._SYNC)
        waits: list[iv.Interval] = []
        if waits_block:
            waiting = kinds == cpu._WAIT
            busy &= ~waiting
            waits = as_list(spans(waiting))
        return cpu.combine_split(
            as_list(spans(kinds == cpu._LOADING)),
            as_list(spans(kinds == cpu._ENQUEUE)),
            waits,
            as_list(spans(busy)) if waits else [],
            as_list(merge(*spans(busy))),
            as_list(merge(*spans(kinds == cpu._BACKWARD))),
            comm,
            start,
            end,
            as_list(spans(kinds == cpu._SYNC)),
        )


def own_kernels_fast(
    columns: GpuColumns, step_events: list[np.ndarray], issued: np.ndarray, own: list[iv.Interval]
) -> tuple[list[np.ndarray], list[list[int]]]:
    """:func:`~hf_distprof.analysis.rank.ours.own_kernels` on the int64 columns: ``step_events`` as index arrays,
    ``issued`` each event's launch (else its start)."""
    starts = np.array([s for s, _ in own])
    ends = np.array([e for _, e in own])
    k = np.searchsorted(starts, issued, side="right") - 1
    mine = (k >= 0) & (issued <= ends[np.maximum(k, 0)]) & (columns.bits == COMM_BIT)
    if not mine.any():
        return step_events, [[] for _ in step_events]
    return [ix[~mine[ix]] for ix in step_events], [ix[mine[ix]].tolist() for ix in step_events]


class ColumnPath:
    """The GPU events as int64 columns (:class:`~hf_distprof.analysis.rank.device.GpuPath`): what
    :class:`~hf_distprof.analysis.rank.device.ReferencePath` gives, from whole-column operations."""

    def __init__(self, trace: ParsedTrace, columns: GpuColumns, issued: np.ndarray, step_events: list[np.ndarray],
                 own: list[iv.Interval]) -> None:
        self.trace, self.columns, self.issued = trace, columns, issued
        self.step_events = step_events
        self.own_steps: list[list[int]] = [[] for _ in trace.steps]
        if own:
            self.step_events, self.own_steps = own_kernels_fast(columns, step_events, issued, own)

    @classmethod
    def of(cls, trace: ParsedTrace, own: list[iv.Interval]) -> ColumnPath | None:
        """The trace's events as columns, or None when the reference path must run (a float time, a huge span)."""
        gpu = trace.gpu
        columns = GpuColumns.of(gpu)
        if columns is None:
            return None
        issued = int_column(list(map(trace.launches.get, gpu.correlation, gpu.start)))
        step_events = columns.per_step([s.start for s in trace.steps], issued) if issued is not None else None
        if issued is None or step_events is None:
            return None
        return cls(trace, columns, issued, step_events, own)

    def comm_kernels(self) -> list[list[int]]:
        return [ix[self.columns.bits[ix] == COMM_BIT].tolist() for ix in self.step_events]

    def breakdowns(self, tiny_kernel_us: float) -> list[GpuBreakdown | None]:
        return [self.columns.breakdown(ix, tiny_kernel_us) for ix in self.step_events]

    def set_exposure(self, collectives: list[Collective]) -> None:
        set_exposure(collectives, self.columns.merged(COMP_BIT))

    def exposed_per_step(self) -> list[tuple[int, list[iv.Interval]]]:
        out = []
        for step, ix in zip(self.trace.steps, self.step_events):
            bits, starts, ends = self.columns.bits[ix], self.columns.starts[ix], self.columns.ends[ix]
            comm_m = as_list(merge(starts[bits == COMM_BIT], ends[bits == COMM_BIT]))
            comp_m = as_list(merge(starts[bits == COMP_BIT], ends[bits == COMP_BIT]))
            out.append((step.number, iv.subtract(comm_m, comp_m)))
        return out

    def totals(self, options: Any) -> tuple[GpuBreakdown | None, dict[str, float], dict[str, int], list[KernelStat]]:
        columns = self.columns
        total = columns.breakdown(columns.hta_selection(self.trace, self.issued), options.tiny_kernel_us)
        return (total, *kernel_stats(columns.starts, columns.ends, self.trace.gpu.name, options.top_kernels))

    def busy(self) -> list[iv.Interval]:
        ours = [i for indices in self.own_steps for i in indices]
        if not ours:
            return as_list(merge(self.columns.starts, self.columns.ends))
        keep = np.ones(len(self.columns.starts), dtype=bool)
        keep[ours] = False
        return as_list(merge(self.columns.starts[keep], self.columns.ends[keep]))
