"""The decision rules of hf_distprof.core.verdicts, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from hf_distprof.core.growth import memory_growth

from hf_distprof.core.overhead import profiler_slowdown

from hf_distprof.core.stats import binomial_tail, fisher_p

from hf_distprof.core.run_verdict import across_the_run
from hf_distprof.core.verdicts import (
    _per_step_excess_numpy, imbalance_pct, judge_share, judge_slow_rank, medians_of_the_others,
    min_steps, per_step_excess,
)


def test_binomial_tail_and_min_steps():
    assert binomial_tail(11, 12, 0.5) == pytest.approx(13 / 4096)  # last in 11 of 12: a straggler
    assert binomial_tail(6, 12, 0.5) == pytest.approx(sum(math.comb(12, i) for i in range(6, 13)) / 4096)
    assert binomial_tail(0, 5, 0.5) == 1.0 and binomial_tail(6, 5, 0.5) == 0.0
    # Thousands of steps (a long run): no overflow, and half of them is what chance gives.
    assert binomial_tail(12_500, 25_000, 0.5) == pytest.approx(0.5, abs=0.01)
    assert binomial_tail(13_000, 25_000, 0.5) < 1e-9
    # Fewest steps in which "last every time" beats p = 0.02: 2 ranks 6 (1/64), 3 ranks 4 (1/81), 8 ranks 2.
    assert [min_steps(r) for r in (1, 2, 3, 8, 64)] == [0, 6, 4, 2, 1]


def test_imbalance_is_the_slowest_over_the_median_of_the_others():
    assert imbalance_pct([1.0, 1.5]) == pytest.approx(50.0)
    assert imbalance_pct([1.0, 1.0, 2.0, 1.2]) == pytest.approx(100.0)  # median of 1.0, 1.0, 1.2 is 1.0
    assert imbalance_pct([]) == 0.0 and imbalance_pct([3.0]) == 0.0


def steady(slow: float, n: int, jitter: float = 0.01) -> dict[int, list[float]]:
    """Two ranks over ``n`` steps: rank 1 ``slow`` times rank 0, both with an alternating jitter."""
    base = [1.0 + (jitter if i % 2 else -jitter) for i in range(n)]
    return {0: base, 1: [b * slow for b in base]}


def test_a_persistently_slow_rank_is_raised_with_its_evidence():
    v = judge_slow_rank(steady(1.2, 8), 10.0)
    assert (v.status, v.rank, v.slowest_in, v.steps, v.ranks) == ("raised", 1, 8, 8, 2)
    assert v.effect_pct == pytest.approx(20.0) and v.p_value == pytest.approx(1 / 256)
    assert v.confidence == pytest.approx(255 / 256) and v.to_json()["confidence"] == v.confidence
    assert "slowest in 8 of 8 steps (p = 0.004" in v.reason


def test_two_ranks_count_the_steps_a_few_stalls_do_not_make_a_rank_slow():
    # Rank 1 far slower in 3 of 24 steps (a stall: its core taken by other work) and a little slower in 12 more:
    # slower in 15 of 24 steps is p = 0.15 by the count, within chance, however large the stalls.
    base = [1.0] * 24
    stalled = [2.5, 2.2, 2.8] + [1.12] * 12 + [0.95] * 9
    v = judge_slow_rank({0: base, 1: stalled}, 10.0)
    assert (v.status, v.gate, v.rank, v.slowest_in, v.test) == ("quiet", "persistence", 1, 15, "binomial")
    assert v.p_value == pytest.approx(binomial_tail(15, 24, 0.5)) == pytest.approx(0.1537, abs=1e-4)
    assert "slowest in 15 of 24 steps (p = 0.154 in a balanced run of 2 ranks): not persistent" in v.reason
    # Slower in 20 of 24 steps, by as little: persistent (p < 0.001).
    steady_ = [1.12] * 20 + [0.95] * 4
    v = judge_slow_rank({0: base, 1: steady_}, 10.0)
    assert (v.status, v.slowest_in) == ("raised", 20) and v.p_value == pytest.approx(binomial_tail(20, 24, 0.5))
    # With 3 ranks the same count is at 1/3.
    v3 = judge_slow_rank({0: base, 1: stalled, 2: base}, 10.0)
    assert v3.test == "binomial" and v3.p_value == pytest.approx(binomial_tail(15, 24, 1 / 3))


def test_below_the_threshold_is_quiet():
    v = judge_slow_rank(steady(1.08, 8), 10.0)
    assert v.status == "quiet" and v.effect_pct == pytest.approx(8.0) and "within the 10% threshold" in v.reason


def test_too_few_steps_is_not_enough_evidence_never_a_verdict():
    v = judge_slow_rank(steady(1.5, 4), 10.0)
    assert (v.status, v.min_steps) == ("undecided", 6) and v.reason.startswith("not enough evidence")


def test_an_effect_inside_the_runs_own_noise_is_quiet():
    # Each rank swings +-40% from step to step; rank 1 is 15% slower on median: noise, not a finding.
    swing = [0.6, 1.4] * 5
    v = judge_slow_rank({0: swing, 1: [x * 1.15 for x in swing]}, 10.0)
    assert v.status == "quiet" and v.noise_pct > v.effect_pct and "within the noise" in v.reason


def test_an_effect_that_costs_the_step_nothing_is_quiet():
    # Rank 1's own work is 30% longer, but 3 ms of a 180 ms step (the rest is communication).
    per_step = {0: [0.010] * 10, 1: [0.013] * 10}
    assert judge_slow_rank(per_step, 10.0).status == "raised"
    v = judge_slow_rank(per_step, 10.0, step_time=[0.180] * 10)
    assert v.status == "quiet" and "only 1.7% of the step" in v.reason


def test_scale_and_absolute_floor_for_lateness():
    late = {0: [0.0] * 6, 1: [30.0] * 6}  # microseconds late, 100 us steps
    v = judge_slow_rank(late, 10.0, scale=[100.0] * 6)
    assert v.status == "raised" and v.effect_pct == pytest.approx(30.0) and v.effect_abs == 30.0
    assert judge_slow_rank(late, 10.0, scale=[100.0] * 6, min_abs=50.0).status == "quiet"


def test_with_many_ranks_the_slow_one_must_stand_out():
    ranks = {r: [1.0] * 4 for r in range(8)}
    ranks[3] = [1.5] * 4
    v = judge_slow_rank(ranks, 10.0)
    assert (v.status, v.rank, v.also) == ("raised", 3, [])
    spread = {r: [1.0 + 0.1 * r] * 4 for r in range(8)}  # evenly spread: no rank stands out
    v = judge_slow_rank(spread, 5.0)
    assert v.status == "quiet" and "does not stand out" in v.reason


def test_a_share_needs_most_steps_above_the_threshold():
    assert judge_share([40.0, 45.0, 50.0], 30.0, "x").raised
    one_spike = judge_share([5.0, 90.0, 6.0, 4.0], 30.0, "data loading")
    assert not one_spike.raised and one_spike.above_in == 1
    assert judge_share([], 30.0, "x").status == "quiet"


def test_profiler_slowdown_compares_traced_steps_with_the_untraced_steps_around_them():
    steps = {s: 0.4 for s in range(2, 6)} | {s: 0.5 for s in range(6, 10)} | {s: 0.2 for s in range(10, 16)}
    out = profiler_slowdown(steps, set(range(6, 10)), {"record_shapes": True, "with_stack": False})
    assert out is not None and out.ratio == pytest.approx(2.5)  # the slower warm-up steps 2-5 are left out
    assert (out.steps_inside, out.steps_before, out.steps_after) == (4, 4, 6)
    assert out.median_step_s_after == pytest.approx(0.2) and out.confidence == 1.0
    assert out.warning is not None and "2.50x" in out.warning and "--profiler-record-shapes" in out.warning
    assert "--profiler-with-stack" not in out.warning
    quiet = profiler_slowdown(steps | {s: 0.21 for s in range(6, 10)}, set(range(6, 10)), {})
    assert quiet is not None and quiet.warning is None and quiet.ratio == pytest.approx(1.05)
    assert profiler_slowdown(steps, set(), {}) is None  # nothing traced: no figure
    # A step of the window after a pause (no row: the step timer leaves it out) is said beside the count.
    cut = profiler_slowdown({s: t for s, t in steps.items() if s != 8}, {6, 7, 9}, {}, left_out=[8])
    assert cut is not None and cut.steps_inside == 3 and cut.steps_left_out == [8]
    assert ("(median 0.5000s inside its window vs 0.2000s over the 6 untraced steps after its start; step 8 left out: "
            "it waited for an evaluation, a checkpoint or a trace's export; the run's own noise") in cut.warning
    assert cut.to_json()["steps_left_out"] == [8]


def test_the_step_series_names_the_window_s_steps_it_has_no_row_for():
    from types import SimpleNamespace

    from hf_distprof.timing.series import StepSeries

    series = StepSeries(2)
    for step in [s for s in range(2, 16) if s != 8]:  # step 8: after an evaluation, never added
        t = 0.5 if 6 <= step <= 9 else 0.2
        row = [step, t, t / 2, t, t / 2, 0.0, 0.0, t / 2, 0, 0]
        series.add([[row], [row]])
    args = SimpleNamespace(profiler_record_shapes=False, profiler_profile_memory=False, profiler_with_stack=False,
                           profiler_with_flops=False, profiler_slowdown_threshold=1.25)
    out = series.profiler_slowdown(set(), lambda s: 6 <= s <= 9, args)
    assert out is not None and (out.steps_inside, out.steps_left_out) == (3, [8])
    # A traced step the profiler was still busy in (a trace being written) is left out and named too (a review).
    busy = series.profiler_slowdown({7}, lambda s: 6 <= s <= 9, args)
    assert busy is not None and (busy.steps_inside, busy.steps_left_out) == (2, [7, 8])
    # analyze, judging the records again at another threshold, names them as the step timer did (a review).
    from hf_distprof.analysis.judge.slowdown import slowdown_of
    from hf_distprof.analysis.options import AnalysisOptions
    from hf_distprof.analysis.results.across import TimerFigures
    from hf_distprof.analysis.results.timer import TimingSummary

    timer = TimerFigures(step_times={s: (0.5 if 6 <= s <= 9 else 0.2) for s in range(2, 16) if s != 8},
                         marked_traced={6, 7, 9})
    again = slowdown_of(TimingSummary(), timer, {6, 7, 8, 9}, AnalysisOptions(profiler_slowdown_threshold=1.2))
    assert again is not None and (again["steps_inside"], again["steps_left_out"]) == (3, [8])


def test_memory_growth_needs_a_steady_rise():
    steps = [10, 20, 30, 40]
    out = memory_growth(steps, [100, 110, 120, 130], 20.0, rank=3, what="process RSS")  # +30%, rose 3 of 3
    assert out is not None and (out.rank, out.first_step, out.last_step, out.rises, out.intervals) == (3, 10, 40, 3, 3)
    assert out.rate_mb_per_step == pytest.approx(1.0) and out.growth_pct == pytest.approx(30.0)
    assert out.message.startswith("rank 3: process RSS grows 1.0 MiB per step (100 -> 130 MiB, +30.0% from step 10")
    assert out.to_json()["message"] == out.message
    assert memory_growth(steps, [100, 130, 100, 130], 20.0) is None  # up and down
    assert memory_growth(steps, [100, 101, 102, 103], 20.0) is None  # +3%
    assert memory_growth(steps[:3], [100, 150, 200], 20.0) is None  # too few samples


def test_memory_growth_leaves_the_warm_up_out():
    # A jump in the first window (optimizer state, caches), flat afterwards: not growth.
    steps = [5, 10, 15, 20, 25, 30]
    assert memory_growth(steps, [500, 900, 901, 902, 902, 903], 20.0) is None
    # Without leaving the first sample out, the same numbers would be +80% rising 5 of 5 times.
    leak = memory_growth(steps, [500, 900, 1000, 1100, 1200, 1300], 20.0)
    assert leak is not None and leak.first_step == 10 and leak.rate_mb_per_step == pytest.approx(20.0)


def test_memory_growth_leaves_the_profilers_window_out():
    # A clean run's RSS on CPU while the profiler traces steps 6-13 (its buffers), flat afterwards.
    steps, rss = [4, 8, 12, 16, 20], [614, 650, 700, 740, 741]
    assert memory_growth(steps[:4], rss[:4], 20.0) is not None  # +20.5%, rose 3 of 3: the profiler's doing
    distorted = [False, True, True, True, False]  # the intervals ending at 8, 12, 16 overlap steps 6-13
    assert memory_growth(steps, rss, 20.0, distorted=distorted) is None
    # A real leak outside the window is still seen, from the clean intervals only.
    steps = list(range(2, 42, 2))
    leak = [500 + 30 * s + (300 if s > 6 else 0) for s in steps]  # +300 MB inside a window ending at step 8
    distorted = [s == 8 for s in steps]
    out = memory_growth(steps, leak, 20.0, distorted=distorted)
    assert out is not None and out.rate_mb_per_step == pytest.approx(30.0)
    # 19 intervals, the distorted one (6 -> 8, with the window's +300) and the warm-up one (2 -> 4) left out.
    assert (out.intervals, out.first_step, out.last_step) == (17, 4, 40)
    assert out.last_mb - out.first_mb == pytest.approx(30 * 36 - 60)


def test_memory_growth_rate_resists_one_odd_sample_and_long_runs():
    steps = list(range(10, 110, 10))
    values = [1000 + 5 * s for s in steps]
    values[5] += 400  # one odd sample
    out = memory_growth(steps, values, 20.0)
    assert out is not None and out.rate_mb_per_step == pytest.approx(5.0)
    many = list(range(1, 20_001))
    out = memory_growth(many, [1000 + 0.1 * s for s in many], 20.0)  # 20k samples: bounded work
    assert out is not None and out.rate_mb_per_step == pytest.approx(0.1)
    with pytest.raises(ValueError, match="3 steps but 2 values"):
        memory_growth([1, 2, 3], [1.0, 2.0], 20.0)


def test_medians_of_the_others_match_the_direct_definition():
    import random
    from statistics import median

    rng = random.Random(0)
    for n in (2, 3, 4, 7, 8, 33):
        values = [rng.choice([rng.random(), 0.5]) for _ in range(n)]  # ties included
        direct = [median(v for j, v in enumerate(values) if j != i) for i in range(n)]
        assert medians_of_the_others(values) == pytest.approx(direct)
    assert medians_of_the_others([3.0]) == [0.0]


def test_fisher_p_combines_two_independent_p_values():
    q = 0.031 * 0.001
    assert fisher_p(0.031, 0.001) == pytest.approx(q * (1 - math.log(q)))
    assert fisher_p(1.0, 1.0) == 1.0 and fisher_p(0.0, 0.5) == 0.0 and fisher_p(0.5, 0.5) > 0.5


def five_of_six() -> dict[int, list[float]]:
    """Rank 1 20% slower in 5 of 6 steps and 1% faster in one: effect, but p = 7/64 > 0.02 alone."""
    return {0: [1.0] * 6, 1: [0.99] + [1.2] * 5}


def test_the_timer_completes_a_window_too_short_to_show_persistence_on_its_own():
    window = judge_slow_rank(five_of_six(), 10.0)
    assert (window.status, window.gate, window.p_value) == ("quiet", "persistence", 7 / 64)
    timer = {"status": "raised", "rank": 1, "p_value": 0.001, "steps": 11, "reason": "rank 1 ..."}
    both = across_the_run(window, timer)
    assert (both.status, both.rank, both.gate) == ("raised", 1, "")
    assert both.p_value == pytest.approx(fisher_p(7 / 64, 0.001)) and both.confidence == 1 - both.p_value
    assert both.test == "binomial + step timer"
    assert both.reason == (f"{window.reason} in the traced window alone; over the run's 11 untraced steps the step "
                           "timer says: rank 1 ... (p = 0.001 for rank 1); together p = 0.0011 (Fisher): slow across "
                           "the run")
    # A timer leaning the same way without naming the rank itself does not complete it, nor one leaning away.
    leaning = across_the_run(window, {**timer, "status": "quiet", "p_value": 0.01})
    assert (leaning.status, leaning.gate) == ("quiet", "persistence") and leaning.p_value < 0.02
    away = across_the_run(window, {**timer, "rank": 0, "p_value": 0.001})
    assert (away.status, away.gate, away.p_value) == ("quiet", "persistence", pytest.approx(fisher_p(7 / 64, 0.999)))
    # With 3+ ranks a timer naming another rank gives this one no support (p = 1).
    three = judge_slow_rank({**five_of_six(), 2: [1.0] * 6}, 10.0)
    assert across_the_run(three, {**timer, "rank": 2}).p_value == pytest.approx(fisher_p(three.p_value, 1.0))
    # A window stopped by another gate is not reconsidered.
    below = judge_slow_rank({0: [1.0] * 6, 1: [0.99] + [1.05] * 5}, 10.0)
    assert below.gate == "threshold" and across_the_run(below, timer) is below


def test_a_rank_slow_in_the_window_only_is_not_named_when_the_timer_does_not_bear_it_out():
    window = judge_slow_rank(steady(1.3, 6), 10.0)
    assert window.status == "raised" and window.p_value == 1 / 64
    neutral = {"status": "quiet", "rank": 0, "p_value": 0.5, "steps": 11, "reason": "rank 0 ... within the noise"}
    seen = across_the_run(window, neutral)
    assert (seen.status, seen.gate, seen.rank, seen.effect_pct) == ("quiet", "outside", 1, window.effect_pct)
    assert seen.p_value == pytest.approx(fisher_p(1 / 64, 0.5)) and seen.p_value > 0.02
    assert seen.reason.startswith(f"{window.reason}; but over the run's 11 untraced steps the step timer says: "
                                  "rank 0 ... within the noise (for the window's rank 1, p = 0.500); together "
                                  "p = 0.046")
    # A summary that is not a verdict leaves the window as it is.
    for bad in ({**neutral, "steps": 0}, {**neutral, "steps": True}, {**neutral, "steps": "11"}, {"status": "quiet"},
                {**neutral, "status": "maybe"}, {**neutral, "rank": None}, {**neutral, "rank": True},
                {**neutral, "p_value": 1.5}, {**neutral, "p_value": False}, None, ["quiet"]):
        assert across_the_run(window, bad) is window, bad


def _per_step_excess_loop(per_step, ranks, n, scale):
    """The loop ``per_step_excess`` replaced, as it was: the reference its numpy must equal exactly."""
    excess = {r: [] for r in ranks}
    excess_abs = {r: [] for r in ranks}
    slowest_count = dict.fromkeys(ranks, 0)
    for s in range(n):
        values = {r: float(per_step[r][s]) for r in ranks}
        slowest_count[max(ranks, key=lambda r: values[r])] += 1
        for r, others in zip(ranks, medians_of_the_others([values[r] for r in ranks])):
            denom = others if scale is None else float(scale[s])
            excess_abs[r].append(values[r] - others)
            excess[r].append(100.0 * (values[r] - others) / denom if denom > 0 else 0.0)
    return excess, excess_abs, slowest_count


@pytest.mark.parametrize("width", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_per_step_excess_in_numpy_is_exactly_the_loop_s(width, scaled):
    import random

    rng = random.Random(width * 10 + scaled)
    n = 300
    # Ties (values drawn from a few levels), zeros and negative scales included.
    per_step = {r: [rng.choice([0.0, 0.1, 0.3, 0.3, rng.random()]) for _ in range(n + 5)] for r in range(width)}
    scale = [rng.choice([0.0, -1.0, 0.5, rng.random()]) for _ in range(n)] if scaled else None
    ranks = sorted(per_step)
    got = _per_step_excess_numpy(per_step, ranks, n, scale)
    want = _per_step_excess_loop(per_step, ranks, n, scale)
    assert got == want  # exact: every float, every count
    assert per_step_excess(per_step, ranks, n, scale) == want  # whichever of the two it picks for this size
    assert all(type(v) is float for values in got[0].values() for v in values)


def test_with_a_nan_or_an_infinity_the_per_step_excess_is_the_loop_s_too():
    from hf_distprof.core.verdicts import _per_step_excess_numpy

    nan = {0: [0.1, float("nan")] * 600, 1: [0.2, 0.2] * 600, 2: [0.3, 0.1] * 600}  # numpy's size, with a NaN
    assert repr(_per_step_excess_numpy(nan, [0, 1, 2], 1200, None)) == repr(
        _per_step_excess_loop(nan, [0, 1, 2], 1200, None))
    per_step = {0: [0.1, float("nan"), 0.3, 0.2], 1: [0.2, 0.2, float("inf"), 0.1], 2: [0.3, 0.1, 0.2, float("nan")]}
    got = per_step_excess(per_step, [0, 1, 2], 4, None)
    want = _per_step_excess_loop(per_step, [0, 1, 2], 4, None)
    assert repr(got) == repr(want)  # NaN != NaN: compared as text
    scale = [1.0, float("nan"), 1.0, 1.0]
    assert repr(per_step_excess(per_step, [0, 1, 2], 4, scale)) == repr(_per_step_excess_loop(per_step, [0, 1, 2], 4,
                                                                                             scale))
