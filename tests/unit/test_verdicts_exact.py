"""Exact values and boundaries of hf_distprof.core.verdicts: every gate's reason and fields, the tails against
their definitions, and the comparisons at equality (threshold, materiality, noise, persistence, alpha)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from hf_distprof.core.stats import MAD_SCALE, binomial_tail, fisher_p, scaled_mad

from hf_distprof.core.run_verdict import across_the_run
from hf_distprof.core.verdicts import (
    ShareVerdict, SlowRankVerdict, _noise_pct, _standing_out, judge_share, judge_slow_rank, min_steps,
)


def exact_tail(k: int, n: int, p: Fraction) -> float:
    """P(X >= k), X ~ Binomial(n, p), in exact rational arithmetic."""
    return float(sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


# ---------------------------------------------------------------- binomial_tail


def test_binomial_tail_edges():
    # k == 0 is the whole distribution even when p is 0 (k <= 0 is checked before p <= 0).
    assert binomial_tail(0, 5, 0.0) == 1.0
    # k == 1 is a real tail, not the whole distribution: 1 - 1/8.
    assert binomial_tail(1, 3, 0.5) == 0.875
    # p == 1: every trial succeeds; exactly 1.0, on both the exact and the log-space path (log1p(-1) would fail).
    assert binomial_tail(2, 3, 1.0) == 1.0
    assert binomial_tail(2, 1001, 1.0) == 1.0
    # p == 0: nothing succeeds; exactly 0.0 on both paths (log(0) would fail).
    assert binomial_tail(1, 3, 0.0) == 0.0
    assert binomial_tail(1, 1001, 0.0) == 0.0
    # k > n: impossible.
    assert binomial_tail(4, 3, 0.5) == 0.0


def test_binomial_tail_is_capped_at_one():
    # The raw sums round above 1 (1.0000000000000002 exact path, 1.0000000000004 in log space): capped at 1.0.
    assert binomial_tail(1, 20, 0.9) == 1.0
    assert binomial_tail(1, 1001, 0.5) == 1.0


def test_binomial_tail_exact_path_up_to_1000_steps():
    # n == 1000 still takes the exact (math.comb) path: correct to 1e-14, which the log-space sum (2e-13) is not.
    for k in (500, 520, 550):
        want = exact_tail(k, 1000, Fraction(1, 2))
        assert binomial_tail(k, 1000, 0.5) == pytest.approx(want, rel=1e-14, abs=0.0)
    # Small n against the definition.
    assert binomial_tail(7, 8, 1 / 3) == pytest.approx(17 / 6561, rel=1e-14, abs=0.0)


def test_binomial_tail_log_space_past_1000_steps():
    # n == 1001 takes the log-space path: far tails do not underflow (0.1**330 is 0.0 in a float).
    want = exact_tail(330, 1001, Fraction(1, 10))
    assert want == pytest.approx(2.6907669196699e-87, rel=1e-12, abs=0.0)
    assert binomial_tail(330, 1001, 0.1) == pytest.approx(want, rel=1e-9, abs=0.0)
    # The last terms (i == n - 1, i == n) are summed: k == n is p**n, k == n - 1 adds n p**(n-1) q.
    assert binomial_tail(1001, 1001, 0.5) == pytest.approx(0.5**1001, rel=1e-9, abs=0.0)
    assert binomial_tail(1000, 1001, 0.5) == pytest.approx(1002 * 0.5**1001, rel=1e-9, abs=0.0)
    assert binomial_tail(520, 1001, 0.5) == pytest.approx(exact_tail(520, 1001, Fraction(1, 2)), rel=1e-9, abs=0.0)


# ---------------------------------------------------------------- scaled_mad, _noise_pct, _standing_out


def test_scaled_mad_values():
    # Two values already have a MAD: |1 - 2| = |3 - 2| = 1.
    assert scaled_mad([1.0, 3.0]) == MAD_SCALE
    # Fewer than two: 0.
    assert scaled_mad([5.0]) == 0.0 and scaled_mad([]) == 0.0


def test_noise_pct_values():
    # Two values: 100 * 1.4826 * 1 / 2.
    assert _noise_pct([1.0, 3.0], None) == 100.0 * MAD_SCALE / 2.0
    # One value: no variation.
    assert _noise_pct([5.0], None) == 0.0
    # A median of 0: 0, not a division by zero.
    assert _noise_pct([0.0, 0.0, 1.0], None) == 0.0
    assert _noise_pct([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == 0.0
    # A median below 1 still divides: 100 * 1.4826 * 0.25 / 0.5.
    assert _noise_pct([0.25, 0.5, 0.75], None) == 100.0 * (MAD_SCALE * 0.25) / 0.5
    # With a scale: of the median scale (of as many entries as values).
    assert _noise_pct([1.0, 3.0], [4.0, 4.0, 100.0]) == 100.0 * MAD_SCALE / 4.0


def test_standing_out_exact():
    # Fewer than 3 ranks: every rank stands out.
    assert _standing_out({0: [1.0], 1: [2.0]}) == {0, 1}
    # 3 ranks 1, 2, 3: center 2, spread 1.4826: none is 3 spreads above.
    assert _standing_out({0: [1.0], 1: [2.0], 2: [3.0]}) == set()
    # No spread at all: equal to the center is not above it.
    assert _standing_out({0: [1.0], 1: [1.0], 2: [1.0]}) == set()
    # 5.5 above the center with a spread of 1.4826: above 3 spreads (4.45), below 4 (5.93).
    assert _standing_out({0: [0.0], 1: [1.0], 2: [6.5]}) == {2}
    # Medians over the steps are what is compared.
    assert _standing_out({0: [0.0, 0.0, 9.0], 1: [1.0, 1.0, 0.0], 2: [6.5, 6.5, 0.0]}) == {2}


# ---------------------------------------------------------------- judge_slow_rank


def test_nothing_to_compare_fields():
    # No rank: every field of the early verdict, steps 0 (not None, not 1).
    v = judge_slow_rank({}, 10.0)
    assert v.to_json() == {
        "status": "quiet", "rank": None, "effect_pct": 0.0, "threshold_pct": 10.0, "noise_pct": 0.0,
        "slowest_in": 0, "steps": 0, "ranks": 0, "p_value": 1.0, "min_steps": 0,
        "reason": "fewer than 2 ranks or no step to compare", "effect_abs": 0.0, "also": [],
        "per_step_excess_pct": [], "gate": "", "test": "binomial", "claim": "", "to_decide": "", "cost_pct": None,
        "confidence": 0.0,
    }
    # One rank with 3 steps: steps and ranks as given.
    one = judge_slow_rank({0: [1.0, 2.0, 3.0]}, 7.5)
    assert (one.status, one.steps, one.ranks, one.min_steps, one.threshold_pct) == ("quiet", 3, 1, 0, 7.5)
    assert (one.effect_pct, one.noise_pct, one.slowest_in, one.p_value) == (0.0, 0.0, 0, 1.0)
    # Two ranks, no step: min_steps is that of 2 ranks at this alpha.
    none = judge_slow_rank({0: [], 1: []}, 10.0, alpha=0.2)
    assert (none.steps, none.ranks, none.min_steps, none.reason) == (
        0, 2, 3, "fewer than 2 ranks or no step to compare")


def test_alpha_sets_min_steps():
    # min_steps uses the caller's alpha: 2 ranks at alpha 0.2 need 3 steps (0.5**3 < 0.2), not 6.
    v = judge_slow_rank({0: [10.0] * 4, 1: [12.0] * 4}, 10.0, alpha=0.2)
    assert v.min_steps == min_steps(2, 0.2) == 3
    assert (v.status, v.p_value) == ("raised", 1 / 16)


def test_raised_two_ranks_every_field_and_reason():
    # Rank 1 20% above rank 0 in every one of 6 steps, default 'what', no noise: raised at p = 1/64.
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0)
    assert v.to_json() == {
        "status": "raised", "rank": 1, "effect_pct": 20.0, "threshold_pct": 10.0, "noise_pct": 0.0,
        "slowest_in": 6, "steps": 6, "ranks": 2, "p_value": 1 / 64, "min_steps": 6,
        "reason": "rank 1's its work exceeds its peers' by a median 20.0% (threshold 10%, step-to-step noise "
                  "0.0%); it is the slowest in 6 of 6 steps (p = 0.016 in a balanced run of 2 ranks)",
        "effect_abs": 2.0, "also": [], "per_step_excess_pct": [20.0] * 6, "gate": "", "test": "binomial",
        "claim": "rank 1's its work exceeds its peers' by a median 20.0%", "to_decide": "", "cost_pct": None,
        "confidence": 63 / 64,
    }
    # With the step times, what the peers wait for it in % of the step: 2 of 16.
    assert judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, step_time=[16.0] * 6).cost_pct == 12.5


def test_effect_equal_to_the_threshold_is_quiet():
    # effect == threshold_pct (20.0 == 20.0) is within the threshold.
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 20.0)
    assert (v.status, v.gate, v.threshold_pct, v.effect_pct) == ("quiet", "threshold", 20.0, 20.0)
    assert v.reason == "rank 1's its work exceeds its peers' by a median 20.0%, within the 20% threshold"
    assert v.per_step_excess_pct == [20.0] * 6


def test_effect_abs_equal_to_min_abs_is_quiet():
    # effect_abs == min_abs (2.0 == 2.0) is under the absolute floor: above the % threshold, and the reason says so
    # (it once said "20.0%, within the 10% threshold").
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, min_abs=2.0, what="its pre-sync work")
    assert (v.status, v.gate, v.effect_abs) == ("quiet", "floor", 2.0)
    assert v.reason == ("rank 1's its pre-sync work exceeds its peers' by a median 20.0%, above the 10% threshold but "
                        "by 2, not more than the 2 below which an excess is noise")
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, min_abs=2.0, abs_unit=" us", abs_floor_is="it is noise")
    assert v.reason.endswith("above the 10% threshold but by 2 us, not more than the 2 us below which it is noise")
    # Under both the threshold and the floor, the threshold is the reason.
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 30.0, min_abs=5.0)
    assert (v.gate, v.reason) == ("threshold", "rank 1's its work exceeds its peers' by a median 20.0%, within the 30% "
                                               "threshold")


def test_zero_denominator_gives_zero_excess():
    # Rank 2's peers are at 0 (median 0): its relative excess is 0.0 in each step, not a division by zero.
    v = judge_slow_rank({0: [0.0] * 4, 1: [0.0] * 4, 2: [5.0] * 4}, 10.0)
    assert (v.rank, v.status, v.gate, v.effect_pct, v.effect_abs) == (2, "quiet", "threshold", 0.0, 5.0)
    assert v.per_step_excess_pct == [0.0] * 4
    # A zero scale as well.
    s = judge_slow_rank({0: [1.0] * 4, 1: [3.0] * 4}, 10.0, scale=[0.0] * 4)
    assert (s.rank, s.effect_pct, s.per_step_excess_pct, s.noise_pct) == (1, 0.0, [0.0] * 4, 0.0)


def test_materiality_exactly_at_the_floor_is_quiet():
    # A 2.0 excess of a 40.0 step is 5.0% exactly: not more than min_step_pct 5, quiet at gate 'material'.
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, step_time=[40.0] * 6)
    assert (v.status, v.gate) == ("quiet", "material")
    assert v.reason == ("rank 1's its work exceeds its peers' by a median 20.0%, but that costs its peers only 5.0% "
                        "of the step (less than 5%)")
    # Just above the floor (39.0 s steps: 5.13%) it is raised.
    assert judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, step_time=[39.0] * 6).status == "raised"


def test_materiality_with_zero_step_times():
    # Zero step times cost 0.0% (not a division by zero, not 1.0%).
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, step_time=[0.0] * 6, min_step_pct=2.5)
    assert (v.status, v.gate) == ("quiet", "material")
    assert v.reason == ("rank 1's its work exceeds its peers' by a median 20.0%, but that costs its peers only 0.0% "
                        "of the step (less than 2.5%)")


def test_materiality_value_in_the_reason():
    # 2.0 of 50.0 is 4.0%; of 100.0 is 2.0%: median over the steps of 100 * e / t.
    v = judge_slow_rank({0: [10.0] * 6, 1: [12.0] * 6}, 10.0, step_time=[50.0, 50.0, 50.0, 100.0, 100.0, 100.0])
    assert v.gate == "material" and "only 3.0% of the step (less than 5%)" in v.reason


def test_effect_equal_to_the_noise_is_quiet():
    # Both ranks have a MAD of exactly 1 (noise 148.26% of the unit scale), and rank 1 is 1.4826 above rank 0
    # in every step: effect == noise, which is within the noise.
    r0 = [0.0, -1.0, -2.0, 0.0, -2.0, 0.0, -2.0]
    v = judge_slow_rank({0: r0, 1: [x + MAD_SCALE for x in r0]}, 10.0, scale=[1.0] * 7)
    assert v.effect_pct == v.noise_pct == 100.0 * MAD_SCALE
    assert (v.status, v.gate, v.slowest_in, v.p_value) == ("quiet", "noise", 7, 2.0**-7)
    assert v.reason == ("rank 1's its work exceeds its peers' by a median 148.3% of the step, but the run's own "
                        "step-to-step variation is 148.3%: within the noise")


def eight_ranks_slowest_in_half() -> dict[int, list[float]]:
    """8 ranks over 10 steps: rank 7 is slowest in steps 0-4 (200 vs 100); in steps 5-9 it is at 150 and rank
    s - 5 at 160 is the slowest. Rank 7 is the candidate (median excess 75%) and slowest in exactly 5 of 10."""
    per_step = {r: [100.0] * 10 for r in range(8)}
    per_step[7] = [200.0] * 5 + [150.0] * 5
    for s in range(5, 10):
        per_step[s - 5][s] = 160.0
    return per_step


def test_slowest_in_exactly_half_is_not_persistent():
    # k == MOST * n (5 of 10) is not "most steps", even though p = P(X >= 5 | 10, 1/8) is far below alpha.
    v = judge_slow_rank(eight_ranks_slowest_in_half(), 10.0)
    p = binomial_tail(5, 10, 1 / 8)
    assert p == pytest.approx(exact_tail(5, 10, Fraction(1, 8)), rel=1e-12, abs=0.0) and p < 0.005
    assert (v.status, v.gate, v.rank, v.slowest_in, v.steps, v.effect_pct, v.p_value) == (
        "quiet", "persistence", 7, 5, 10, 75.0, p)
    assert v.reason == (f"rank 7's its work exceeds its peers' by a median 75.0%, but it is the slowest in 5 of 10 "
                        f"steps (p = {p:.3f} in a balanced run of 8 ranks): not persistent")


def three_ranks_slowest_in_7_of_8() -> dict[int, list[float]]:
    """Rank 2 at 200 in steps 0-6 and 100 in step 7, where rank 0 is at 200; the others at 100."""
    return {0: [100.0] * 7 + [200.0], 1: [100.0] * 8, 2: [200.0] * 7 + [100.0]}


def test_p_equal_to_alpha_is_not_persistent():
    # p == alpha (17/6561 for 7 of 8 with 3 ranks) is not below alpha: quiet; a hair above it: raised.
    p = binomial_tail(7, 8, 1 / 3)
    v = judge_slow_rank(three_ranks_slowest_in_7_of_8(), 10.0, alpha=p)
    assert (v.status, v.gate, v.slowest_in, v.p_value, v.test) == ("quiet", "persistence", 7, p, "binomial")
    assert v.reason == ("rank 2's its work exceeds its peers' by a median 100.0%, but it is the slowest in 7 of 8 "
                        "steps (p = 0.003 in a balanced run of 3 ranks): not persistent")
    assert judge_slow_rank(three_ranks_slowest_in_7_of_8(), 10.0, alpha=p * 1.001).status == "raised"


def test_three_ranks_late_together_do_not_stand_out():
    # Ranks at 100, 110, 120: rank 2 is slowest in every step but 10 above the center is not 3 scaled MADs
    # (3 * 14.826): quiet at gate 'stand_out', already with 3 ranks.
    v = judge_slow_rank({0: [100.0] * 6, 1: [110.0] * 6, 2: [120.0] * 6}, 10.0)
    assert (v.status, v.gate, v.rank, v.slowest_in, v.p_value) == ("quiet", "stand_out", 2, 6, (1 / 3) ** 6)
    assert v.effect_pct == 100.0 * 15.0 / 105.0
    assert v.reason == (
        "rank 2's its work exceeds its peers' by a median 14.3%, but it does not stand out from the spread across the "
        "3 ranks (3 scaled median absolute deviations): several ranks are behind together, not one straggler"
    )


def test_ranks_late_together_in_too_few_steps_are_no_straggler_not_undecided():
    # A trial on the shared 8-GPU traces (one step): ranks 2 and 6 arrive 0.5 ms before rank 7, 5-7 ms after the others;
    # "undecided: trace at least 2 steps" where that one step already shows no single straggler. A rank that stands
    # out in one step is still undecided.
    late = {0: [5.5], 1: [0.0], 2: [7.1], 3: [2.0], 4: [2.8], 5: [3.0], 6: [7.1], 7: [7.6]}
    v = judge_slow_rank(late, 10.0, scale=[16.0])
    assert (v.status, v.gate, v.rank, v.steps, v.min_steps) == ("quiet", "stand_out", 7, 1, 2)
    assert v.reason.endswith("several ranks are behind together, not one straggler (in 1 step, too few to tell more: "
                             "at least 2 are needed)")
    alone = {**{r: [1.0] for r in range(7)}, 7: [7.6]}
    assert judge_slow_rank(alone, 10.0, scale=[16.0]).status == "undecided"


def five_ranks(r3: list[float]) -> dict[int, list[float]]:
    """Ranks 0-2 at 100, rank 4 at 200 (the candidate, slowest in every step), rank 3 as given."""
    return {0: [100.0] * 4, 1: [100.0] * 4, 2: [100.0] * 4, 3: r3, 4: [200.0] * 4}


def test_also_needs_an_excess_above_the_threshold():
    # Rank 3 at 150 is 50% above its peers' median 100: with threshold 50 it is not "also" slow (50 == 50).
    assert judge_slow_rank(five_ranks([150.0] * 4), 50.0).also == []
    assert judge_slow_rank(five_ranks([150.0] * 4), 49.0).also == [3]
    v = judge_slow_rank(five_ranks([150.0] * 4), 50.0)
    assert (v.status, v.rank, v.effect_pct, v.p_value) == ("raised", 4, 100.0, 0.2**4)


def test_also_needs_an_absolute_excess_above_min_abs():
    # Rank 3's absolute excess is 50 == min_abs: not also slow; the candidate's 100 passes.
    assert judge_slow_rank(five_ranks([150.0] * 4), 10.0, min_abs=50.0).also == []
    assert judge_slow_rank(five_ranks([150.0] * 4), 10.0, min_abs=49.0).also == [3]


def test_also_needs_a_positive_excess_in_most_steps():
    # Rank 3 above its peers in exactly 2 of 4 steps (excess 0, 0, 50, 50; median 25 > 10): not most steps.
    v = judge_slow_rank(five_ranks([100.0, 100.0, 150.0, 150.0]), 10.0)
    assert (v.status, v.also) == ("raised", [])
    # Excess 0.5, 0.5, 50, 50: above in all 4 steps (0.5% counts as above), median 25.25: also slow.
    w = judge_slow_rank(five_ranks([100.5, 100.5, 150.0, 150.0]), 10.0)
    assert (w.status, w.also) == ("raised", [3])


# ---------------------------------------------------------------- fisher_p


def test_fisher_p_closed_form():
    # q (1 - ln q) with q = p1 p2; 0 for q <= 0; 1 at q = 1.
    assert fisher_p(0.01, 0.5) == 0.005 * (1.0 - math.log(0.005))
    assert fisher_p(1.0, 1.0) == 1.0 and fisher_p(0.0, 0.3) == 0.0 and fisher_p(-1.0, 0.3) == 0.0


# ---------------------------------------------------------------- across_the_run


def window(status: str = "raised", slowest_in: int = 6, steps: int = 6, p: float = 0.01, ranks: int = 2,
           gate: str = "") -> SlowRankVerdict:
    """A traced window's verdict for rank 1, built field by field."""
    return SlowRankVerdict(status, 1, 30.0, 10.0, 1.0, slowest_in, steps, ranks, p, 6, "W", gate=gate,
                           test="binomial")


def test_across_the_run_one_outside_step_counts():
    # steps == 1 is a valid timer verdict: p 0.01 with 0.5 is 0.005 * (1 - ln 0.005) = 0.0315, not below alpha:
    # quiet, gate 'outside'.
    v = across_the_run(window(), {"status": "quiet", "rank": 1, "p_value": 0.5, "steps": 1, "reason": "R"})
    both = fisher_p(0.01, 0.5)
    assert (v.status, v.gate, v.p_value, v.test) == ("quiet", "outside", both, "binomial + step timer")
    assert v.reason == ("W; but over the run's 1 untraced steps the step timer says: R (p = 0.500 for rank 1); "
                        "together p = 0.031 (Fisher), not below 0.02: slow in the traced window, not across the run")


def test_across_the_run_p_at_the_ends_of_its_range():
    # p == 0.0 from the timer is valid: combined p 0, raised; the reason names the status when there is no reason.
    v = across_the_run(window(), {"status": "raised", "rank": 1, "p_value": 0.0, "steps": 40})
    assert (v.status, v.gate, v.p_value) == ("raised", "", 0.0)
    assert v.reason == ("W; over the run's 40 untraced steps the step timer says: raised (p = 0.000 for rank 1); "
                        "together p = 0.0000 (Fisher): slow across the run")
    # p == 1.0 is valid too: 0.01 with 1.0 is 0.056: quiet.
    w = across_the_run(window(), {"status": "quiet", "rank": 1, "p_value": 1.0, "steps": 40, "reason": 3})
    assert (w.status, w.gate, w.p_value) == ("quiet", "outside", fisher_p(0.01, 1.0))
    assert "the step timer says: quiet (p = 1.000 for rank 1)" in w.reason


def test_across_the_run_combined_p_equal_to_alpha_is_not_below_it():
    # Window p q with q (1 - ln q) == 0.02 exactly; the timer names another of 3 ranks (p_same = 1).
    q = 0.0029265772820295274
    assert fisher_p(q, 1.0) == 0.02
    v = across_the_run(window(p=q, ranks=3), {"status": "raised", "rank": 2, "p_value": 0.001, "steps": 40})
    assert (v.status, v.gate, v.p_value) == ("quiet", "outside", 0.02)


def test_across_the_run_needs_the_window_slowest_in_most_steps():
    # Slowest in 3 of 6 (exactly half) in the window: not slow across the run however small the combined p.
    v = across_the_run(window(slowest_in=3), {"status": "raised", "rank": 1, "p_value": 0.001, "steps": 40})
    assert (v.status, v.gate) == ("quiet", "outside") and v.p_value < 0.001
    # 4 of 6 is most.
    assert across_the_run(window(slowest_in=4), {"status": "raised", "rank": 1, "p_value": 0.001,
                                                 "steps": 40}).status == "raised"


def test_across_the_run_raised_reason_exact():
    # A raised window confirmed by the timer: no "in the traced window alone" in the reason.
    v = across_the_run(window(), {"status": "raised", "rank": 1, "p_value": 0.001, "steps": 40, "reason": "R"})
    both = fisher_p(0.01, 0.001)
    assert (v.status, v.gate, v.p_value) == ("raised", "", both)
    assert v.reason == (f"W; over the run's 40 untraced steps the step timer says: R (p = 0.001 for rank 1); "
                        f"together p = {both:.4f} (Fisher): slow across the run")
    # A window quiet at persistence, completed by the timer: "in the traced window alone".
    w = across_the_run(window("quiet", 5, gate="persistence"),
                       {"status": "raised", "rank": 1, "p_value": 0.001, "steps": 40, "reason": "R"})
    assert w.status == "raised" and w.reason.startswith("W in the traced window alone; over the run's 40")


def below_threshold(effect: float = 8.0, slowest_in: int = 4, p: float = 0.05, noise: float = 1.0) -> SlowRankVerdict:
    """A traced window of 6 steps quiet at the threshold gate: rank 1's own work 8% over its peer's."""
    return SlowRankVerdict("quiet", 1, effect, 10.0, noise, slowest_in, 6, 2, p, 6, "W", gate="threshold",
                           test="binomial")


TIMER = {"status": "raised", "rank": 1, "p_value": 0.0005, "steps": 12, "effect_pct": 20.0, "reason": "R"}


def test_pooled_effect_of_a_window_below_the_threshold_with_a_timer_naming_the_rank():
    v = across_the_run(below_threshold(), TIMER, pool_effect=True)
    both = fisher_p(0.05, 0.0005)
    assert (v.status, v.gate, v.rank, v.p_value, v.test) == ("raised", "", 1, both, "binomial + step timer")
    assert v.effect_pct == (6 * 8.0 + 12 * 20.0) / 18 == 16.0
    assert v.reason == ("W in the traced window alone; over the run's 12 untraced steps the step timer says: R "
                        "(p = 0.001 for rank 1); over the run's 18 judged steps its excess is 16.0% (the traced "
                        "window's 8.0% weighted with the step timer's 20.0%), above the 10% threshold and the "
                        f"window's noise (1.0%); together p = {both:.4f} (Fisher): slow across the run")
    # Without pool_effect (the straggler verdict: lateness, not the timer's figure) the window stays as it was.
    w = below_threshold()
    assert across_the_run(w, TIMER) is w


@pytest.mark.parametrize("timer", [
    {**TIMER, "status": "quiet"},  # the timer does not name the rank itself
    {**TIMER, "status": "undecided"},
    {**TIMER, "rank": 0},  # it names the other rank
    {k: v for k, v in TIMER.items() if k != "effect_pct"},  # no effect to pool
    {**TIMER, "effect_pct": True},
    {**TIMER, "effect_pct": "20"},
    {**TIMER, "effect_pct": float("nan")},
    {**TIMER, "effect_pct": 11.0},  # (48 + 132) / 18 = 10.0: at the threshold is not above it
    {**TIMER, "p_value": 0.5},  # together not below alpha
])
def test_a_window_below_the_threshold_stays_quiet_unless_the_run_bears_the_rank_out(timer):
    w = below_threshold()
    assert across_the_run(w, timer, pool_effect=True) is w


def test_a_pooled_effect_must_clear_the_windows_noise_and_the_window_must_lean_the_same_way():
    noisy = below_threshold(noise=16.0)  # pooled 16.0 is not above a noise of 16.0
    assert across_the_run(noisy, TIMER, pool_effect=True) is noisy
    assert across_the_run(below_threshold(noise=15.9), TIMER, pool_effect=True).status == "raised"
    half = below_threshold(slowest_in=3)  # slowest in 3 of 6: not most of the window's steps
    assert across_the_run(half, TIMER, pool_effect=True) is half
    # A window quiet at the noise gate (11% within a noise of 12%) pools too: 14.0% over the run clears both.
    within = SlowRankVerdict("quiet", 1, 11.0, 10.0, 12.0, 4, 6, 2, 0.05, 6, "W", gate="noise")
    v = across_the_run(within, {**TIMER, "effect_pct": 15.5}, pool_effect=True)
    assert (v.status, v.effect_pct) == ("raised", 14.0) and "the window's noise (12.0%)" in v.reason
    other = SlowRankVerdict("quiet", 1, 8.0, 10.0, 1.0, 4, 6, 2, 0.05, 6, "W", gate="material")  # another gate
    assert across_the_run(other, TIMER, pool_effect=True) is other


# ---------------------------------------------------------------- judge_share


def test_judge_share_no_step():
    # Every field of the empty verdict.
    assert judge_share([], 10.0, "x") == ShareVerdict("quiet", 0.0, 10.0, 0, 0, "no step")
    assert judge_share([], 10.0, "x").confidence == 0.0


def test_judge_share_at_the_threshold_is_not_above():
    # A step at exactly the threshold is not above it: 2 of 3 above (20, 30), median 20: raised.
    v = judge_share([10.0, 20.0, 30.0], 10.0, "data loading")
    assert v == ShareVerdict("raised", 20.0, 10.0, 2, 3,
                             "data loading is 20.0% of the step (median of 3 steps), above 10% in 2 of 3")


def test_judge_share_half_the_steps_is_not_most():
    # Median 15 above 10, but above in only 2 of 4 steps (exactly half): quiet, every field.
    v = judge_share([0.0, 0.0, 30.0, 30.0], 10.0, "exposed communication")
    assert v == ShareVerdict("quiet", 15.0, 10.0, 2, 4,
                             "exposed communication is 15.0% of the step (median of 4 steps), above 10% in 2 of 4")


def test_judge_share_median_at_the_threshold_is_quiet():
    # Median == threshold: quiet, every field.
    v = judge_share([5.0, 10.0, 12.5], 10.0, "data loading")
    assert v == ShareVerdict("quiet", 10.0, 10.0, 1, 3,
                             "data loading is 10.0% of the step (median of 3 steps), above 10% in 1 of 3")


def test_judge_share_within_its_step_to_step_noise_is_quiet():
    # A trial's clean run: rank 1's data loading 12.8, 6.4 and 10.3% of its 3 traced steps, "Data-loading bound" at
    # 10% beside a what-if that found no saving. Median 10.3, 0.3 points above; the steps' scaled MAD 1.4826 x 2.5
    # over sqrt(3): +-2.1 points. Quiet; the same steps 5 points higher are above beyond it.
    v = judge_share([12.8, 6.4, 10.3], 10.0, "fetching the next batch")
    assert v == ShareVerdict("quiet", 10.3, 10.0, 2, 3, "fetching the next batch is 10.3% of the step (median of 3 "
                             "steps), above 10% in 2 of 3, within its step-to-step noise (+-2.1 points)")
    assert judge_share([17.8, 11.4, 15.3], 10.0, "x").raised
    assert judge_share([10.5], 10.0, "x").raised  # one step: no spread to weigh, the share as measured
    # Every step above: above, whatever the spread (a review: [10.5, 20] raised, [10.5, 40] quiet, a worse step
    # silencing the finding).
    assert judge_share([10.5, 20.0], 10.0, "x").raised and judge_share([10.5, 40.0], 10.0, "x").raised
