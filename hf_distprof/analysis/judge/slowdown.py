"""The profiler's own slowdown as a finding, and the rank findings of a window it distorted withheld; the findings that
weigh the ranks against each other withheld when some ranks' traces could not be read (pure)."""

from __future__ import annotations

from typing import Any

from hf_distprof.analysis.options import PROFILER_SLOWDOWN_THRESHOLD, AnalysisOptions
from hf_distprof.analysis.results.across import TimerFigures
from hf_distprof.analysis.results.facts import Coverage, QuietSlowdown, Question, SlowdownFacts
from hf_distprof.analysis.results.findings import STEP_TIMER, TRACE, TRACE_AND_TIMER, Judgement
from hf_distprof.analysis.results.timer import TimingSummary
from hf_distprof.core.overhead import beyond_noise, profiler_slowdown


def slowdown_of(summary: TimingSummary, timer: TimerFigures, traced: set[int],
                options: AnalysisOptions, host_timed: bool = True) -> dict[str, Any] | None:
    """The profiler's own slowdown: ``timing_summary.json``'s when training ended normally (with the profiler options in
    effect), judged at the run's own threshold; judged again from the step timer's records (``timing_rank{R}.jsonl``)
    when ``options.profiler_slowdown_threshold`` names another, or without the summary's: the steps the profiler ran
    over (the rows' marks and the traces' steps) against the others, the timer's warm-up left out. None without
    them. ``host_timed``: whether the step timer timed the host (no GPU trace), where it measured each rank's wait for a
    CPU."""
    done = summary.profiler_slowdown
    threshold = options.profiler_slowdown_threshold
    if done is not None and (threshold is None or done.get("threshold_ratio") == threshold or not timer.step_times):
        return done
    profiled = done.get("options") if done is not None else None  # the cost the warning names: the run's options
    # The wait for a CPU of the rank last to the sync, in the steps every rank's rows part (as the step timer's own);
    # none where the timer timed a GPU (its rows' own work is their pre-sync time: no wait taken out).
    steps = set.intersection(*(set(by_step) for by_step in timer.parts.values())) if timer.parts and host_timed \
        else set()
    inside = traced | timer.marked_traced
    first = min(timer.step_times, default=0)  # (a traced step with no judged time after the first: after a pause)
    found = profiler_slowdown(timer.step_times, inside,
                              profiled if isinstance(profiled, dict) else {},
                              threshold_ratio=threshold if threshold is not None else PROFILER_SLOWDOWN_THRESHOLD,
                              cpu_wait={s: max(p[s] for p in timer.parts.values())[1] for s in steps},
                              left_out=sorted(s for s in inside if s > first and s not in timer.step_times))
    return found.to_json() if found is not None else None


def raised(slowdown: dict[str, Any] | None) -> bool:
    """Whether the profiler's slowdown is a finding: the step timer decided it at train end and wrote its warning
    (``timing_summary.json``), or :func:`slowdown_of` judged it from the records the same way."""
    return bool(slowdown) and bool(slowdown.get("warning"))


def quiet_slowdown(slowdown: dict[str, Any] | None) -> QuietSlowdown | None:
    """The profiler's slowdown when it raised no finding: its ratio, and whether it lies within the run's own noise;
    or why there is no ratio. None when it raised one, or without a slowdown."""
    if not slowdown or raised(slowdown):
        return None
    ratio, noise = slowdown.get("ratio"), slowdown.get("noise_pct")
    ratio = float(ratio) if ratio is not None else None
    noise = float(noise) if isinstance(noise, (int, float)) else None
    threshold = float(slowdown["threshold_ratio"])
    within = ratio is not None and noise is not None and not beyond_noise(ratio, noise)
    above = ratio is not None and ratio > threshold
    inside, left_out = slowdown.get("steps_inside"), slowdown.get("steps_left_out")
    return QuietSlowdown(
        threshold_ratio=threshold,
        ratio=ratio,
        note=slowdown.get("note") if isinstance(slowdown.get("note"), str) else None,
        noise_pct=noise,
        within_noise=within,
        noise_only=within and above,
        below_threshold=ratio is not None and not above,
        steps_inside=inside if isinstance(inside, int) else None,
        steps_before=int(slowdown.get("steps_before") or 0),
        steps_after=int(slowdown.get("steps_after") or 0),
        steps_left_out=[s for s in left_out if isinstance(s, int)] if isinstance(left_out, list) else [],
    )


def withhold_in_a_distorted_window(
    findings: list[Judgement], slowdown: dict[str, Any] | None, timer: dict[str, Any] | None
) -> tuple[list[Judgement], list[Question]]:
    """Rank findings of a window that was not like the rest of the run, against a quiet step timer, withheld.

    When the traced steps ran materially slower than the others (the profiler's doing, or another process
    on the host) and the step timer, judging the untraced steps, names no slow rank, a straggler or
    imbalance seen in the trace describes that window, not the run: it becomes "not enough evidence".

    Returns:
        The findings kept, and the withheld ones as undecided questions.
    """
    if not raised(slowdown) or not timer or timer.get("status") == "raised":
        return findings, []
    kept, withheld = [], []
    for f in findings:
        if f.kind in ("straggler", "imbalance"):
            withheld.append(Question(question=f.kind, ranks=list(f.ranks), basis=TRACE_AND_TIMER, steps=f.steps,
                                     withheld=f, ratio=float(slowdown["ratio"]),
                                     timer_reason=str(timer.get("reason", "quiet"))))
        else:
            kept.append(f)
    return kept, withheld


def slowdown_findings(slowdown: dict[str, Any] | None) -> list[Judgement]:
    """A finding when the profiler made the traced steps materially slower than the rest of the run."""
    if not raised(slowdown):
        return []
    assert slowdown is not None
    ratio = float(slowdown["ratio"])
    return [
        Judgement(
            kind="profiler_slowdown",
            severity=100.0 * (1.0 - 1.0 / ratio),
            ranks=[],
            facts=SlowdownFacts(ratio, float(slowdown["threshold_ratio"]), slowdown["warning"], slowdown.get("cost")),
            numbers={"ratio": ratio},
            confidence=slowdown.get("confidence"),
            phase="profiler",
            basis=STEP_TIMER,
        )
    ]


PEER_DEPENDENT = ("communication_bound", "slow_resume", "waiting_for_peers", "straggler", "imbalance",
                  "fsdp_exposed_all_gather", "fsdp_exposed_reduce_scatter")
"""The findings whose evidence is the ranks' traces against each other: a rank's time in a collective split into waiting
for its peers, the transfer and its lag past the completion; the latest or busiest rank in the traced window."""


def withhold_without_every_rank(
    findings: list[Judgement], missing: list[int], replayed: bool, coverage: Coverage | None = None,
    ended: dict[int, str] | None = None,
) -> tuple[list[Judgement], list[Question]]:
    """With the traces of some of the run's ranks not read (``missing``: not given, truncated, lost), the findings that
    weigh the ranks' traces against each other withheld, and the what-if replay (``replayed``): the ranks read waited
    for the missing ones inside their collectives, and that wait reads as the transfer (a 2-rank run with rank 0's
    trace truncated said "What to fix first: exposed communication hidden, 56.5%" from rank 1's wait for rank 0).
    What the step timer decided over the run (every rank's records) stays, as do one rank's own findings (GPU
    utilisation, data loading, launch-bound, the profiler's slowdown).

    ``ended``: the missing ranks that died (``crashed``: a crash file; ``unfinished``), said as such.

    ``coverage``: ranks that took no window by choice (``--profile-ranks``) while the waits for them may matter
    (:func:`hf_distprof.analysis.judge.coverage.unmeasured`): withheld alike, and said so.

    Returns:
        The findings kept, and the withheld ones as undecided questions (the replay's last).
    """
    if not missing and coverage is None:
        return findings, []
    why = {"missing": list(missing), "coverage": coverage, "ended": dict(ended or {})}
    kept, withheld = [], []
    for f in findings:
        if f.kind in PEER_DEPENDENT and f.basis == TRACE:
            withheld.append(Question(question=f.kind, ranks=list(f.ranks), basis=f.basis, steps=f.steps, withheld=f,
                                     **why))
        else:
            kept.append(f)
    if replayed:
        withheld.append(Question(question="what_if", ranks=[], basis=TRACE, steps=None, **why))
    return kept, withheld
