"""One judge for "which rank holds the others back": the step timer's verdict over the run, the window one sample.

The step timer times every step of the run at a small cost and judges the untraced ones at train end
(:func:`hf_distprof.core.verdicts.judge_own_work`, the live verdict); the trace analysis judges the few traced steps
again, in more detail. The two used to be weighed as equals, and a quiet window could silence a timer that named a
rank across the whole run. Here the run decides: when the timer reached a verdict of its own (``raised`` or
``quiet``), the answer is the timer's, and the window's verdict is kept beside it as one more sample, its
agreement or disagreement stated. Only when the timer could not decide (too few untraced steps) or is absent does the
window's verdict, weighed with it (:func:`across_the_run`), stand.

Torch-free. The live timer's verdict at train end is :func:`hf_distprof.core.verdicts.judge_own_work` over the same
untraced steps with the same rule, so that the live table and ``hf-distprof analyze`` say the same thing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from hf_distprof.core.stats import ALPHA, fisher_p
from hf_distprof.core.verdicts import MOST, QUIET, RAISED, UNDECIDED, SlowRankVerdict

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
    cost = values.get("cost_pct")  # (None: no step times; a severity is made of it)
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost)):
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
    # An undecided window neither agrees nor disagrees: its figures may lean either way, too few steps to tell.
    # Agreeing that no rank is slow says so: the window's candidate may be another rank than the run's (two quiet
    # verdicts naming ranks 1 and 0 read as "agrees: rank 0's ..." beside "rank 1's ...").
    said = ("alone decides nothing" if window.status == UNDECIDED or not window.steps  # (no step every rank traced)
            else "alone says otherwise" if not agrees(window, run)
            else "agrees" if run.raised or window.rank == run.rank else "agrees that no rank is slow")
    window_says = (f"the traced window ({window.steps} step{'s' if window.steps != 1 else ''}) {said}: "
                   f"{window.reason or window.claim or 'nothing'}")
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.init}
    fields.update(
        test=f"{run.test}, {TIMER_TEST}",
        reason=f"over the run's {run.steps} untraced steps the step timer says: {run.reason}; {window_says}",
        to_decide="",
    )
    return SlowRankVerdict(**fields)


def the_run_alone(run: SlowRankVerdict, traced: list[int]) -> SlowRankVerdict:
    """The answer when the step timer decided and the traces cannot weigh in: they hold ``traced`` only (fewer than 2
    ranks, ``--profile-ranks``), so no window verdict across ranks exists to state beside it."""
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.init}
    held = f"only rank {traced[0]}'s" if len(traced) == 1 else "no rank's"
    fields.update(test=f"{run.test}, {TIMER_TEST}", to_decide="",
                  reason=f"over the run's {run.steps} untraced steps the step timer says: {run.reason}; the traces "
                         f"hold {held} steps: no window verdict across ranks")
    return SlowRankVerdict(**fields)


def across_the_run(
    window: SlowRankVerdict, outside: Mapping[str, Any] | None, pool_effect: bool = False
) -> SlowRankVerdict:
    """:func:`weigh_with_the_run`'s verdict alone."""
    return weigh_with_the_run(window, outside, pool_effect)[0]


def weigh_with_the_run(
    window: SlowRankVerdict, outside: Mapping[str, Any] | None, pool_effect: bool = False
) -> tuple[SlowRankVerdict, bool]:
    """A traced window's verdict, weighed with the step timer's verdict over the run's other steps.

    The window holds a few steps; the step timer judged the untraced ones with the same rules. The two look at
    disjoint steps, so their persistence tests are independent and their p-values combine (Fisher's method,
    :func:`fisher_p`). The window still decides the effect (threshold, noise, materiality); whether the rank is
    slow *across the run* is decided by the window's p for its candidate together with the timer's p for that
    same rank: the timer's own p when that rank is its candidate too; with 2 ranks, ``1 - p`` when the timer
    leans to the other rank; with more, 1 (no support). Against ``alpha``:

    - a rank slow in the window but not outside it is not named: 6 of 6 in the window (p = 0.016) against a
      timer that sees nothing (p = 0.5) is p = 0.047 together (gate ``outside``);
    - a window too short to show persistence on its own, slowest in 5 of 6 (p = 0.031), is completed by a
      timer that names the same rank (p = 0.001): p = 0.0004 together. A timer that only leans that way
      (quiet, its effect under the threshold) does not complete it.

    Only a window that passed every other gate is reconsidered: ``raised``, or ``quiet`` at the persistence
    gate with the rank slowest in most of its steps. With ``pool_effect`` (the window's figure is the one the
    timer judged: own work against the peers'), a window quiet at the threshold or the noise gate is
    reconsidered too when the timer names the same rank: the effect is then the steps-weighted mean of the two
    medians, over all the run's judged steps. Six traced steps put a rank slowed by 15% anywhere between 8% and
    29% (the scenario suite); the run's 18 steps together are what to hold against the threshold. The pooled
    effect must clear the threshold and the window's own noise, and the window must still lean the same way
    (slowest in most of its steps, combined p below ``alpha``); else the window stays as it was.

    Args:
        window: The verdict over the traced steps.
        outside: ``timing_summary.json``'s ``imbalance_verdict`` (status, rank, ranks, p_value, steps, reason,
            and effect_pct for ``pool_effect``); a missing or malformed one leaves ``window`` as it is.
        pool_effect: Whether ``window`` and ``outside`` measure the same figure, so that their effects pool.

    Returns:
        ``window``, or a new verdict whose p-value and reason are the combined ones; and whether the step timer's
        verdict was weighed in (then the verdict's ``test`` ends with "+ step timer"): a verdict resting on the trace
        and the timer, not on the window alone.
    """
    timer_fields = _timer_fields(outside)
    if window.status == UNDECIDED and window.rank is not None:
        return _short_window(window, timer_fields, pool_effect), timer_fields is not None
    if timer_fields is None or window.rank is None:
        return window, False
    below = pool_effect and window.status == QUIET and window.gate in ("threshold", "floor", "noise")
    if not (window.raised or (window.status == QUIET and window.gate == "persistence") or below):
        return window, False
    status, rank, p, steps, effect, said = timer_fields
    pooled = ""
    if below:
        if status != RAISED or rank != window.rank or effect is None:
            return window, False
        mean = (window.steps * window.effect_pct + steps * effect) / (window.steps + steps)
        if not mean > max(window.threshold_pct, window.noise_pct):  # also False for NaN
            return window, False
        pooled = (f"; over the run's {window.steps + steps} judged steps its excess is {mean:.1f}% (the traced "
                  f"window's {window.effect_pct:.1f}% weighted with the step timer's {effect:.1f}%), above "
                  f"the {window.threshold_pct:g}% threshold and the window's noise ({window.noise_pct:.1f}%)")
    p_same = p if rank == window.rank else (1.0 - p if window.ranks == 2 else 1.0)
    both = fisher_p(window.p_value, p_same)
    timer = f"over the run's {steps} untraced steps the step timer says: {said} ({_p_for(p_same, window.rank, rank)})"
    fields = {k: getattr(window, k) for k in window.__dataclass_fields__ if k != "confidence"}
    fields.update(p_value=both, test=f"{window.test} + step timer")
    # To turn a window that alone is not persistent into a finding, the timer must name the same rank itself
    # (effect above the threshold outside the window too): a timer merely leaning that way is not enough, as
    # rank 0's own small extra work (logging, the progress bar) leans every clean run's timer a little.
    completes = window.raised or (status == RAISED and rank == window.rank)
    if both < ALPHA and window.slowest_in > MOST * window.steps and completes:
        if below:
            fields.update(effect_pct=mean)
        fields.update(status=RAISED, gate="", reason=(
            f"{window.reason}{'' if window.raised else ' in the traced window alone'}; {timer}{pooled}; together "
            f"p = {both:.4f} (Fisher): slow across the run"))
    elif below:
        return window, False
    else:
        fields.update(status=QUIET, gate="outside" if window.raised else window.gate, reason=(
            f"{window.reason}; but {timer}; together p = {both:.3f} (Fisher), not below {ALPHA:g}: slow in "
            "the traced window, not across the run"))
    return SlowRankVerdict(**fields), True


TIMER_FILES = "timing_rank{R}.jsonl"


def _p_for(p: float, window_rank: int | None, timer_rank: int | None) -> str:
    """"p = 0.001 for rank 1"; where the timer's candidate is another rank, whose p it is: "for the window's rank 0,
    p = 0.500" (a reason naming rank 1's excess then read "(p = 0.500 for rank 0)")."""
    if timer_rank is None or timer_rank == window_rank:
        return f"p = {p:.3f} for rank {window_rank}"
    return f"for the window's rank {window_rank}, p = {p:.3f}"


def _timer_fields(outside: Mapping[str, Any] | None) -> tuple[str, int, float, int, float | None, str] | None:
    """(status, rank, p, steps, effect or None, reason) of a usable step-timer verdict; None when it is absent or
    malformed (a field missing or of the wrong type, p outside [0, 1], no step)."""
    if not isinstance(outside, Mapping):
        return None
    status, rank, p, steps, effect = (outside.get(k) for k in ("status", "rank", "p_value", "steps", "effect_pct"))
    if status not in (RAISED, QUIET, UNDECIDED) or isinstance(rank, bool) or not isinstance(rank, int):
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        return None
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        return None
    number = None
    if not isinstance(effect, bool) and isinstance(effect, (int, float)) and math.isfinite(effect):
        number = float(effect)
    said = outside.get("reason") if isinstance(outside.get("reason"), str) else status
    return str(status), rank, float(p), steps, number, str(said)


def _short_window(
    window: SlowRankVerdict, timer: tuple[str, int, float, int, float | None, str] | None, pool_effect: bool
) -> SlowRankVerdict:
    """A window too short for a verdict of its own (fewer steps than ``min_steps``), weighed with the step timer.

    The window's effect already cleared the threshold and materiality (:func:`judge_slow_rank` checks those
    before the steps); what it cannot show alone is persistence. The run's other steps can: the rank is named
    when the step timer names the same rank over them, the window leans the same way (its candidate is the
    slowest in most of its steps, its effect above its own step-to-step noise, or, with ``pool_effect``, the
    steps-weighted mean of the two effects above both), and Fisher's combination of the two p-values is below
    ``alpha``. A timer that judged enough steps and does not bear the rank out makes the answer ``quiet``
    (gate ``outside``); "not enough evidence" remains only when the timer could not decide either, or is not
    there, and then the reason says what would decide it.
    """
    fields = {k: getattr(window, k) for k in window.__dataclass_fields__ if k != "confidence"}
    n, need, t = window.steps, window.min_steps, window.threshold_pct
    short = (f"it is the slowest in {window.slowest_in} of {n} traced steps, too few to decide alone (at least "
             f"{need} with {window.ranks} ranks)")
    more = (f"trace at least {need} steps (--profiler-active-steps {need}) or keep the step timer on "
            "(--enable-step-timing, on with --enable-profiling) over more steps")
    decide = f"to decide, {more}"
    undecided = f"not enough evidence: {window.claim} in the traced window (threshold {t:g}%), but {short}"
    if timer is None:
        fields["reason"] = (f"{undecided}, and no step timer records of the run's other steps are beside the traces "
                            f"({TIMER_FILES}); {decide}")
        fields["to_decide"] = more
        return SlowRankVerdict(**fields)
    status, rank, p, steps, effect, said = timer
    p_same = p if rank == window.rank else (1.0 - p if window.ranks == 2 else 1.0)
    both = fisher_p(window.p_value, p_same)
    said_timer = (f"over the run's {steps} untraced steps the step timer says: {said} "
                  f"({_p_for(p_same, window.rank, rank)})")
    fields.update(p_value=both, test=f"{window.test} + step timer")
    if status == UNDECIDED:
        fields["reason"] = f"{undecided}, and {said_timer}; {decide}"
        fields["to_decide"] = more
        return SlowRankVerdict(**fields)
    names = status == RAISED and rank == window.rank
    leans = window.slowest_in > MOST * n
    clear = window.effect_pct > window.noise_pct
    pooled = ""
    if names and not clear and pool_effect and effect is not None:
        mean = (n * window.effect_pct + steps * effect) / (n + steps)
        if mean > max(t, window.noise_pct):
            clear, fields["effect_pct"] = True, mean
            pooled = (f"; over the run's {n + steps} judged steps its excess is {mean:.1f}% (the traced window's "
                      f"{window.effect_pct:.1f}% weighted with the step timer's {effect:.1f}%)")
    noise = f"step-to-step noise {window.noise_pct:.1f}%"
    if names and clear and leans and both < ALPHA:
        fields.update(status=RAISED, gate="", reason=(
            f"{window.claim} in the traced window (threshold {t:g}%, {noise}); {short}; {said_timer}{pooled}; "
            f"together p = {both:.4f} (Fisher): slow across the run"))
        return SlowRankVerdict(**fields)
    if not names:
        why = f"the step timer does not name rank {window.rank} over the run"
    elif not clear:
        why = "the window's excess is within its own " + noise
    elif not leans:
        why = f"the window's candidate is the slowest in only {window.slowest_in} of its {n} steps"
    else:
        why = f"together p = {both:.3f} (Fisher), not below {ALPHA:g}"
    fields.update(status=QUIET, gate="outside", reason=(
        f"{window.claim} in the traced window (threshold {t:g}%), but {short}; {said_timer}; {why}: not a slow rank "
        "across the run"))
    return SlowRankVerdict(**fields)
