"""The slow rank's finding as one causal chain (pure): which phase of its step is slower, so it reaches the step's
collectives late, so its peers wait there.

A rank that is slow before a collective (its data loader, say) makes every peer wait inside that collective: the
peers' exposed communication is then a wait for the late rank, not a cost of the network. The trace shows the wait
(each collective's exposed time before the last rank arrived, :func:`hf_distprof.analysis.across.align.set_waits`), the
lateness and the verdicts (:mod:`hf_distprof.analysis.judge.verdicts`); the step timer's records of the same run show
which phase of the slow rank's step is longer, over every untraced step. When that phase explains the peers' waits
(its excess is at least a quarter of what they wait), the straggler and imbalance findings about the rank, and a
data-loading finding naming only it, become one finding, first: the cause, the mechanism, the cost to the others and
what to try. Otherwise the waits are added to the rank's own finding.
"""

from __future__ import annotations

from dataclasses import replace

from hf_distprof.analysis.results.across import Across, PhaseExcess, RankVerdicts
from hf_distprof.analysis.results.facts import ChainFacts, PeerWaits, RunSlowFacts
from hf_distprof.analysis.results.findings import STEP_TIMER, TRACE, TRACE_AND_TIMER, Judgement
from hf_distprof.core.cause import Attribution
from hf_distprof.core.verdicts import SlowRankVerdict

SLOW_RANK = "slow_rank"
"""The chain's kind: it stands for the straggler and imbalance findings about the rank."""
EXPLAINS = 0.25
"""A phase explains the peers' waits when its excess is at least this share of what they wait per step. Not more:
the excess is the step timer's, over the untraced steps, and the waits are the traced window's, where the profiler
and a busy host stretch every wait (a 10 ms collator sleep, measured as such by the timer, made its peer wait 22 ms
per traced step beside a busy core, at the all-gather and again at the all-reduce)."""
MIN_WAIT_PCT = 1.0
"""Waits for a rank below this % of the step are not worth a sentence."""


def peer_waits(slow: int, across: Across, gpu: bool = False) -> PeerWaits | None:
    """Who waits for ``slow`` at the collectives (the peer that waits longest, ties: the lower rank; how many others
    do); None when no peer waits :data:`MIN_WAIT_PCT` of its step for it."""
    waits = {}
    for rank, peers in across.late_peers.items():
        if rank != slow:
            waits[rank] = next((p for p in peers if p.peer == slow), None)
    totals = {rank: p.pct if p is not None else 0.0 for rank, p in waits.items()}
    if not totals or max(totals.values()) < MIN_WAIT_PCT:
        return None
    worst = max(totals, key=lambda r: (totals[r], -r))
    found = waits[worst]
    assert found is not None
    others = [totals[r] for r in sorted(totals) if r != worst and totals[r] >= MIN_WAIT_PCT]
    return PeerWaits(slow=slow, worst=worst, kinds=list(found.kinds), pct=found.pct, us=found.us, others=others,
                     gpu=gpu)


def explain(findings: list[Judgement], across: Across, verdicts: RankVerdicts, gpu: bool) -> list[Judgement]:
    """The findings with the slow rank's as one causal chain, first, when one phase of its step explains its peers'
    waits; else with the waits added to the rank's own finding. Unchanged without a raised slow-rank verdict.

    Args:
        findings: The diagnosis's findings.
        across: The across stage's figures (the waits per late peer, each rank's slowest phase, the skew).
        verdicts: The slow-rank verdicts.
        gpu: Whether the run has GPU ranks (the advice fits the device).
    """
    raised = verdicts.raised()
    if not raised:
        return findings
    slow = raised[0][1].rank
    assert slow is not None
    naming = [(name, v, basis) for name, v, basis in raised if v.rank == slow]
    # The rank's own findings, most severe first (ties in the order found).
    about = sorted((f for f in findings if f.kind in ("straggler", "imbalance") and f.ranks == [slow]),
                   key=lambda f: -f.severity)
    waits = peer_waits(slow, across, gpu)
    phase = across.phase_excess.get(slow)
    explains = (bool(about) and waits is not None and phase is not None and phase.excess_us > 0
                and phase.excess_us >= EXPLAINS * waits.us)
    first = naming[0][1]
    cause = verdicts.cause if verdicts.cause is not None and verdicts.cause.rank == slow else None
    if not explains and naming[0][2] == STEP_TIMER:
        # Named by the run, not by the window: one finding with the run's evidence, in place of the window's (and of
        # the rank's data-loading finding when its data loading is what exceeds, as the chain below folds it).
        loading = phase is not None and phase.from_timer and phase.excess_us > 0 and phase.phase == "data"
        rest = [f for f in findings if f not in about
                and not (loading and f.kind == "data_loading_bound" and f.ranks == [slow])]
        windowed = verdicts.straggler_window is not None or verdicts.imbalance_window is not None
        return [_across_the_run(slow, first, phase, waits, about, gpu, cause, windowed), *rest]
    if not about or waits is None:
        return findings
    if not explains or phase is None:
        return [replace(f, facts=replace(f.facts, waits=waits)) if f is about[0] else f for f in findings]
    skew = next((p for p in across.skew.per_rank if p.rank == slow), None) if across.skew is not None else None
    # (A rank first at the window's collectives, median over steps, is not said to reach them late: a trial's chain
    # read "so it reaches each step's collectives 0.00 ms after the earliest rank".)
    lateness = (skew.lateness_us if skew is not None and skew.lateness_us is not None and skew.lateness_us > 0
                and skew.mean_step_us > 0 else None)
    folded = [f for f in findings if f.kind == "data_loading_bound" and f.ranks == [slow] and phase.phase == "data"]
    chain = Judgement(
        kind=SLOW_RANK,
        severity=max([waits.pct] + [f.severity for f in about]),
        ranks=[slow],
        facts=ChainFacts(rank=slow, phase=phase, source_steps=phase.steps, lateness_us=lateness,
                         step_us=skew.mean_step_us if skew is not None else 0.0, waits=waits,
                         verdicts=[(name, v) for name, v, _ in naming],
                         data_pct=folded[0].numbers["data_loading_pct"] if folded else None, gpu=gpu,
                         cause=cause, lateness_pct=100.0 * lateness / skew.mean_step_us
                         if lateness is not None and skew is not None and skew.mean_step_us else 0.0),
        numbers={
            "phase_excess_ms": phase.excess_us / 1e3,
            "peer_wait_pct": waits.pct,
            **{k: v for f in about for k, v in f.numbers.items()},
        },
        confidence=min((f.confidence for f in about if f.confidence is not None), default=None),
        phase=phase.phase,
        basis=TRACE_AND_TIMER if phase.from_timer or any(f.basis == TRACE_AND_TIMER for f in about) else TRACE,
        steps=first.steps,
        cause=cause.cause.value if cause is not None else None,
        more_work_too=cause is not None and cause.more_work_too,
    )
    rest = [f for f in findings if f not in about and f not in folded]
    return [chain, *rest]


def _across_the_run(slow: int, verdict: SlowRankVerdict, phase: PhaseExcess | None, waits: PeerWaits | None,
                    about: list[Judgement], gpu: bool, cause: Attribution | None, windowed: bool) -> Judgement:
    """The slow rank's finding when the step timer names it over the run and the traced window does not explain it
    (its peers' waits there are small, or another phase): the run's numbers, the window's beside them; on the step
    timer's records alone when no window verdict across ranks exists (``windowed`` False: one rank's trace)."""
    timed = phase if phase is not None and phase.from_timer and phase.excess_us > 0 else None
    wait_pct = waits.pct if waits is not None else 0.0
    return Judgement(
        kind=SLOW_RANK,
        # (else what the peers wait for it in % of the step, never its excess in % of its peers' own work: a trial's
        # rank with 10x its peer's work scored 1049 where its mirror, traced, scored 64)
        severity=max([wait_pct, *(f.severity for f in about)]) or (
            min(verdict.cost_pct if verdict.cost_pct is not None else verdict.effect_pct, 100.0)),
        ranks=[slow],
        facts=RunSlowFacts(rank=slow, verdict=verdict, phase=timed, waits=waits, gpu=gpu, cause=cause,
                           advice_phase=timed.phase if timed is not None else "compute"),
        numbers={"effect_pct": verdict.effect_pct, "peer_wait_pct": wait_pct, "slowest_in_steps": verdict.slowest_in,
                 "steps": verdict.steps, **({"phase_excess_ms": timed.excess_us / 1e3} if timed else {})},
        confidence=verdict.confidence,
        phase=timed.phase if timed else None,
        basis=TRACE_AND_TIMER if windowed else STEP_TIMER,
        steps=verdict.steps,
        cause=cause.cause.value if cause is not None else None,
        more_work_too=cause is not None and cause.more_work_too,
    )
