"""One result per rank (pure): the profiling windows of the same rank combined, files that repeat a rank's steps
rejected. The first thing done across the workers' results, before the ranks are aligned."""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.rank import memory, timeline
from hf_distprof.analysis.results.rank import FileError, KernelStat, RankResult


def one_result_per_rank(results: list[RankResult], errors: list[FileError]) -> list[RankResult]:
    """Combine several profiling windows of the same rank; reject files that repeat a rank's steps."""
    by_rank: dict[int, RankResult] = {}
    for res in sorted(results, key=lambda r: (r.rank, r.steps[0].start_us, r.path)):
        prev = by_rank.get(res.rank)
        if prev is None:
            by_rank[res.rank] = res
            continue
        clash = {s.step for s in prev.steps} & {s.step for s in res.steps}
        if clash:
            errors.append(
                FileError(
                    res.path,
                    f"rank {res.rank} with step(s) {sorted(clash)} was already read from {prev.path}; "
                    "pass the traces of one run only",
                )
            )
            continue
        by_rank[res.rank] = _combine(prev, res)
    return [by_rank[k] for k in sorted(by_rank)]


def _combine(a: RankResult, b: RankResult) -> RankResult:
    """One rank's two profiling windows as one result (HTA's aggregate is per window, so it is dropped)."""
    kernels: dict[str, KernelStat] = {}
    for k in a.top_kernels + b.top_kernels:
        prev = kernels.get(k.name)
        if prev is None:
            kernels[k.name] = KernelStat(k.name, k.category, k.kind, k.count, k.total_us, k.min_us, k.max_us)
        else:
            prev.count += k.count
            prev.total_us += k.total_us
            prev.min_us = min(prev.min_us, k.min_us)
            prev.max_us = max(prev.max_us, k.max_us)
    steps = sorted(a.steps + b.steps, key=lambda s: s.start_us)
    gpu = "gpu" in (a.device, b.device)
    return RankResult(
        rank=a.rank,
        path=f"{a.path}, {b.path}",
        device="gpu" if gpu else "cpu",
        backend=a.backend or b.backend,
        world_size=a.world_size or b.world_size,
        host=a.host or b.host,
        n_events=a.n_events + b.n_events,
        steps=steps,
        gpu_total=None,
        kernel_categories_us=_add(a.kernel_categories_us, b.kernel_categories_us),
        kernel_categories_count=_add(a.kernel_categories_count, b.kernel_categories_count),
        top_kernels=sorted(kernels.values(), key=lambda k: (k.category, -k.total_us)),
        collectives=a.collectives + b.collectives,
        base_time_ns=a.base_time_ns,
        memory=memory.combine(a.memory, b.memory),
        steps_after_pause=sorted(a.steps_after_pause + b.steps_after_pause, key=lambda p: p.step),
        timeline=timeline.combine(a.timeline, b.timeline),
    )


def _add(a: dict, b: dict) -> dict:  # type: ignore[type-arg]
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def not_one_world(results: list[RankResult]) -> str | None:
    """Why these traces are not one run's, when their own headers say two world sizes or two backends
    (``distributedInfo``; a trace that states none is not counted). None when they agree (a trial: a 2-rank gloo run's
    traces beside an 8-GPU NCCL run's, read as one run whose ranks 0 and 1 held both runs' steps)."""
    for name, of in (("world size", lambda r: r.world_size), ("backend", lambda r: r.backend)):
        stated = {}
        for r in sorted(results, key=lambda r: r.path):
            stated.setdefault(of(r), r)
        stated.pop(None, None)
        if len(stated) > 1:
            (a, first), (b, second) = list(stated.items())[:2]
            return (f"{first.path} says {name} {a}, {second.path} {name} {b}: not one run's traces; pass the traces "
                    "of one run only")
    return None


APART_STEPS = 3.0
"""Two ranks' spans of the same step are another run's when they lie further apart than this many times the longer step
(a GPU rank's host runs ahead of its device by its launch queue: a few steps at most) ..."""
APART_US = 1e6
"""... and than this (1 s): a clock that a manifest cannot correct, or a host slow to wake, moves a step by less."""
APART_ONE_US = 600e6
"""With one common step only (a trace of one step per rank), further apart than this (10 minutes)."""


def apart_in_time(ranks: list[RankResult], offsets_us: dict[int, float] | None = None) -> str | None:
    """Why these traces are not one run's, when two ranks of one host traced the same steps at times that cannot be
    the same steps: at least two common steps, each of the one's spans apart from the other's by more than
    :data:`APART_STEPS` times the longer of the two and more than :data:`APART_US` (under DDP a step ends together on
    every rank), or one common step apart by more than :data:`APART_ONE_US`. None when they can be (a trial: rank 1's
    traces of another run copied in under the same names, read as 9 s late to each collective of a 65 ms step).

    Args:
        ranks: One result per rank.
        offsets_us: rank -> its clock minus rank 0's, as the run manifest measured it at train start: two machines
            that share a host name (containers) keep their own clocks.
    """
    offsets = offsets_us or {}
    by_host: dict[str, list[RankResult]] = {}
    for r in ranks:
        if r.host:
            by_host.setdefault(r.host, []).append(r)
    for host, group in sorted(by_host.items()):
        first = group[0]
        steps = {s.step: s for s in first.steps}
        for other in group[1:]:
            gaps = []
            for s in other.steps:
                mine = steps.get(s.step)
                if mine is None:
                    continue
                a = mine.start_us + first.base_time_ns / 1e3 - offsets.get(first.rank, 0.0)
                b = s.start_us + other.base_time_ns / 1e3 - offsets.get(other.rank, 0.0)
                gap = max(a, b) - min(a + mine.duration_us, b + s.duration_us)
                gaps.append((gap, max(APART_US, APART_STEPS * max(mine.duration_us, s.duration_us)), b - a))
            if (len(gaps) >= 2 and all(gap > least for gap, least, _ in gaps)) or \
                    (len(gaps) == 1 and gaps[0][0] > max(gaps[0][1], APART_ONE_US)):
                later = median(d for _, _, d in gaps) / 1e6
                return (f"ranks {first.rank} and {other.rank} on host {host} traced the same steps "
                        f"({', '.join(str(s.step) for s in other.steps if s.step in steps)}) {abs(later):.1f} s "
                        f"apart ({other.path} {'after' if later > 0 else 'before'} {first.path}): not one run's "
                        "traces; pass the traces of one run only")
    return None
