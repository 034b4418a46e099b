"""The ranks against each other in the traced steps (pure; figures only): step spread, load imbalance, each rank's
lateness at the step's collectives and its own work per step, on the aligned clocks.

Once the ranks are on one clock (:mod:`hf_distprof.analysis.across.align`), a rank that reaches a collective late
is the one its peers wait for. (In DDP the fast ranks are the ones that wait, inside the collective, so "the rank
that waits the most" is the wrong answer.) Whether a rank is slow is the judge's decision
(:mod:`hf_distprof.analysis.judge.verdicts`), from these figures.
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.results.across import Alignment, RankSkew, Skew, StepSpread, TimerFigures
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.verdicts import OWN_WORK, imbalance_pct

BUSY = "busy time (GPU: compute kernels; CPU: compute + data loading)"
BUSY_LESS_WAIT = "busy time (CPU: compute + data loading, less its wait for a CPU)"


def common_steps(values: dict[int, dict[int, float]]) -> list[int]:
    """The steps every rank has a value for, in order (none without ranks): the one intersection of steps."""
    return sorted(set.intersection(*(set(v) for v in values.values()))) if values else []


def skew(ranks: list[RankResult], alignment: Alignment, timer: TimerFigures) -> Skew:
    """The ranks compared: step spread, imbalance of busy time, lateness at collectives, own work per step.

    Lateness per step is the rank's worst arrival at a sync point of that step. Not the median over collectives: a
    rank that is slow before the first collective of a step (data loading, say) is late there only, and every later
    collective of the step starts in lockstep because its peers waited in that first one (the Trainer all-gathers
    token counts first thing).

    On CPU a rank's busy time holds the time its thread sat in the run queue, waiting for a core another process (or
    the other rank) held: on a shared host that is most of the difference between clean ranks. When the step timer
    measured that wait for every rank and traced step, busy time less it is what the imbalance verdict judges, and the
    timer's own work (``own_work_s``) when it covers every rank and traced step: the trace's busy time less the
    run-queue wait over-corrects on a busy host (the wait also accrues outside the ops the trace counts as busy), the
    timer's figure is what its own verdict judges; its materiality is then weighed against the step less the ranks'
    wait for a CPU (``own_step_s``), as the timer weighs it.

    Args:
        ranks: Per-rank results, sorted by rank (two or more).
        alignment: The ranks aligned (:func:`hf_distprof.analysis.across.align.align`).
        timer: The step timer's figures of the same run.
    """
    per_step: dict[int, dict[int, float]] = {r.rank: {} for r in ranks}
    worst_at: dict[int, dict[int, tuple[int, str, int]]] = {r.rank: {} for r in ranks}  # where that lateness was
    for key, aligned in alignment.arrivals.items():
        step, first = key[0], min(aligned.values())
        for rank, start in aligned.items():
            if step not in worst_at[rank] or start - first > per_step[rank][step]:
                per_step[rank][step] = max(per_step[rank].get(step, 0.0), start - first)
                worst_at[rank][step] = key
    lag = start_lag(ranks, alignment, per_step, worst_at)
    per_rank = [
        RankSkew(
            rank=r.rank,
            mean_step_us=r.mean_step_us,
            busy_us=r.busy_us,
            comm_wait_us=r.comm_wait_us,
            lateness_us=median(per_step[r.rank].values()) if per_step[r.rank] else None,
            clock_offset_us=alignment.offsets.get(r.rank, 0.0),
            lateness_steps=sorted(per_step[r.rank]),
            lateness_per_step_us=[per_step[r.rank][s] for s in sorted(per_step[r.rank])],
            start_lag_us=lag.get(r.rank),
        )
        for r in ranks
    ]
    durations = {r.rank: {s.step: s.duration_us for s in r.steps} for r in ranks}
    late_steps = common_steps(per_step)
    busy_by_step = {r.rank: {s.step: s.busy_us(r.device) for s in r.steps} for r in ranks}
    what, own = BUSY, False
    less = less_cpu_wait(ranks, busy_by_step, timer.cpu_wait)
    if less is not None:
        busy_by_step, what, own = less, BUSY_LESS_WAIT, True
    timed = _timer_own_work(busy_by_step, timer.own_work)
    if timed is not None:
        busy_by_step, what, own = timed, OWN_WORK + " as the step timer measured it in the traced steps", True
    busy_steps = common_steps(busy_by_step)
    common = common_steps(durations)
    step_time = [median(d[s] for d in durations.values()) for s in common]
    if timed is not None and all(s in timer.own_step for s in common):
        step_time = [1e6 * timer.own_step[s] for s in common]
    return Skew(
        per_rank=per_rank,
        step_spread=_step_spread(ranks),
        imbalance_pct=imbalance_pct([p.busy_us for p in per_rank]),
        matched_collectives=len(alignment.matched),
        lateness={rank: [per_step[rank][s] for s in late_steps] for rank in per_step},
        lateness_scale=[median(d[s] for d in durations.values() if s in d) for s in late_steps],
        busy={rank: [v[s] for s in busy_steps] for rank, v in busy_by_step.items()},
        busy_what=what,
        busy_step_time=step_time,
        busy_is_own_work=own,
    )


def start_lag(ranks: list[RankResult], alignment: Alignment, lateness: dict[int, dict[int, float]],
              worst_at: dict[int, dict[int, tuple[int, str, int]]]) -> dict[int, float]:
    """rank -> the part of its lateness that arose before it began the step, median over its steps: per step, its
    lateness (at its latest collective of the step) less its own excess there, from its step start to that arrival
    against its peers' median from theirs (aligned clocks), kept between none and all of the lateness. With 2 ranks,
    for the late one, how much later it began the step. A rank with no such step is left out."""
    starts = {r.rank: {s.step: s.start_us - alignment.offsets.get(r.rank, 0.0) for s in r.steps} for r in ranks}
    out: dict[int, float] = {}
    for rank, steps in worst_at.items():
        shares = []
        for step, key in steps.items():
            arrived = alignment.arrivals[key]
            into = {q: at - starts[q][step] for q, at in arrived.items() if step in starts.get(q, {})}
            peers = [v for q, v in into.items() if q != rank]
            if rank in into and peers:  # a part of the lateness: between none of it and all of it
                late = lateness[rank][step]
                shares.append(min(late, max(0.0, late - (into[rank] - median(peers)))))
        if shares:
            out[rank] = median(shares)
    return out


def less_cpu_wait(
    ranks: list[RankResult], busy: dict[int, dict[int, float]], cpu_wait: dict[int, dict[int, float]]
) -> dict[int, dict[int, float]] | None:
    """Busy time (us) less the step timer's wait for a CPU, when every rank is a CPU rank and has the wait for
    every traced step; None otherwise (GPU ranks: their busy time is kernel time, which no host wait is in)."""
    if not ranks or any(r.device != "cpu" for r in ranks):
        return None
    if any(step not in cpu_wait.get(rank, {}) for rank, steps in busy.items() for step in steps):
        return None
    return {rank: {s: max(0.0, v - 1e6 * cpu_wait[rank][s]) for s, v in steps.items()} for rank, steps in busy.items()}


def _timer_own_work(
    busy: dict[int, dict[int, float]], own_work: dict[int, dict[int, float]]
) -> dict[int, dict[int, float]] | None:
    """The step timer's own work (us) on the steps of ``busy``; None when it lacks one."""
    if not busy or any(step not in own_work.get(rank, {}) for rank, steps in busy.items() for step in steps):
        return None
    return {rank: {s: 1e6 * own_work[rank][s] for s in steps} for rank, steps in busy.items()}


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
