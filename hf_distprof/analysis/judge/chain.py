"""The slow rank's finding as one causal chain (pure): which phase of its step is slower, so it reaches the step's
collectives late, so its peers wait there.

A rank that is slow before a collective (its data loader, say) makes every peer wait inside that collective: the
peers' exposed communication is then a wait for the late rank, not a cost of the network. The trace shows the wait
(each collective's exposed time before the last rank arrived, :func:`hf_distprof.analysis.across.align.set_waits`), the
lateness and the verdicts (:mod:`hf_distprof.analysis.across.skew`); the step timer's records of the same run show
which phase of the slow rank's step is longer, over every untraced step. When that phase explains the peers' waits
(its excess is at least a quarter of what they wait), the straggler and imbalance findings about the rank, and a
data-loading finding naming only it, become one finding, first: the cause, the mechanism, the cost to the others and
what to try. Otherwise the waits are added to the rank's own finding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import median

from hf_distprof.analysis.read.timer_records import TimerRecords
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import TRACE, TRACE_AND_TIMER, Finding
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.advice import PHASE_NAMES, phase_advice
from hf_distprof.core.run_verdict import TIMER_TEST
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


@dataclass
class PhaseExcess:
    """How much longer one phase of the slow rank's step is than its peers', per step."""

    phase: str
    excess_us: float
    """Median over steps of the rank's time in the phase less the median of its peers'."""
    steps: int
    source: str
    """Where the figure comes from, in words ("the step timer, median over 16 untraced steps")."""
    from_timer: bool = False
    """Whether it comes from the step timer's records (else from the traced window)."""


def phase_excess(rank: int, ranks: list[RankResult], records: TimerRecords | None,
                 traced: set[int]) -> PhaseExcess | None:
    """The phase of ``rank``'s step that exceeds its peers' the most: from the step timer's records over the steps
    its verdict judges when there are any (data, forward, backward, optimizer), else from the traced steps (data
    loading, compute)."""
    steps = records.judged_steps(traced) if records is not None else []
    per_phase: dict[str, dict[int, list[float]]] = {}
    if steps and records is not None:
        per_phase = {p: {r: [1e6 * v for v in vs] for r, vs in by_rank.items()}
                     for p, by_rank in records.phases(steps).items()}
        source, timed = f"the step timer, median over {len(steps)} untraced steps", True
    if not per_phase or rank not in next(iter(per_phase.values())):
        common = sorted(set.intersection(*({s.step for s in r.steps} for r in ranks)))
        if not common:
            return None
        by_step = {r.rank: {s.step: s for s in r.steps} for r in ranks}
        per_phase = {
            "data": {r: [by_step[r][s].cpu.data_loading_us for s in common] for r in by_step},
            "compute": {r: [by_step[r][s].busy_us(dev) - by_step[r][s].cpu.data_loading_us for s in common]
                        for r, dev in ((x.rank, x.device) for x in ranks)},
        }
        steps, source, timed = common, f"the traced window, median over {len(common)} steps", False
    best: PhaseExcess | None = None
    for phase, values in per_phase.items():
        if rank not in values or len(values) < 2:
            continue
        peers = [r for r in values if r != rank]
        excess = median(values[rank][i] - median(values[p][i] for p in peers) for i in range(len(steps)))
        if best is None or excess > best.excess_us:
            best = PhaseExcess(phase, excess, len(steps), source, from_timer=timed)
    return best


def _slow_rank(cross: CrossRankResult) -> tuple[int, list[tuple[str, SlowRankVerdict]]] | None:
    """The rank the straggler verdict (else the imbalance verdict) names, and every raised verdict naming it."""
    raised = [(name, v) for name, v in (("straggler", cross.straggler_verdict), ("imbalance", cross.imbalance_verdict))
              if v is not None and v.raised and v.rank is not None]
    if not raised:
        return None
    rank = raised[0][1].rank
    assert rank is not None
    return rank, [(name, v) for name, v in raised if v.rank == rank]


def wait_sentence(slow: int, ranks: list[RankResult]) -> tuple[str, float, float]:
    """"rank 0 waits 55.7% of its step at all_gather and 6.7% at all_reduce for rank 1" (the peer that waits most,
    and how many others do), the largest wait in % of the step and in microseconds per step."""
    waits = {r.rank: r.waits_by_peer().get(slow, {}) for r in ranks if r.rank != slow}
    totals = {r: sum(kinds.values()) for r, kinds in waits.items()}
    if not totals or max(totals.values()) < MIN_WAIT_PCT:
        return "", 0.0, 0.0
    worst = max(totals, key=lambda r: (totals[r], -r))
    kinds = sorted(waits[worst].items(), key=lambda kv: -kv[1])
    parts = [f"{pct:.1f}% of its step at {kind}" if i == 0 else f"{pct:.1f}% at {kind}"
             for i, (kind, pct) in enumerate(kinds) if pct >= 0.05]
    text = f"rank {worst} waits {' and '.join(parts)} for rank {slow}"
    others = sorted(r for r, t in totals.items() if r != worst and t >= MIN_WAIT_PCT)
    if others:
        low, high = f"{min(totals[r] for r in others):.1f}", f"{max(totals[r] for r in others):.1f}"
        spread = low if low == high else f"{low}-{high}"
        text += f"; {len(others)} other rank{'s' if len(others) > 1 else ''} wait {spread}%"
    rank = next(r for r in ranks if r.rank == worst)
    step_us = rank.mean_step_us if rank.device != "gpu" else median(
        s.gpu.kernel_time_us for s in rank.steps if s.gpu is not None)
    return text, totals[worst], totals[worst] / 100.0 * step_us


def explain(findings: list[Finding], ranks: list[RankResult], cross: CrossRankResult | None,
            records: TimerRecords | None) -> list[Finding]:
    """The findings with the slow rank's as one causal chain, first, when one phase of its step explains its peers'
    waits; else with the waits added to the rank's own finding. Unchanged without a raised slow-rank verdict.

    Args:
        findings: The diagnosis's findings.
        ranks: The ranks, their waits set (:func:`hf_distprof.analysis.across.align.set_waits`).
        cross: The cross-rank view.
        records: The step timer's records beside the traces, if any.
    """
    found = _slow_rank(cross) if cross is not None else None
    if found is None or cross is None:
        return findings
    slow, verdicts = found
    # The rank's own findings, most severe first (ties in the order found).
    about = sorted((f for f in findings if f.kind in ("straggler", "imbalance") and f.ranks == [slow]),
                   key=lambda f: -f.severity)
    waits, wait_pct, wait_us = wait_sentence(slow, ranks)
    traced = {s.step for r in ranks for s in r.steps}
    phase = phase_excess(slow, ranks, records, traced)
    explains = bool(about and waits) and phase is not None and phase.excess_us > 0 and \
        phase.excess_us >= EXPLAINS * wait_us
    if not explains and verdicts[0][1].test.endswith(TIMER_TEST):
        # Named by the run, not by the window: one finding with the run's evidence, in place of the window's.
        rest = [f for f in findings if f not in about]
        return [_across_the_run(slow, verdicts[0][1], phase, waits, wait_pct, ranks, about), *rest]
    if not about or not waits:
        return findings
    if not explains or phase is None:
        extended = [replace(f, evidence=f"{f.evidence}; {waits}") if f is about[0] else f for f in findings]
        return extended
    name = PHASE_NAMES.get(phase.phase, phase.phase)
    skew = next((p for p in cross.per_rank if p.rank == slow), None)
    late = ""
    if skew is not None and skew.lateness_us is not None and skew.mean_step_us > 0:
        late = (f", so it reaches each step's collectives {skew.lateness_us / 1e3:.2f} ms "
                f"({100 * skew.lateness_us / skew.mean_step_us:.1f}% of the step) after the earliest rank")
    (first, verdict), *more = verdicts
    reasons = f"{first} verdict: {verdict.reason}" + "".join(f"; {name} verdict raised too: {v.claim}"
                                                             for name, v in more)
    folded = [f for f in findings if f.kind == "data_loading_bound" and f.ranks == [slow] and phase.phase == "data"]
    data = (f"; data loading is {folded[0].numbers['data_loading_pct']:.1f}% of rank {slow}'s step (median over the "
            "traced steps)" if folded else "")
    action = f"Rank {slow}: {phase_advice(phase.phase, on_gpu=any(r.device == 'gpu' for r in ranks))}"
    chain = Finding(
        kind=SLOW_RANK,
        severity=max([wait_pct] + [f.severity for f in about]),
        title=f"Rank {slow} holds the others back: its {name}",
        ranks=[slow],
        evidence=(
            f"rank {slow}'s {name} takes {phase.excess_us / 1e3:.2f} ms more per step than its peers' "
            f"({phase.source}){late}, and the others wait for it there (from their arrival at the same collective "
            f"to its, clocks aligned): {waits}{data}. {reasons}"
        ),
        recommendation=(
            f"{action}. The others' exposed communication is a wait for it, not the network: larger buckets or a "
            "faster network will not shorten it."
        ),
        numbers={
            "phase_excess_ms": phase.excess_us / 1e3,
            "peer_wait_pct": wait_pct,
            **{k: v for f in about for k, v in f.numbers.items()},
        },
        confidence=min((f.confidence for f in about if f.confidence is not None), default=None),
        phase=phase.phase,
        why=(f"{name} takes {phase.excess_us / 1e3:.1f} ms more per step than on its peers, who wait {wait_pct:.1f}% "
             "of their step for it at the collectives"),
        action=action,
        basis=TRACE_AND_TIMER if phase.from_timer or any(f.basis == TRACE_AND_TIMER for f in about) else TRACE,
        steps=verdict.steps,
    )
    rest = [f for f in findings if f not in about and f not in folded]
    return [chain, *rest]


def _across_the_run(slow: int, verdict: SlowRankVerdict, phase: PhaseExcess | None, waits: str, wait_pct: float,
                    ranks: list[RankResult], about: list[Finding]) -> Finding:
    """The slow rank's finding when the step timer names it over the run and the traced window does not explain it
    (its peers' waits there are small, or another phase): the run's numbers, the window's beside them."""
    on_gpu = any(r.device == "gpu" for r in ranks)
    timed = phase is not None and phase.from_timer and phase.excess_us > 0
    name = PHASE_NAMES.get(phase.phase, phase.phase) if timed and phase is not None else ""
    action = f"Rank {slow}: {phase_advice(phase.phase if timed and phase is not None else 'compute', on_gpu)}"
    why = (f"its own work exceeds its peers' by a median {verdict.effect_pct:.1f}% over the run's {verdict.steps} "
           f"untraced steps (the step timer; slowest in {verdict.slowest_in} of them)")
    most = (f"; most of it in its {name}: {phase.excess_us / 1e3:.2f} ms more per step than its peers' ({phase.source})"
            if timed and phase is not None else "")
    return Finding(
        kind=SLOW_RANK,
        severity=max([wait_pct, *(f.severity for f in about)]) or verdict.effect_pct,
        title=f"Rank {slow} holds the others back" + (f": its {name}" if name else ""),
        ranks=[slow],
        evidence=f"{why}{most}" + (f"; in the traced window {waits}" if waits else "") + f". {verdict.reason}",
        recommendation=f"{action}.",
        numbers={"effect_pct": verdict.effect_pct, "peer_wait_pct": wait_pct, "slowest_in_steps": verdict.slowest_in,
                 "steps": verdict.steps, **({"phase_excess_ms": phase.excess_us / 1e3} if timed and phase else {})},
        confidence=verdict.confidence,
        phase=phase.phase if timed and phase is not None else None,
        why=why,
        action=action,
        basis=TRACE_AND_TIMER,
        steps=verdict.steps,
    )
