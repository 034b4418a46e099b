"""The traced window against the run (pure): where the window's own slow-rank verdict disagrees with the answer, which
follows the run's other steps (:mod:`hf_distprof.core.run_verdict`), say so, with the window's steps against the
untraced ones, step by step."""

from __future__ import annotations

from statistics import median
from typing import Any

from hf_distprof.analysis.results.across import RankVerdicts, TimerFigures
from hf_distprof.analysis.results.facts import WindowFacts
from hf_distprof.analysis.results.findings import STEP_TIMER
from hf_distprof.core.overhead import beyond_noise
from hf_distprof.core.run_verdict import agrees


def window_notes(verdicts: RankVerdicts, timer: TimerFigures, traced: set[int],
                 slowdown: dict[str, Any] | None) -> list[WindowFacts]:
    """One note per slow-rank question whose answer follows the run (the step timer decided it) while the traced
    window alone said otherwise.

    Args:
        verdicts: The slow-rank verdicts (the answers and the window's own).
        timer: The step timer's figures (the traced steps' own times).
        traced: The steps the window's verdict judged (every rank traced them).
        slowdown: The profiler's slowdown (its reference: the median untraced step; the run's noise).
    """
    steps = [1e3 * timer.step_times[s] for s in sorted(traced) if s in timer.step_times]
    ref = slowdown.get("median_step_s_reference") if slowdown else None
    untraced = 1e3 * float(ref) if isinstance(ref, (int, float)) else None
    noise = slowdown.get("noise_pct") if slowdown else None
    noise_pct = float(noise) if isinstance(noise, (int, float)) else None
    ratio = median(steps) / untraced if steps and untraced else None
    beyond = ratio is not None and noise_pct is not None and beyond_noise(ratio, noise_pct)
    out = []
    for question, final, window, basis in (
            ("straggler", verdicts.straggler, verdicts.straggler_window, verdicts.straggler_basis),
            ("imbalance", verdicts.imbalance, verdicts.imbalance_window, verdicts.imbalance_basis)):
        if final is None or window is None or basis != STEP_TIMER or agrees(window, final) or not window.steps:
            continue
        out.append(WindowFacts(question, window, final, steps, untraced, noise_pct, ratio, beyond))
    return out
