"""Cross-rank analyzer (pure): clock offsets, step spread, load imbalance and stragglers.

Ranks on different hosts have different clocks, so timestamps are not compared raw. A collective ends at
(nearly) the same moment on every rank, because nobody finishes before the last rank has contributed;
the offset of each rank's clock to rank ``ranks[0]`` is the median, over matched collectives, of the
difference of their end times. After that alignment, a rank that reaches a collective late is the one
its peers wait for: the straggler. (In DDP the fast ranks are the ones that wait, inside the collective,
so "the rank that waits the most" is the wrong answer.)

With 3 or more ranks, a rank whose mean step time stands out from the others' (more than
``step_outlier_pct`` above the median rank's and more than 3 scaled median absolute deviations) is
also named, as a step-time outlier. With 2 ranks that rule cannot fire: the median lies halfway between
them, and the slower rank's excess (d/2) is always below 3 scaled MADs (3 * 1.48 * d/2).
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.model import (
    AnalysisOptions,
    Collective,
    CrossRankResult,
    RankResult,
    RankSkew,
    StepSpread,
    Straggler,
)

CollectiveKey = tuple[int, str, int]


def match_collectives(ranks: list[RankResult]) -> dict[CollectiveKey, dict[int, Collective]]:
    """Collectives present on every rank, keyed by (step, kind, k-th of that kind in the step)."""
    per_rank = [{(c.step, c.kind, c.index): c for c in r.collectives} for r in ranks]
    if not per_rank:
        return {}
    common = set(per_rank[0]).intersection(*per_rank[1:])
    return {key: {r.rank: table[key] for r, table in zip(ranks, per_rank)} for key in sorted(common)}


def clock_offsets(
    ranks: list[RankResult], matched: dict[CollectiveKey, dict[int, Collective]]
) -> dict[int, float]:
    """Offset (us) to subtract from each rank's timestamps to put it on the first rank's clock.

    Args:
        ranks: The ranks.
        matched: Output of :func:`match_collectives`.

    Returns:
        rank -> offset; all zero when no collective is matched.
    """
    if not ranks:
        return {}
    ref = ranks[0].rank
    offsets: dict[int, float] = {}
    for r in ranks:
        diffs = [m[r.rank].end_us - m[ref].end_us for m in matched.values()]
        offsets[r.rank] = median(diffs) if diffs else 0.0
    return offsets


def cross_rank(ranks: list[RankResult], options: AnalysisOptions) -> CrossRankResult:
    """Compare ranks: step spread, imbalance of busy time, collective lateness, stragglers.

    Args:
        ranks: Per-rank results, sorted by rank.
        options: Straggler and outlier thresholds.

    Returns:
        The cross-rank view.
    """
    matched = match_collectives(ranks)
    offsets = clock_offsets(ranks, matched)
    # Lateness per step is the rank's worst arrival at a sync point of that step, then the median over
    # steps. Not the median over collectives: a rank that is slow before the first collective of a step
    # (data loading, say) is late there only, and every later collective of the step starts in lockstep
    # because its peers waited in that first one (the Trainer all-gathers token counts first thing).
    per_step: dict[int, dict[int, float]] = {r.rank: {} for r in ranks}
    for (step, _kind, _index), same in matched.items():
        aligned = {rank: c.start_us - offsets[rank] for rank, c in same.items()}
        first = min(aligned.values())
        for rank, start in aligned.items():
            per_step[rank][step] = max(per_step[rank].get(step, 0.0), start - first)
    lateness = {rank: list(steps.values()) for rank, steps in per_step.items()}
    per_rank = [
        RankSkew(
            rank=r.rank,
            mean_step_us=r.mean_step_us,
            busy_us=r.busy_us,
            comm_wait_us=r.comm_wait_us,
            lateness_us=median(lateness[r.rank]) if lateness[r.rank] else None,
            clock_offset_us=offsets.get(r.rank, 0.0),
        )
        for r in ranks
    ]
    busy = [p.busy_us for p in per_rank]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    imbalance = 100.0 * (max(busy) / mean_busy - 1.0) if mean_busy > 0 and len(busy) > 1 else 0.0
    return CrossRankResult(
        ranks=[r.rank for r in ranks],
        per_rank=per_rank,
        step_spread=_step_spread(ranks),
        imbalance_pct=imbalance,
        matched_collectives=len(matched),
        stragglers=_stragglers(per_rank, len(matched), options) if len(ranks) > 1 else [],
    )


def _step_spread(ranks: list[RankResult]) -> list[StepSpread]:
    durations: dict[int, list[float]] = {}
    for r in ranks:
        for s in r.steps:
            durations.setdefault(s.step, []).append(s.duration_us)
    out = []
    for step in sorted(durations):
        values = durations[step]
        mid = median(values)
        out.append(
            StepSpread(
                step, min(values), max(values), 100.0 * (max(values) - min(values)) / mid if mid else 0.0
            )
        )
    return out


def _stragglers(per_rank: list[RankSkew], n_matched: int, options: AnalysisOptions) -> list[Straggler]:
    step_us = median(p.mean_step_us for p in per_rank)
    threshold = max(options.straggler_min_us, options.straggler_pct / 100.0 * step_us)
    out: list[Straggler] = []
    waits = {p.rank: p.comm_wait_us for p in per_rank}
    late_values = [p.lateness_us for p in per_rank if p.lateness_us is not None]
    late_median = median(late_values) if late_values else 0.0
    late_mad = 1.4826 * median(abs(v - late_median) for v in late_values) if late_values else 0.0
    for p in sorted(per_rank, key=lambda p: -(p.lateness_us or 0.0)):
        if p.lateness_us is None or p.lateness_us <= threshold:
            continue
        # With 3+ ranks a straggler must also stand out from the others (3 scaled MADs): when several
        # ranks arrive late at the same collective (uneven embedding lookups before an all_to_all, say),
        # that is imbalance, reported as such, not one rank holding everyone back. Two ranks have no
        # spread to compare against; the threshold alone decides.
        if len(late_values) >= 3 and p.lateness_us - late_median <= 3.0 * late_mad:
            continue
        peers = [w for rank, w in waits.items() if rank != p.rank]
        peer_wait = sum(peers) / len(peers) if peers else 0.0
        out.append(
            Straggler(
                rank=p.rank,
                reason="late_collectives",
                evidence=(
                    f"rank {p.rank} reaches a collective of each step {p.lateness_us / 1e3:.2f} ms after the "
                    f"earliest rank (its latest arrival per step, median over steps; {n_matched} matched "
                    f"collectives; {100 * p.lateness_us / step_us:.1f}% of the {step_us / 1e3:.2f} ms step); "
                    f"it waits {p.comm_wait_us / 1e3:.2f} ms per step on "
                    f"communication while its peers wait {peer_wait / 1e3:.2f} ms"
                ),
                lateness_us=p.lateness_us,
                step_excess_pct=None,
            )
        )
    late = {s.rank for s in out}
    # Robust outlier test: a rank must stand out from the spread of all ranks (3 scaled MADs), not
    # only exceed the median, or half the ranks of a noisy but healthy run would be "stragglers".
    # It needs 3+ ranks: with two, step times a and a + d have median a + d/2 and scaled MAD 1.48 * d/2,
    # so the slower rank's excess d/2 never clears 3 MADs (and with two ranks "outlier" means nothing;
    # a slow one of two shows as late at collectives, above).
    if len(per_rank) < 3:
        return out
    mad = 1.4826 * median(abs(p.mean_step_us - step_us) for p in per_rank)
    for p in per_rank:
        excess = 100.0 * (p.mean_step_us / step_us - 1.0) if step_us else 0.0
        robust = p.mean_step_us - step_us > 3.0 * mad
        if excess > options.step_outlier_pct and robust and p.rank not in late:
            out.append(
                Straggler(
                    rank=p.rank,
                    reason="slow_steps",
                    evidence=(
                        f"rank {p.rank}'s steps take {p.mean_step_us / 1e3:.2f} ms, {excess:.1f}% more than "
                        f"the median rank's {step_us / 1e3:.2f} ms and more than 3 scaled median absolute "
                        f"deviations ({3.0 * mad / 1e3:.2f} ms) from it across the {len(per_rank)} ranks"
                    ),
                    lateness_us=p.lateness_us,
                    step_excess_pct=excess,
                )
            )
    return out
