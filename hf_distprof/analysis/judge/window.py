"""The traced window against the run (pure): where the window's own slow-rank verdict disagrees with the answer, which
follows the run's other steps (:mod:`hf_distprof.core.run_verdict`), say so, with the window's steps against the
untraced ones, step by step."""

from __future__ import annotations

from statistics import median
from typing import Any

from hf_distprof.analysis.read.timer_records import TimerRecords
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import WindowNote
from hf_distprof.core.run_verdict import TIMER_TEST, agrees


def window_notes(cross: CrossRankResult | None, records: TimerRecords | None, traced: set[int],
                 slowdown: dict[str, Any] | None) -> list[WindowNote]:
    """One note per slow-rank question whose answer follows the run while the traced window alone said otherwise.

    Args:
        cross: The cross-rank view (its final and its window verdicts).
        records: The step timer's records (the traced steps' own times).
        traced: The steps of the traces.
        slowdown: The profiler's slowdown (its reference: the median untraced step).
    """
    if cross is None:
        return []
    times = records.step_times() if records is not None else {}
    steps = [1e3 * times[s] for s in sorted(traced) if s in times]
    ref = slowdown.get("median_step_s_reference") if slowdown else None
    untraced = 1e3 * float(ref) if isinstance(ref, (int, float)) else None
    out = []
    for question, final, window in (("straggler", cross.straggler_verdict, cross.straggler_window),
                                    ("imbalance", cross.imbalance_verdict, cross.imbalance_window)):
        if final is None or window is None or not final.test.endswith(TIMER_TEST) or agrees(window, final):
            continue
        said = (f"rank {final.rank} is slow across the run" if final.raised
                else f"no rank is slow across the run ({final.claim or final.status})")
        distortion = ""
        if steps and untraced:
            ratio = median(steps) / untraced
            distortion = (f"; its steps took {', '.join(f'{t:.0f}' for t in steps)} ms against a median {untraced:.0f} "
                          f"ms untraced ({ratio:.2f}x)")
            noise = slowdown.get("noise_pct") if slowdown else None
            if isinstance(noise, (int, float)) and abs(100.0 * (ratio - 1.0)) > noise:
                distortion += ", beyond the run's own noise: the profiler's cost and the host's load weigh on them"
        text = (f"The traced window alone says otherwise ({question}): {window.reason}; over the run's "
                f"{final.steps} untraced steps the step timer says {said}, and the verdict follows the run"
                + distortion)
        out.append(WindowNote(question, window.status, window.rank, final.status, final.rank, window.reason,
                              steps, untraced, text))
    return out
