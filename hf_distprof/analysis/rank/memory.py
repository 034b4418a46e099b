"""Memory analyzer (pure): ``[memory]`` events -> per device and step peaks, the top allocating operators,
a memory-over-time series, and the cross-rank peak imbalance finding.

A trace recorded with ``profile_memory`` holds one ``[memory]`` instant event per allocation (``Bytes`` > 0)
and free (< 0) on any device, with the device's allocated total after it (``Total Allocated``). Each
allocation is attributed to the innermost ``cpu_op`` around it on its own thread: the op that asked for the
memory (``aten::empty`` under ``aten::zeros``, ``aten::mm`` for its output). One sweep per thread does it,
so the whole analysis is linear in the events after sorting them.
"""

from __future__ import annotations

import math
from typing import Any

from hf_distprof.analysis.read.events import MemoryEvents, Span, Step
from hf_distprof.analysis.results.rank import DeviceMemory, MemoryOpStat, MemoryStepStat

# Operators kept per device, the most allocating first.
TOP_OPS = 10
# The memory-over-time series keeps each of at most this many runs of consecutive events' lowest and highest.
SERIES_BUCKETS = 1000
# What an allocation outside every cpu_op is attributed to.
NO_OPERATOR = "(no operator)"


def innermost_ops(memory: MemoryEvents) -> list[str]:
    """The innermost ``cpu_op`` around each event on its thread (:data:`NO_OPERATOR` when none is).

    One sweep per thread over its ops (sorted by start, then end) and its events, in time order, keeps a
    stack of the ops open so far, ordered by end (latest at the bottom): after the ops that ended are popped,
    the top is the innermost open op. An op that starts with the top but ends later encloses it, so it goes
    beneath it. An op counts as open from its start to its end, both included.
    """
    names = [NO_OPERATOR] * len(memory)
    by_tid: dict[Any, list[int]] = {}
    for i, tid in enumerate(memory.tid):
        by_tid.setdefault(tid, []).append(i)  # in time order, as the columns are
    ts = memory.ts
    for tid, indices in by_tid.items():
        ops = memory.ops.get(tid, [])
        n_ops = len(ops)
        stack: list[Span] = []
        k = 0
        for i in indices:
            t = ts[i]
            while k < n_ops and ops[k][0] <= t:
                op = ops[k]
                k += 1
                end = op[1]
                while stack and stack[-1][1] < op[0]:
                    stack.pop()
                j = len(stack)
                while j and stack[j - 1][1] < end:
                    j -= 1
                stack.insert(j, op)
            while stack and stack[-1][1] < t:
                stack.pop()
            if stack:
                names[i] = stack[-1][2]
    return names


def decimate(times: list[float], values: list[int], buckets: int = SERIES_BUCKETS) -> tuple[list[float], list[int]]:
    """At most ``2 * buckets`` points of a series: the lowest and highest of each run of consecutive points.

    Args:
        times: The points' times, ascending.
        values: Their values.
        buckets: How many runs to cut the series into.

    Returns:
        The kept times and values, in time order; the series itself when it is short enough. Its maximum
        (the peak) and minimum are always kept.
    """
    n = len(values)
    if n <= 2 * buckets:
        return times, values
    size = math.ceil(n / buckets)
    out_t: list[float] = []
    out_v: list[int] = []
    for lo in range(0, n, size):
        run = range(lo, min(lo + size, n))
        low = min(run, key=values.__getitem__)
        high = max(run, key=values.__getitem__)
        for i in sorted({low, high}):
            out_t.append(times[i])
            out_v.append(values[i])
    return out_t, out_v


def analyze_memory(memory: MemoryEvents | None, steps: list[Step], top: int = TOP_OPS) -> list[DeviceMemory]:
    """One rank's memory per device over its traced steps.

    An event belongs to the step that started last at or before it; events before the first step only give
    the level the device enters it with, events after the last step are left out.

    Args:
        memory: The rank's ``[memory]`` events; None when the trace has none.
        steps: The rank's profiler steps, in time order.
        top: How many operators to keep per device.

    Returns:
        One entry per device with an event inside the steps, CPU first, then by device index; empty
        without events.
    """
    if memory is None or not steps:
        return []
    ops = innermost_ops(memory)
    by_device: dict[str, list[int]] = {}
    for i, device in enumerate(memory.device):
        by_device.setdefault(device, []).append(i)
    found = (_device_memory(memory, device, indices, steps, ops, top) for device, indices in by_device.items())
    return sorted((d for d in found if d is not None), key=lambda d: _device_order(d.device))


def _device_order(device: str) -> tuple[bool, str, int]:
    kind, _, index = device.partition(":")
    return kind != "cpu", kind, int(index) if index.isdigit() else -1


def _device_memory(
    memory: MemoryEvents, device: str, indices: list[int], steps: list[Step], ops: list[str], top: int
) -> DeviceMemory | None:
    """The memory of one device; None when none of its events falls inside the steps."""
    ts, amounts, totals = memory.ts, memory.bytes, memory.total_allocated
    first, last = steps[0].start, steps[-1].end
    rows: dict[int, list[int]] = {}  # step index -> [peak, allocated, freed, allocations, frees]
    by_op: dict[str, list[int]] = {}  # op -> [bytes allocated, allocations]
    times: list[float] = []
    values: list[int] = []
    level: int | None = None  # the device's allocated total after the last event seen
    k = -1  # the current step

    def enter_steps_until(t: float) -> None:
        nonlocal k
        while k + 1 < len(steps) and steps[k + 1].start <= t:
            k += 1
            if level is not None:  # the step holds at least what the device held when it began
                rows[k] = [level, 0, 0, 0, 0]

    for i in indices:
        t = ts[i]
        if t > last:
            break
        if t < first:
            level = totals[i]
            continue
        if not times and level is not None:
            times.append(0.0)
            values.append(level)
        enter_steps_until(t)
        total, amount = totals[i], amounts[i]
        row = rows.get(k)
        if row is None:  # the device's first event: its level before was not known
            row = rows[k] = [total, 0, 0, 0, 0]
        if amount > 0:
            row[1] += amount
            row[3] += 1
            stat = by_op.get(ops[i])
            if stat is None:
                by_op[ops[i]] = [amount, 1]
            else:
                stat[0] += amount
                stat[1] += 1
        elif amount < 0:
            row[2] -= amount
            row[4] += 1
        if total > row[0]:
            row[0] = total
        level = total
        times.append((t - first) / 1e3)
        values.append(total)
    if not rows:
        return None
    enter_steps_until(last)  # the steps after the device's last event hold its last level
    stats = [MemoryStepStat(steps[j].number, *rows[j]) for j in sorted(rows)]
    peak = max(stats, key=lambda s: s.peak_allocated_bytes)  # the first step that reaches it
    series_ms, series_bytes = decimate(times, values)
    return DeviceMemory(
        device=device,
        peak_allocated_bytes=peak.peak_allocated_bytes,
        peak_step=peak.step,
        window_start_us=first,
        steps=stats,
        top_ops=_top([MemoryOpStat(name, b, n) for name, (b, n) in by_op.items()], top),
        series_ms=series_ms,
        series_bytes=series_bytes,
    )


def _top(ops: list[MemoryOpStat], top: int) -> list[MemoryOpStat]:
    return sorted(ops, key=lambda op: (-op.allocated_bytes, op.name))[:top]


def combine(a: list[DeviceMemory], b: list[DeviceMemory], top: int = TOP_OPS) -> list[DeviceMemory]:
    """One rank's memory over two profiling windows.

    Steps and series are joined (the later window's series shifted to the earlier window's origin, then
    decimated again); the operators are summed by name and ranked again, so an operator outside one
    window's top ``top`` counts for the other window only.

    Args:
        a: The memory of one window, per device.
        b: The memory of the other window.
        top: How many operators to keep per device.

    Returns:
        The memory per device over both windows.
    """
    by_device = {d.device: d for d in a}
    for d in b:
        prev = by_device.get(d.device)
        by_device[d.device] = d if prev is None else _combine_device(prev, d, top)
    return sorted(by_device.values(), key=lambda d: _device_order(d.device))


def _combine_device(a: DeviceMemory, b: DeviceMemory, top: int) -> DeviceMemory:
    early, late = sorted((a, b), key=lambda d: d.window_start_us)
    shift_ms = (late.window_start_us - early.window_start_us) / 1e3
    by_op: dict[str, list[int]] = {}
    for op in early.top_ops + late.top_ops:
        stat = by_op.setdefault(op.name, [0, 0])
        stat[0] += op.allocated_bytes
        stat[1] += op.count
    steps = early.steps + late.steps
    peak = max(steps, key=lambda s: s.peak_allocated_bytes)
    series_ms, series_bytes = decimate(
        early.series_ms + [t + shift_ms for t in late.series_ms], early.series_bytes + late.series_bytes
    )
    return DeviceMemory(
        device=early.device,
        peak_allocated_bytes=peak.peak_allocated_bytes,
        peak_step=peak.step,
        window_start_us=early.window_start_us,
        steps=steps,
        top_ops=_top([MemoryOpStat(name, b, n) for name, (b, n) in by_op.items()], top),
        series_ms=series_ms,
        series_bytes=series_bytes,
    )
