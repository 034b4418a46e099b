"""Interval arithmetic on sorted, disjoint ``(start, end)`` lists: the core of every time breakdown."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint intervals.

    Intervals that touch (one starts where another ends) are merged, like HTA's
    ``merge_kernel_intervals`` (a new group starts only when ``start > max(previous ends)``).
    """
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def total(merged: list[Interval]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in merged)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists (linear merge)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
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
    return [(max(s, start), min(e, end)) for s, e in merged if e > start and s < end]
