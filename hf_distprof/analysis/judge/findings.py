"""The judge stage's front (pure): every finding of the run, in the one order the output shows them.

The findings come from the diagnosis (:mod:`hf_distprof.analysis.judge.diagnosis`), the profiler's slowdown, the
slow rank's causal chain (:mod:`hf_distprof.analysis.judge.chain`) and the what-if model
(:mod:`hf_distprof.analysis.judge.whatif`); :func:`in_order` is the only place they are put in order.
"""

from __future__ import annotations

from typing import Any

from hf_distprof.analysis.judge import chain
from hf_distprof.analysis.judge.diagnosis import diagnose, undecided
from hf_distprof.analysis.judge.slowdown import slowdown_findings, withhold_in_a_distorted_window
from hf_distprof.analysis.judge.whatif import WHAT_TO_FIX_FIRST, what_to_fix_first
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.read.timer_records import TimerRecords
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import Finding, Undecided
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.whatif import WhatIf
from hf_distprof.core.run_verdict import by_the_timer

_FIRST = (chain.SLOW_RANK, WHAT_TO_FIX_FIRST)
"""Kinds that open the list, in this order, whatever their severity: the slow rank's chain (the cause and its phase),
then the largest saving the replay predicts. The box shows the first finding of the list, as every output orders it."""


def in_order(findings: list[Finding]) -> list[Finding]:
    """The findings as every output shows them: :data:`_FIRST`'s kinds first, then by decreasing severity (ties keep
    the order they were found in)."""
    return sorted(findings, key=lambda f: (_FIRST.index(f.kind) if f.kind in _FIRST else len(_FIRST), -f.severity))


def judge(
    ranks: list[RankResult],
    cross: CrossRankResult | None,
    options: AnalysisOptions,
    records: TimerRecords | None,
    slowdown: dict[str, Any] | None,
    timer: dict[str, Any] | None,
    answer: WhatIf | None,
) -> tuple[list[Finding], list[Undecided]]:
    """Every finding of the run, in order, and the questions it cannot decide.

    Args:
        ranks: Per-rank results, aligned and with their per-kind tables.
        cross: The cross-rank view (None for one rank).
        options: The thresholds.
        records: The step timer's records beside the traces.
        slowdown: The profiler's slowdown (:func:`hf_distprof.analysis.judge.slowdown.slowdown_of`).
        timer: The step timer's slow-rank verdict over the untraced steps, as JSON.
        answer: The what-if model's answer (None without one).

    Returns:
        The findings, in :func:`in_order`'s order, and the questions left undecided (with the findings withheld).
    """
    findings = diagnose(ranks, cross, options) + slowdown_findings(slowdown)
    # A window whose verdicts were weighed with the timer's (across_the_run) already answers for the whole run.
    weighed = cross is not None and any(by_the_timer(v) for v in (cross.imbalance_verdict, cross.straggler_verdict))
    findings, withheld = withhold_in_a_distorted_window(findings, slowdown, None if weighed else timer)
    # The slow rank's finding as one chain (its slow phase -> late at the collectives -> its peers wait).
    findings = chain.explain(findings, ranks, cross, records)
    on_gpu = any(r.device == "gpu" for r in ranks)
    backend = next((r.backend for r in ranks if r.backend), None)
    fsdp = any(c.module is not None for r in ranks for c in r.collectives)
    first = what_to_fix_first(answer, options.what_if_pct, on_gpu, backend, fsdp) if answer is not None else None
    return in_order(findings + ([first] if first is not None else [])), undecided(cross) + withheld
