"""Cross-rank analyzer (pure): step spread, load imbalance and stragglers, on the aligned clocks.

Once the ranks are on one clock (:mod:`hf_distprof.analysis.across.align`), a rank that reaches a collective late
is the one its peers wait for: the straggler. (In DDP the fast ranks are the ones that wait, inside the collective,
so "the rank that waits the most" is the wrong answer.)

With 3 or more ranks, a rank whose mean step time stands out from the others' (more than
``step_outlier_pct`` above the median rank's and more than 3 scaled median absolute deviations) is
also named, as a step-time outlier. With 2 ranks that rule cannot fire: the median lies halfway between
them, and the slower rank's excess (d/2) is always below 3 scaled MADs (3 * 1.48 * d/2).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import Any

from hf_distprof.analysis.across.align import align
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import Alignment, CrossRankResult, RankSkew, StepSpread, Straggler
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.run_verdict import TIMER_TEST, decided, follow_the_run, verdict_from_json
from hf_distprof.core.verdicts import OWN_WORK, SlowRankVerdict, across_the_run, imbalance_pct, judge_slow_rank


def cross_rank(
    ranks: list[RankResult],
    options: AnalysisOptions,
    cpu_wait: dict[int, dict[int, float]] | None = None,
    timer: Mapping[str, Any] | None = None,
    own_work: dict[int, dict[int, float]] | None = None,
    own_step: dict[int, float] | None = None,
    *,
    alignment: Alignment | None = None,
) -> CrossRankResult:
    """Compare ranks: step spread, imbalance of busy time, collective lateness, stragglers.

    The straggler and imbalance decisions are :func:`hf_distprof.core.verdicts.judge_slow_rank`'s, step by
    step: a rank is named only when it is late (or busier) in most steps, more often than chance, by more
    than the threshold and the run's own noise; a window too short to tell is "not enough evidence".

    On CPU a rank's busy time holds the time its thread sat in the run queue, waiting for a core another
    process (or the other rank) held: on a shared host that is most of the difference between clean ranks.
    When the step timer measured that wait for every rank and traced step (``cpu_wait``), the imbalance
    verdict judges busy time less it, as the live verdict judges pre-sync work.

    Args:
        ranks: Per-rank results, sorted by rank.
        options: Straggler and imbalance thresholds.
        cpu_wait: rank -> step -> seconds waited for a CPU (``timing_rank{R}.jsonl``'s ``cpu_wait_s``).
        own_work: rank -> step -> seconds of own work the step timer measured (``own_work_s``: pre-sync work less
            the wait for a CPU on CPU). When it covers every rank and traced step, the imbalance verdict judges it:
            the trace's busy time less the run-queue wait over-corrects on a busy host (the wait also accrues outside
            the ops the trace counts as busy), the timer's figure is what its own verdict judges.
        own_step: step -> seconds of the step less the ranks' wait for a CPU (the step timer's ``own_step_s``, the
            largest over ranks): with ``own_work``, what the imbalance's materiality is judged against, as the timer
            judges it (a host's run-queue waits lengthen the step for nobody's work).
        timer: The step timer's verdict over the untraced steps (``timing_summary.json``'s
            ``imbalance_verdict``): both verdicts are weighed with it
            (:func:`hf_distprof.core.verdicts.across_the_run`): a rank slow in the window only is not named, and a
            window too short to show persistence on its own is completed by the rest of the run. With
            ``cpu_wait`` (the imbalance verdict then judges the timer's own figure: own work less the wait for
            a CPU), a window whose imbalance is under the threshold is judged on the effect of all the run's
            judged steps when the timer names the same rank (``pool_effect``).

        alignment: The ranks aligned, as the rest of the run's analysis uses them
            (:func:`hf_distprof.analysis.across.align.align`, computed when None).

    Returns:
        The cross-rank view.
    """
    alignment = alignment if alignment is not None else align(ranks)
    matched, offsets = alignment.matched, alignment.offsets
    # Lateness per step is the rank's worst arrival at a sync point of that step. Not the median over
    # collectives: a rank that is slow before the first collective of a step (data loading, say) is late
    # there only, and every later collective of the step starts in lockstep because its peers waited in
    # that first one (the Trainer all-gathers token counts first thing).
    per_step: dict[int, dict[int, float]] = {r.rank: {} for r in ranks}
    for (step, _kind, _index), aligned in alignment.arrivals.items():
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
            lateness_steps=sorted(per_step[r.rank]),
            lateness_per_step_us=[per_step[r.rank][s] for s in sorted(per_step[r.rank])],
        )
        for r in ranks
    ]
    straggler = imbalance = straggler_window = imbalance_window = None
    if len(ranks) > 1:
        durations = {r.rank: {s.step: s.duration_us for s in r.steps} for r in ranks}
        late_steps = sorted(set.intersection(*(set(v) for v in per_step.values())))
        busy_by_step = {r.rank: {s.step: s.busy_us(r.device) for s in r.steps} for r in ranks}
        what = "busy time (GPU: compute kernels; CPU: compute + data loading)"
        own = less_cpu_wait(ranks, busy_by_step, cpu_wait or {})
        if own is not None:
            busy_by_step, what = own, "busy time (CPU: compute + data loading, less its wait for a CPU)"
        timed = _timer_own_work(busy_by_step, own_work or {})
        if timed is not None:
            busy_by_step, what, own = timed, OWN_WORK + " as the step timer measured it in the traced steps", timed
        busy = _common_steps(busy_by_step)
        common = sorted(set.intersection(*(set(d) for d in durations.values())))
        step_time = [median(d[s] for d in durations.values()) for s in common]
        if timed is not None and own_step is not None and all(s in own_step for s in common):
            step_time = [1e6 * own_step[s] for s in common]
        imbalance_window = judge_slow_rank(busy, options.imbalance_pct, what=what, step_time=step_time)
        straggler = judge_slow_rank(
            {rank: [per_step[rank][s] for s in late_steps] for rank in per_step},
            options.straggler_pct,
            scale=[median(d[s] for d in durations.values() if s in d) for s in late_steps],
            min_abs=options.straggler_min_us,
            what="arrival at the step's collectives",
        )
        straggler_window = straggler
        run = verdict_from_json(timer)
        if decided(run):
            # The step timer decided over the run: the answer is its; the window is one more sample, stated beside it.
            assert run is not None
            imbalance, straggler = follow_the_run(imbalance_window, run), follow_the_run(straggler_window, run)
        else:
            imbalance = across_the_run(imbalance_window, timer, pool_effect=own is not None)
            straggler = across_the_run(straggler_window, timer)
    return CrossRankResult(
        ranks=[r.rank for r in ranks],
        per_rank=per_rank,
        step_spread=_step_spread(ranks),
        imbalance_pct=imbalance_pct([p.busy_us for p in per_rank]),
        matched_collectives=len(matched),
        stragglers=_stragglers(per_rank, straggler, len(matched), options) if straggler is not None else [],
        straggler_verdict=straggler,
        imbalance_verdict=imbalance,
        straggler_window=straggler_window,
        imbalance_window=imbalance_window,
    )


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
    """The step timer's own work (us) for every rank and step of ``busy``; None when it lacks one."""
    if not busy or any(step not in own_work.get(rank, {}) for rank, steps in busy.items() for step in steps):
        return None
    return {rank: {s: 1e6 * own_work[rank][s] for s in steps} for rank, steps in busy.items()}


def _common_steps(values: dict[int, dict[int, float]]) -> dict[int, list[float]]:
    """rank -> its values on the steps every rank has, in step order."""
    common = sorted(set.intersection(*(set(v) for v in values.values()))) if values else []
    return {rank: [v[s] for s in common] for rank, v in values.items()}


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


def _why_named(rank: int, verdict: SlowRankVerdict) -> str:
    """Why the straggler verdict names ``rank``: the arrival order in the window, weighed with the step timer's
    untraced steps, or the step timer's own verdict over the run."""
    if rank != verdict.rank:
        text = f"late together with rank {verdict.rank}, standing out from the other ranks"
    elif verdict.test.endswith(TIMER_TEST):
        text = (f"the step timer names it over the run's {verdict.steps} untraced steps: slowest in "
                f"{verdict.slowest_in} of {verdict.steps} (p = {verdict.p_value:.3f} by chance)")
    elif verdict.test.endswith("+ step timer"):
        text = (f"it is the last to arrive in {verdict.slowest_in} of {verdict.steps} steps (p = {verdict.p_value:.3f} "
                "by chance, with the step timer's untraced steps)")
    else:
        text = (f"it is the last to arrive in {verdict.slowest_in} of {verdict.steps} steps (p = {verdict.p_value:.3f} "
                "by chance)")
    return f"{text}, beyond the step-to-step noise of {verdict.noise_pct:.1f}%"


def _stragglers(
    per_rank: list[RankSkew], verdict: SlowRankVerdict, n_matched: int, options: AnalysisOptions
) -> list[Straggler]:
    step_us = median(p.mean_step_us for p in per_rank)
    out: list[Straggler] = []
    waits = {p.rank: p.comm_wait_us for p in per_rank}
    named = [verdict.rank, *verdict.also] if verdict.raised else []
    for p in sorted(per_rank, key=lambda p: -(p.lateness_us or 0.0)):
        if p.rank not in named or p.lateness_us is None:
            continue
        peers = [w for rank, w in waits.items() if rank != p.rank]
        peer_wait = sum(peers) / len(peers) if peers else 0.0
        summary = (f"rank {p.rank} reaches a collective of each step {p.lateness_us / 1e3:.2f} ms after the "
                   f"earliest rank (its latest arrival per step, median over steps; {n_matched} matched "
                   f"collectives; {100 * p.lateness_us / step_us:.1f}% of the {step_us / 1e3:.2f} ms step)")
        # Named by the step timer over the run, a rank the traced window shows waiting longer than its peers: the
        # window does not show the slowdown, and the evidence says so rather than reading as a contradiction.
        unseen = (", which the traced window does not show (there this rank waited longer than its peers): the "
                  "run's untraced steps carry the verdict") if (
            verdict.test.endswith(TIMER_TEST) and p.comm_wait_us > peer_wait) else ""
        out.append(
            Straggler(
                rank=p.rank,
                reason="late_collectives",
                summary=summary,
                evidence=f"{summary}; its exposed communication is {p.comm_wait_us / 1e3:.2f} ms per step against its "
                f"peers' {peer_wait / 1e3:.2f} ms; {_why_named(p.rank, verdict)}{unseen}",
                lateness_us=p.lateness_us,
                step_excess_pct=None,
                confidence=verdict.confidence,
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
            summary = (f"rank {p.rank}'s steps take {p.mean_step_us / 1e3:.2f} ms, {excess:.1f}% more than "
                       f"the median rank's {step_us / 1e3:.2f} ms and more than 3 scaled median absolute "
                       f"deviations ({3.0 * mad / 1e3:.2f} ms) from it across the {len(per_rank)} ranks")
            out.append(
                Straggler(
                    rank=p.rank,
                    reason="slow_steps",
                    summary=summary,
                    evidence=summary,
                    lateness_us=p.lateness_us,
                    step_excess_pct=excess,
                )
            )
    return out
