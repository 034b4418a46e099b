"""The analysis's stages on hand-built ranks, for the tests: the step timer's figures from plain tables, the cross-rank
view and the diagnosis's findings (in words) as ``analyze`` makes them."""

from __future__ import annotations

from typing import Any

from hf_distprof.analysis.across.compare import compare
from hf_distprof.analysis.api import analyze_ranks
from hf_distprof.analysis.judge.diagnosis import diagnose as judge_diagnose
from hf_distprof.analysis.judge.verdicts import judge_ranks
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import Finding
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.run import RunInput
from hf_distprof.analysis.results.timer import TimerRecords, TimingSummary
from hf_distprof.analysis.tell.findings import write


def records(cpu_wait: dict[int, dict[int, float]] | None = None, own_work: dict[int, dict[int, float]] | None = None,
            own_step: dict[int, float] | None = None) -> TimerRecords:
    """Step-timer records (unmarked, as older files: no verdict of their own) holding these per-step figures."""
    rows: dict[int, dict[int, dict[str, Any]]] = {}
    for key, table in (("cpu_wait_s", cpu_wait or {}), ("own_work_s", own_work or {})):
        for rank, steps in table.items():
            for step, value in steps.items():
                rows.setdefault(rank, {}).setdefault(step, {"step": step})[key] = value
    for rank_rows in rows.values():
        for step, row in rank_rows.items():
            if own_step and step in own_step:
                row["own_step_s"] = own_step[step]
    return TimerRecords(rows=rows)


def cross_rank(ranks: list[RankResult], options: AnalysisOptions, cpu_wait: dict[int, dict[int, float]] | None = None,
               timer: dict[str, Any] | None = None, own_work: dict[int, dict[int, float]] | None = None,
               own_step: dict[int, float] | None = None) -> CrossRankResult | None:
    """The cross-rank view of ``ranks`` (``timer``: ``timing_summary.json``'s verdict)."""
    return analyze_ranks(ranks, options, records=records(cpu_wait, own_work, own_step),
                         summary=TimingSummary(imbalance_verdict=timer)).cross_rank


def diagnose(ranks: list[RankResult], options: AnalysisOptions) -> list[Finding]:
    """The diagnosis's findings of ``ranks``, in words, in the order found (no chain, no what-if, no slowdown). A rank
    built with its per-kind table keeps it (the across stage would compute it from the collectives)."""
    run = RunInput(files=[], records=TimerRecords(), summary=TimingSummary(), run=None)
    tables = [r.comm_by_kind for r in ranks]
    across = compare(ranks, run)
    for r, table in zip(ranks, tables):
        r.comm_by_kind = table or r.comm_by_kind
    verdicts = judge_ranks(across, run.summary, options)
    return [write(j) for j in judge_diagnose(ranks, across, verdicts, options)]


def straggler_evidence(ranks: list[RankResult], options: AnalysisOptions) -> dict[int, str]:
    """rank -> the evidence of the straggler finding naming it (the diagnosis's, before the slow rank's chain)."""
    return {f.ranks[0]: f.evidence for f in diagnose(ranks, options) if f.kind == "straggler"}
