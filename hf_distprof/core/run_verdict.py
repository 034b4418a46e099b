"""One judge for "which rank holds the others back": the step timer's verdict over the run, the window one sample.

The step timer times every step of the run at a small cost and judges the untraced ones at train end
(:func:`hf_distprof.core.verdicts.judge_own_work`, the live verdict); the trace analysis judges the few traced steps
again, in more detail. The two used to be weighed as equals, and a quiet window could silence a timer that named a
rank across the whole run. Here the run decides: when the timer reached a verdict of its own (``raised`` or
``quiet``), the answer is the timer's, and the window's verdict is kept beside it as one more sample, its
agreement or disagreement stated. Only when the timer could not decide (too few untraced steps) or is absent does the
window's verdict, weighed with it (:func:`hf_distprof.core.verdicts.across_the_run`), stand.

Torch-free. The live timer's verdict at train end is :func:`hf_distprof.core.verdicts.judge_own_work` over the same
untraced steps with the same rule, so that the live table and ``hf-distprof analyze`` say the same thing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from hf_distprof.core.verdicts import QUIET, RAISED, UNDECIDED, SlowRankVerdict

TIMER_TEST = "step timer"
"""Named in the ``test`` of a verdict whose answer is the step timer's over the run (what ``--json`` shows); the
analysis decides on its own typed record of that (:class:`hf_distprof.analysis.results.findings.Basis`), never on
this text."""


def verdict_from_json(doc: Mapping[str, Any] | None) -> SlowRankVerdict | None:
    """A verdict written by :meth:`SlowRankVerdict.to_json` (``timing_summary.json``'s ``imbalance_verdict``), or None
    when it is absent or malformed (a field of the wrong type, p outside [0, 1], no step, a rank that is not an
    int): a file edited by hand is then ignored, as an unreadable one is."""
    if not isinstance(doc, Mapping):
        return None
    fields = {f.name: f for f in dataclasses.fields(SlowRankVerdict) if f.init}
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in doc:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return None
            continue
        values[name] = doc[name]
    status, rank, steps, p = values["status"], values["rank"], values["steps"], values["p_value"]
    if status not in (RAISED, QUIET, UNDECIDED) or (rank is not None and (isinstance(rank, bool)
                                                                           or not isinstance(rank, int))):
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        return None
    for key in ("effect_pct", "threshold_pct", "noise_pct", "p_value", "effect_abs"):
        v = values.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
    if not 0.0 <= p <= 1.0 or not all(isinstance(values.get(k, ""), str) for k in ("reason", "gate", "test", "claim")):
        return None
    for key in ("slowest_in", "ranks", "min_steps"):
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int):
            return None
    if not all(isinstance(v, list) for v in (values.get("also", []), values.get("per_step_excess_pct", []))):
        return None
    try:
        return SlowRankVerdict(**values)
    except TypeError:
        return None


def decided(run: SlowRankVerdict | None) -> bool:
    """Whether the step timer reached a verdict of its own over the run: ``raised`` or ``quiet``, with a candidate,
    over at least as many steps as any verdict needs with its ranks (fewer: the window is weighed with it instead)."""
    return run is not None and run.status in (RAISED, QUIET) and run.rank is not None and run.steps >= run.min_steps


def agrees(window: SlowRankVerdict, run: SlowRankVerdict) -> bool:
    """Whether the traced window's own verdict says what the run's says: the same status, and the same rank when one
    is named; a window too short to decide (``undecided``) contradicts nothing."""
    if window.status == UNDECIDED:
        return True
    return window.raised == run.raised and (not run.raised or window.rank == run.rank)


def follow_the_run(window: SlowRankVerdict, run: SlowRankVerdict) -> SlowRankVerdict:
    """The answer when the step timer decided: its status, rank and figures, the window's verdict stated beside them.

    Args:
        window: The traced window's own verdict (the trace analysis's).
        run: The step timer's verdict over the run's untraced steps (:func:`decided`).

    Returns:
        The run's verdict, its ``reason`` saying what the timer found over how many steps and what the window alone
        says (agreeing or not), its ``test`` ending with :data:`TIMER_TEST`.
    """
    same = agrees(window, run)
    window_says = (f"the traced window ({window.steps} step{'s' if window.steps != 1 else ''}) "
                   + ("agrees" if same else "alone says otherwise") + f": {window.reason or window.claim or 'nothing'}")
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.init}
    fields.update(
        test=f"{run.test}, {TIMER_TEST}",
        reason=f"over the run's {run.steps} untraced steps the step timer says: {run.reason}; {window_says}",
        to_decide="",
    )
    return SlowRankVerdict(**fields)
