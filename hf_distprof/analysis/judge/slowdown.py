"""The profiler's own slowdown as a finding, and the rank findings of a window it distorted withheld (pure)."""

from __future__ import annotations

from typing import Any

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.read.timer_records import TimerRecords
from hf_distprof.analysis.read.timing_summary import TimingSummary
from hf_distprof.analysis.results.findings import STEP_TIMER, TRACE_AND_TIMER, Finding, Undecided
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.overhead import profiler_slowdown


def slowdown_of(summary: TimingSummary, records: TimerRecords, ranks: list[RankResult],
                options: AnalysisOptions) -> dict[str, Any] | None:
    """The profiler's own slowdown: ``timing_summary.json``'s when training ended normally (with the profiler options in
    effect), else computed from the step timer's records (``timing_rank{R}.jsonl``): the steps the profiler ran over
    (the rows' marks; in older files the traces' steps) against the others, the timer's warm-up left out. None
    without them."""
    if summary.profiler_slowdown is not None:
        return summary.profiler_slowdown
    traced = {s.step for r in ranks for s in r.steps} | records.traced
    found = profiler_slowdown(records.step_times(), traced, {}, threshold_ratio=options.profiler_slowdown_threshold)
    return found.to_json() if found is not None else None


def withhold_in_a_distorted_window(
    findings: list[Finding], slowdown: dict[str, Any] | None, timer: dict[str, Any] | None
) -> tuple[list[Finding], list[Undecided]]:
    """Rank findings of a window that was not like the rest of the run, against a quiet step timer, withheld.

    When the traced steps ran materially slower than the others (the profiler's doing, or another process
    on the host) and the step timer, judging the untraced steps, names no slow rank, a straggler or
    imbalance seen in the trace describes that window, not the run: it becomes "not enough evidence".

    Returns:
        The findings kept, and the withheld ones as undecided questions.
    """
    if not slowdown or not slowdown.get("warning") or not timer or timer.get("status") == "raised":
        return findings, []
    kept, withheld = [], []
    for f in findings:
        if f.kind in ("straggler", "imbalance"):
            why = (f"the traced steps ran {float(slowdown['ratio']):.2f}x slower than the rest of the run, and over "
                   "the untraced steps the step timer names no slow rank")
            withheld.append(Undecided(
                question=f.kind,
                reason=f"{f.title} withheld: {why} ({timer.get('reason', 'quiet')})",
                why=f"{f.title} withheld: {why}",
                ranks=list(f.ranks),
                basis=TRACE_AND_TIMER,
                steps=f.steps,
            ))
        else:
            kept.append(f)
    return kept, withheld


def slowdown_findings(slowdown: dict[str, Any] | None) -> list[Finding]:
    """A finding when the profiler made the traced steps materially slower than the rest of the run."""
    if not slowdown or not slowdown.get("warning"):
        return []
    ratio = float(slowdown["ratio"])
    action = "Read the trace's absolute times with care and trust its shares more"
    return [
        Finding(
            kind="profiler_slowdown",
            severity=100.0 * (1.0 - 1.0 / ratio),
            title="The profiler slows the traced steps",
            ranks=[],
            evidence=slowdown["warning"],
            recommendation=(
                f"{action}; profile with fewer options (--profiler-record-shapes false, no --profiler-with-stack / "
                "--profiler-profile-memory unless you need them) and see PROFILING_GUIDE.md for what each option "
                "costs."
            ),
            numbers={"ratio": ratio},
            confidence=slowdown.get("confidence"),
            phase="profiler",
            why=(f"the traced steps took {ratio:.2f}x as long as the run's other steps (threshold "
                 f"{float(slowdown['threshold_ratio']):.2f}x)"),
            action=action,
            basis=STEP_TIMER,
        )
    ]


