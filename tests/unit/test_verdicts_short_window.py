"""A traced window too short for a slow-rank verdict of its own, weighed with the step timer's verdict over the run's
other steps (``run_verdict.across_the_run`` on an ``undecided`` window): named only when both lean to the same rank and
the combined test is below alpha; quiet when the timer judged enough steps and does not bear the rank out; "not enough
evidence" only when neither source can decide, saying what would."""

from __future__ import annotations

import pytest

from hf_distprof.core.stats import fisher_p

from hf_distprof.core.run_verdict import across_the_run
from hf_distprof.core.verdicts import judge_slow_rank

# Rank 1 is 25% slower than rank 0 in each of 3 traced steps (a little noise): undecided, 2 ranks need 6 steps.
WINDOW = {0: [100.0, 102.0, 98.0], 1: [125.0, 128.0, 124.0]}
TIMER = {"status": "raised", "rank": 1, "p_value": 0.0001, "steps": 16, "effect_pct": 24.0, "reason": "T"}
CLAIM = "rank 1's its work exceeds its peers' by a median 25.5%"
SHORT = "it is the slowest in 3 of 3 traced steps, too few to decide alone (at least 6 with 2 ranks)"
DECIDE = ("to decide, trace at least 6 steps (--profiler-active-steps 6) or keep the step timer on "
          "(--enable-step-timing, on with --enable-profiling) over more steps")


def window():
    v = judge_slow_rank(WINDOW, 10.0)
    assert (v.status, v.rank, v.steps, v.min_steps, v.p_value, v.claim) == ("undecided", 1, 3, 6, 0.125, CLAIM)
    # Excess 25.0, 25.5, 26.5%: median 26/102; noise the median (here: mean) of 2/100 and 1/125 scaled MADs.
    assert v.effect_pct == 100 * 26 / 102 and v.noise_pct == pytest.approx(1.4826 * (2 / 100 + 1 / 125) / 2 * 100)
    return v


def test_a_short_window_is_named_with_a_timer_that_names_the_same_rank():
    v = across_the_run(window(), TIMER)
    both = fisher_p(0.125, 0.0001)
    assert (v.status, v.rank, v.gate, v.p_value, v.steps) == ("raised", 1, "", both, 3)
    assert v.test == "binomial + step timer"
    assert v.confidence == 1.0 - both and both < 0.02
    assert v.reason == (f"{CLAIM} in the traced window (threshold 10%, step-to-step noise 2.1%); {SHORT}; over the "
                        f"run's 16 untraced steps the step timer says: T (p = 0.000 for rank 1); together p = "
                        f"{both:.4f} (Fisher): slow across the run")


def test_a_timer_that_judged_enough_steps_and_names_nobody_makes_it_quiet():
    v = across_the_run(window(), {**TIMER, "status": "quiet", "p_value": 0.4})
    both = fisher_p(0.125, 0.4)
    assert (v.status, v.gate, v.p_value) == ("quiet", "outside", both)
    assert v.reason == (f"{CLAIM} in the traced window (threshold 10%), but {SHORT}; over the run's 16 untraced steps "
                        "the step timer says: T (p = 0.400 for rank 1); the step timer does not name rank 1 over the "
                        "run: not a slow rank across the run")
    # A timer naming the other rank: 1 - p for rank 1, quiet.
    other = across_the_run(window(), {**TIMER, "rank": 0})
    assert (other.status, other.gate, other.p_value) == ("quiet", "outside", fisher_p(0.125, 1.0 - 0.0001))
    # A timer that names rank 1 but only leans (p 0.2): not below alpha together.
    weak = across_the_run(window(), {**TIMER, "p_value": 0.2})
    assert (weak.status, weak.gate) == ("quiet", "outside")
    assert weak.reason.endswith(f"together p = {fisher_p(0.125, 0.2):.3f} (Fisher), not below 0.02: not a slow rank "
                                "across the run")


def test_the_window_must_lean_the_same_way_beyond_its_noise():
    # Rank 1 slowest in 2 of 4 steps (half is not most), its median excess still 17.5%: the timer cannot complete it.
    mixed = judge_slow_rank({0: [100.0] * 4, 1: [150.0, 130.0, 95.0, 105.0]}, 10.0)
    assert (mixed.status, mixed.rank, mixed.slowest_in, mixed.effect_pct) == ("undecided", 1, 3, 17.5)
    half = judge_slow_rank({0: [100.0] * 4, 1: [150.0, 130.0, 95.0, 95.0]}, 10.0)
    assert (half.status, half.rank, half.slowest_in, half.effect_pct) == ("undecided", 1, 2, 12.5)
    v = across_the_run(half, TIMER)
    assert (v.status, v.gate) == ("quiet", "outside")
    assert "the window's candidate is the slowest in only 2 of its 4 steps: not a slow rank across the run" in v.reason
    assert across_the_run(mixed, TIMER).status == "raised"  # 3 of 4 is most
    # An excess within the window's own noise: quiet, and so it says.
    noisy = judge_slow_rank({0: [100.0, 80.0, 120.0], 1: [112.0, 96.0, 140.0]}, 10.0)
    assert (noisy.status, noisy.slowest_in) == ("undecided", 3) and noisy.effect_pct <= noisy.noise_pct
    n = across_the_run(noisy, TIMER)
    assert (n.status, n.gate) == ("quiet", "outside") and "within its own step-to-step noise" in n.reason
    # ... unless the figure is the timer's own (pool_effect): the run's 19 steps, weighted, clear the noise.
    timer = {**TIMER, "effect_pct": 40.0}
    pooled = across_the_run(noisy, timer, pool_effect=True)
    mean = (3 * noisy.effect_pct + 16 * 40.0) / 19
    assert (pooled.status, pooled.effect_pct) == ("raised", mean) and mean > noisy.noise_pct
    assert (f"over the run's 19 judged steps its excess is {mean:.1f}% (the traced window's {noisy.effect_pct:.1f}% "
            "weighted with the step timer's 40.0%)") in pooled.reason
    # A pooled effect still within the window's noise (24% over 19 steps): quiet.
    assert across_the_run(noisy, TIMER, pool_effect=True).status == "quiet"


def test_not_enough_evidence_only_when_neither_source_can_decide_and_it_says_what_would():
    v = across_the_run(window(), {**TIMER, "status": "undecided", "p_value": 0.25, "steps": 2, "reason": "U"})
    assert (v.status, v.gate, v.test) == ("undecided", "", "binomial + step timer")
    assert v.reason == (f"not enough evidence: {CLAIM} in the traced window (threshold 10%), but {SHORT}, and over "
                        f"the run's 2 untraced steps the step timer says: U (p = 0.250 for rank 1); {DECIDE}")
    alone = across_the_run(window(), None)
    assert (alone.status, alone.p_value, alone.test) == ("undecided", 0.125, "binomial")
    assert alone.reason == (f"not enough evidence: {CLAIM} in the traced window (threshold 10%), but {SHORT}, and "
                            "no step timer records of the run's other steps are beside the traces "
                            f"(timing_rank{{R}}.jsonl); {DECIDE}")


@pytest.mark.parametrize("bad", [
    {**TIMER, "status": "maybe"}, {**TIMER, "rank": True}, {**TIMER, "rank": "1"}, {**TIMER, "steps": 0},
    {**TIMER, "steps": 2.0}, {**TIMER, "p_value": 1.5}, {**TIMER, "p_value": None}, {**TIMER, "p_value": False},
])
def test_a_malformed_timer_verdict_counts_as_none(bad):
    assert across_the_run(window(), bad) == across_the_run(window(), None)


def test_a_window_with_enough_steps_is_unchanged_by_the_short_window_rule():
    # Six steps decide alone: raised, and the timer's quiet verdict then takes it back (the existing rule).
    six = judge_slow_rank({0: WINDOW[0] * 2, 1: WINDOW[1] * 2}, 10.0)
    assert six.status == "raised"
    assert across_the_run(six, {**TIMER, "status": "quiet", "p_value": 0.5}).gate == "outside"
    assert across_the_run(six, None) is six
