"""The run's evidence beyond the traced window (pure): the step timer's records of every judged step, summarised for
the stages that weigh the traced steps against the run (the slow-rank answer, the what-if's noise).

The traced window holds a few steps, slowed and reshaped by the profiler; the step timer times every step at a small
cost. A what-if saving, a slow rank, a step-to-step noise: each is judged on the run's steps when the timer's records
are there, and on the traced steps only when they are not.
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.read.timer_records import TimerRecords
from hf_distprof.analysis.results.across import RunEvidence
from hf_distprof.core.stats import scaled_mad


def run_evidence(records: TimerRecords, traced: set[int]) -> RunEvidence | None:
    """What the step timer's records say about the run's judged steps; None without records of 2+ ranks.

    Args:
        records: The step timer's records beside the traces.
        traced: The steps the traces hold (left out, as the timer's verdict leaves them out).
    """
    steps = records.judged_steps(traced)
    if len(steps) < 2:
        return None
    times = records.step_times()
    judged = [times[s] for s in steps if s in times]
    own = records.own_work()
    medians = {rank: median(own[rank][s] for s in steps) for rank in sorted(own) if all(s in own[rank] for s in steps)}
    real = records.verdict(0.0, traced, material=False)  # beyond the noise and persistent, whatever its size
    candidate = real.rank if real is not None else None
    fastest = min(medians, key=lambda r: (medians[r], r)) if len(medians) > 1 else None
    named = real is not None and candidate is not None
    gap = (1e3 * median(own[candidate][s] - own[fastest][s] for s in steps)
           if candidate in medians and fastest is not None and fastest != candidate else None)
    return RunEvidence(
        steps=len(steps),
        noise_ms=1e3 * scaled_mad(judged) if len(judged) > 1 else 0.0,
        slowest_rank=candidate,
        fastest_rank=fastest if fastest != candidate else None,
        slow_rank_real=real is not None and real.raised,
        slow_rank_excess_ms=1e3 * real.effect_abs if named else None,
        fastest_gap_ms=gap,
        step_ms=1e3 * median(judged) if judged else None,
    )
