"""Interval arithmetic on sorted, disjoint ``(start, end)`` lists: the core of every time breakdown."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from itertools import islice

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint intervals.

    Intervals that touch (one starts where another ends) are merged, like HTA's
    ``merge_kernel_intervals`` (a new group starts only when ``start > max(previous ends)``).
    """
    ordered = sorted(intervals)
    if not ordered:
        return []
    out: list[Interval] = []
    append = out.append
    cur_start, cur_end = ordered[0]
    for start, end in islice(ordered, 1, None):
        if start <= cur_end:
            if end > cur_end:
                cur_end = end
        else:
            append((cur_start, cur_end))
            cur_start, cur_end = start, end
    append((cur_start, cur_end))
    return out


def total(merged: list[Interval]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in merged)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists (linear merge)."""
    out: list[Interval] = []
    i = j = 0
    n, m = len(a), len(b)
    while i < n and j < m:
        a_start, a_end = a[i]
        b_start, b_end = b[j]
        start = b_start if b_start > a_start else a_start  # max(), keeping its choice on ties
        end = b_end if b_end < a_end else a_end  # min(), likewise
        if start < end:
            out.append((start, end))
        if a_end < b_end:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of ``a`` not covered by ``b`` (both sorted and disjoint)."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def clip(merged: list[Interval], start: float, end: float) -> list[Interval]:
    """The part of disjoint intervals that lies within ``[start, end]``."""
    # Sorted and disjoint, so the intervals that reach into the window are one run, found by bisection: a
    # step's clip costs its own intervals, not the whole trace's.
    lo = bisect_right(merged, start, key=_end)
    hi = bisect_left(merged, end, lo, key=_start)
    return [(max(s, start), min(e, end)) for s, e in merged[lo:hi] if e > start and s < end]


def _start(interval: Interval) -> float:
    return interval[0]


def _end(interval: Interval) -> float:
    return interval[1]
