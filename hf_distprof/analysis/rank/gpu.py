"""GPU analyzers (pure): HTA's temporal breakdown, comm/comp overlap, kernel-type overlap, kernel stats."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.kernels import (
    COMMUNICATION,
    COMPUTATION,
    MEMORY,
    kernel_category,
    nccl_kind,
    short_kernel_name,
)
from hf_distprof.analysis.results.rank import GpuBreakdown, KernelStat

# HTA's bit order for its kernel-type table (COMPUTATION=1, COMMUNICATION=2, MEMORY=4) and its labels.
_TYPE_BITS = ((COMPUTATION, "COMPUTATION"), (COMMUNICATION, "COMMUNICATION"), (MEMORY, "MEMORY"))


def _mask_label(mask: int) -> str:
    return " overlapping ".join(lbl for bit, (_, lbl) in enumerate(_TYPE_BITS) if mask & (1 << bit))


# The label of each combination of running categories, computed once rather than per time segment.
_MASK_LABELS = {mask: _mask_label(mask) for mask in range(1, 1 << len(_TYPE_BITS))}


def gpu_breakdown(
    starts: Sequence[float], ends: Sequence[float], names: Sequence[str], tiny_kernel_us: float
) -> GpuBreakdown | None:
    """Temporal breakdown and overlap of a set of GPU events, with HTA 0.5.0's definitions.

    Args:
        starts: Event start times (us).
        ends: Event end times (us).
        names: Event names (they give the kernel category).
        tiny_kernel_us: Kernels shorter than this are counted in ``n_tiny_kernels``.

    Returns:
        The breakdown, or None when there is no GPU event.
    """
    if not starts:
        return None
    by_cat: dict[str, list[iv.Interval]] = {}
    n_tiny = 0
    for start, end, name in zip(starts, ends, names):
        by_cat.setdefault(kernel_category(name), []).append((start, end))
        if end - start < tiny_kernel_us:
            n_tiny += 1
    merged_all = iv.merge(zip(starts, ends))
    kernel_time = merged_all[-1][1] - merged_all[0][0]
    idle = kernel_time - iv.total(merged_all)
    comp = iv.merge(by_cat.get(COMPUTATION, []))
    comm = iv.merge(by_cat.get(COMMUNICATION, []))
    memory = iv.merge(by_cat.get(MEMORY, []))
    comm_total = iv.total(comm)
    return breakdown_from_totals(
        kernel_time, idle, iv.total(comp), comm_total, iv.total(iv.intersect(comm, comp)), iv.total(memory),
        len(starts), n_tiny, category_overlap({COMPUTATION: comp, COMMUNICATION: comm, MEMORY: memory}),
    )


def breakdown_from_totals(
    kernel_time: float, idle: float, compute: float, comm_total: float, overlap: float, memory: float,
    n_kernels: int, n_tiny: int, category_overlap_us: dict[str, float],
) -> GpuBreakdown:
    """The breakdown's derived figures (shares, exposed communication) from its totals, for both code paths
    (this module's intervals and :mod:`hf_distprof.analysis.rank.fast`'s numpy sweep)."""
    exposed = comm_total - overlap
    non_compute = kernel_time - compute - idle

    def pct(value: float) -> float:
        return 100.0 * value / kernel_time if kernel_time > 0 else 0.0

    return GpuBreakdown(
        kernel_time_us=kernel_time,
        idle_us=idle,
        compute_us=compute,
        non_compute_us=non_compute,
        idle_pct=pct(idle),
        compute_pct=pct(compute),
        non_compute_pct=pct(non_compute),
        comm_us=comm_total,
        comm_comp_overlap_pct=100.0 * overlap / comm_total if comm_total > 0 else None,
        exposed_comm_us=exposed,
        exposed_comm_pct=pct(exposed),
        memory_us=memory,
        n_kernels=n_kernels,
        n_tiny_kernels=n_tiny,
        category_overlap_us=category_overlap_us,
    )


def category_overlap(merged_by_cat: dict[str, list[iv.Interval]]) -> dict[str, float]:
    """Exclusive time of each combination of running kernel categories (HTA's ``kernel_type`` rows).

    Args:
        merged_by_cat: Disjoint intervals per category (computation, communication, memory).

    Returns:
        Label ("COMPUTATION", "COMPUTATION overlapping COMMUNICATION" ...) -> microseconds, only non-zero.
    """
    edges: list[tuple[float, int]] = []
    for bit, (cat, _) in enumerate(_TYPE_BITS):
        for start, end in merged_by_cat.get(cat, []):
            edges.append((start, 1 << bit))
            edges.append((end, -(1 << bit)))
    edges.sort()
    out: dict[str, float] = {}
    if not edges:
        return out
    running = 0
    labels = _MASK_LABELS
    time, delta = edges[0]
    # Each edge with the next one's time (the last edge has none: nothing runs after it).
    for next_time, next_delta in islice(edges, 1, None):
        running += delta
        if running > 0 and next_time > time:
            label = labels.get(running) or _mask_label(running)
            out[label] = out.get(label, 0.0) + (next_time - time)
        time, delta = next_time, next_delta
    return out


def kernel_stats(
    starts: Sequence[float], ends: Sequence[float], names: Sequence[str], top: int
) -> tuple[dict[str, float], dict[str, int], list[KernelStat]]:
    """Per-category totals and the ``top`` kernels of each category by total time.

    Args:
        starts: Event start times (us).
        ends: Event end times (us).
        names: Event names.
        top: How many kernels to keep per category.

    Returns:
        (category -> summed duration, category -> count, kernel stats sorted by category then time).
    """
    stats: dict[str, KernelStat] = {}
    for start, end, name in zip(starts, ends, names):
        dur = end - start
        stat = stats.get(name)
        if stat is None:
            stats[name] = KernelStat(name, kernel_category(name), nccl_kind(name), 1, dur, dur, dur)
        else:
            stat.count += 1
            stat.total_us += dur
            stat.min_us = min(stat.min_us, dur)
            stat.max_us = max(stat.max_us, dur)
    cat_us: dict[str, float] = {}
    cat_n: dict[str, int] = {}
    for stat in stats.values():
        cat_us[stat.category] = cat_us.get(stat.category, 0.0) + stat.total_us
        cat_n[stat.category] = cat_n.get(stat.category, 0) + stat.count
    kept: list[KernelStat] = []
    for cat in sorted(cat_us):
        ranked = sorted((s for s in stats.values() if s.category == cat), key=lambda s: -s.total_us)
        kept.extend(ranked[:top])
    return cat_us, cat_n, kept


def display_name(stat: KernelStat) -> str:
    """Kernel name for tables: without arguments, with the collective kind for NCCL kernels."""
    short = short_kernel_name(stat.name)
    return f"{short} [{stat.kind}]" if stat.kind else short
