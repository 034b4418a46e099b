"""Which rank holds the others back (pure): the slow-rank verdicts, decided from the across stage's figures.

The decisions are :mod:`hf_distprof.core.verdicts`'s, step by step: a rank is named only when it is late (or busier)
in most steps, more often than chance, by more than the threshold and the run's own noise; a window too short to tell
is "not enough evidence". The step timer's verdict over the run's untraced steps (judged again here from its records,
with the rule the live timer uses) decides when it reached one (:mod:`hf_distprof.core.run_verdict`); otherwise the
window's verdict is weighed with it (:func:`hf_distprof.core.run_verdict.weigh_with_the_run`).

With 3 or more ranks, a rank whose mean step time stands out from the others' (more than ``step_outlier_pct`` above
the median rank's and more than 3 scaled median absolute deviations) is also named, as a step-time outlier. With 2
ranks that rule cannot fire: the median lies halfway between them, and the slower rank's excess (d/2) is always below
3 scaled MADs (3 * 1.48 * d/2).
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import Across, RankSkew, RankVerdicts, Straggler, TimerFigures
from hf_distprof.analysis.results.findings import Basis
from hf_distprof.analysis.results.timer import TimingSummary
from hf_distprof.core.cause import Attribution, attribute_rows, with_device
from hf_distprof.core.run_verdict import (decided, follow_the_run, the_run_alone, verdict_from_json,
                                          weigh_with_the_run)
from hf_distprof.core.verdicts import OWN_WORK, SlowRankVerdict, judge_run, judge_slow_rank

LATE = "late_collectives"
SLOW_STEPS = "slow_steps"


def judge_ranks(across: Across, summary: TimingSummary, options: AnalysisOptions,
                traced: list[int] | None = None) -> RankVerdicts:
    """The straggler and imbalance verdicts, the step timer's over the run, and the ranks named.

    Args:
        across: The across stage's figures (the skew, the step timer's figures).
        summary: The step timer's summary (its verdict stands in for older records without marks).
        options: The thresholds.
        traced: The ranks whose traces were read.
    """
    timer = across.timer
    judged = run_verdict(timer, options.imbalance_pct)
    outside = judged.to_json() if judged is not None else summary.imbalance_verdict
    run = verdict_from_json(outside)
    # Whether the run's candidate is real (beyond its noise and persistent) whatever its size: the what-if's word.
    real = judge_slow_rank(timer.judged_work(), 0.0, what=OWN_WORK).raised if across.evidence is not None else None
    skew = across.skew
    cause = run_cause(timer, run, options.imbalance_pct) if decided(run) else None
    cause = with_device(cause, summary.gpu_health) if cause is not None else None
    if skew is None:
        # Fewer than 2 ranks traced (--profile-ranks): the step timer's verdict over the run, when it decided, is the
        # answer (its records hold every rank), with nothing of the window's beside it.
        # (Its ranks: the records', or timing_summary.json's verdict's alone, for files without per-step records.)
        alone = the_run_alone(run, sorted(traced or [])) if decided(run) and run is not None and run.ranks > 1 \
            else None
        return RankVerdicts(imbalance=alone, imbalance_basis=Basis.STEP_TIMER, run=run, run_json=outside,
                            run_real=real, cause=cause)
    imbalance_window = judge_slow_rank(skew.busy, options.imbalance_pct, what=skew.busy_what,
                                       step_time=skew.busy_step_time)
    straggler_window = judge_slow_rank(skew.lateness, options.straggler_pct, scale=skew.lateness_scale,
                                       min_abs=options.straggler_min_us, abs_unit=" us",
                                       abs_floor_is=("a late arrival alone is not told from scheduling noise "
                                                     "(--straggler-min-us)"),
                                       what="arrival at the step's collectives")
    if decided(run):
        # The step timer decided over the run: the answer is its; the window is one more sample, stated beside it.
        assert run is not None
        imbalance, straggler = follow_the_run(imbalance_window, run), follow_the_run(straggler_window, run)
        imbalance_basis = straggler_basis = Basis.STEP_TIMER
    else:
        imbalance, weighed = weigh_with_the_run(imbalance_window, outside, pool_effect=skew.busy_is_own_work)
        imbalance_basis = Basis.TRACE_AND_TIMER if weighed else Basis.TRACE
        straggler, weighed = weigh_with_the_run(straggler_window, outside)
        straggler_basis = Basis.TRACE_AND_TIMER if weighed else Basis.TRACE
    return RankVerdicts(
        straggler=straggler, imbalance=imbalance, straggler_window=straggler_window,
        imbalance_window=imbalance_window, straggler_basis=straggler_basis, imbalance_basis=imbalance_basis,
        run=run, run_json=outside, run_real=real, stragglers=stragglers(skew.per_rank, straggler, options),
        cause=cause,
    )


def run_verdict(timer: TimerFigures, threshold_pct: float) -> SlowRankVerdict | None:
    """The slow-rank verdict over the run's untraced steps, as the live step timer reaches it at train end: its own
    rule (:func:`hf_distprof.core.verdicts.judge_own_work`) on the steps it judges (``TimerFigures.judged``); None for
    older files (no marks) or fewer than 2 ranks."""
    if not timer.judged:
        return None
    parts = timer.judged_parts()
    arrival = {r: [p[0] for p in rows] for r, rows in parts.items()}
    step_time = [timer.step_times.get(s, 0.0) for s in timer.judged] if parts else []
    return judge_run(timer.judged_work(), arrival, threshold_pct, timer.judged_step_time(), step_time)


def run_cause(timer: TimerFigures, verdict: SlowRankVerdict | None, threshold_pct: float) -> Attribution | None:
    """Why the run's verdict names its rank (:func:`hf_distprof.core.cause.attribute`, as the live timer says it),
    over the steps it judged; None when it names no rank or the records lack the parts."""
    if verdict is None or not verdict.raised or verdict.rank is None:
        return None
    parts = timer.judged_parts()
    return attribute_rows(parts, verdict.rank, threshold_pct) if parts else None


def stragglers(per_rank: list[RankSkew], verdict: SlowRankVerdict, options: AnalysisOptions) -> list[Straggler]:
    """The ranks the straggler verdict names (the latest first), then, with 3+ ranks, those whose steps stand out."""
    step_us = median(p.mean_step_us for p in per_rank)
    out: list[Straggler] = []
    waits = {p.rank: p.comm_wait_us for p in per_rank}
    named = [verdict.rank, *verdict.also] if verdict.raised else []
    for p in sorted(per_rank, key=lambda p: -(p.lateness_us or 0.0)):
        if p.rank not in named or p.lateness_us is None:
            continue
        peers = [w for rank, w in waits.items() if rank != p.rank]
        out.append(Straggler(
            rank=p.rank, reason=LATE, lateness_us=p.lateness_us, step_excess_pct=None, confidence=verdict.confidence,
            step_us=step_us, mean_step_us=p.mean_step_us, comm_wait_us=p.comm_wait_us,
            peer_wait_us=sum(peers) / len(peers) if peers else 0.0,
        ))
    late = {s.rank for s in out}
    # Robust outlier test: a rank must stand out from the spread of all ranks (3 scaled MADs), not only exceed the
    # median, or half the ranks of a noisy but healthy run would be "stragglers". It needs 3+ ranks (module text).
    if len(per_rank) < 3:
        return out
    mad = 1.4826 * median(abs(p.mean_step_us - step_us) for p in per_rank)
    for p in per_rank:
        excess = 100.0 * (p.mean_step_us / step_us - 1.0) if step_us else 0.0
        robust = p.mean_step_us - step_us > 3.0 * mad
        if excess > options.step_outlier_pct and robust and p.rank not in late:
            out.append(Straggler(
                rank=p.rank, reason=SLOW_STEPS, lateness_us=p.lateness_us, step_excess_pct=excess, step_us=step_us,
                mean_step_us=p.mean_step_us, comm_wait_us=p.comm_wait_us, spread_us=3.0 * mad,
            ))
    return out
