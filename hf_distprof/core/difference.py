"""Is a difference between two runs beyond their own step-to-step noise? Pure functions, no I/O.

Each compared figure (one phase of one rank, the run's throughput, ...) has one value per step in each run.
A difference is *significant* only when every one of these holds:

- **effect**: the medians differ by at least :data:`MIN_EFFECT_PCT` of run A's median (for figures that are
  already percentages, by :data:`MIN_EFFECT_POINTS` percentage points);
- **noise**: the difference of the medians is more than :data:`NOISE_FACTOR` times the larger of the two
  runs' own step-to-step spread (scaled median absolute deviation), so a difference one noisy run could make
  on its own does not count;
- **materiality** (seconds only): the difference is at least :data:`MATERIAL_PCT` of run A's step time, so a
  50% change of a 2 ms optimizer step in a 300 ms step is not news;
- **rank-sum**: a two-sided Mann-Whitney U test says the two sets of steps are unlikely to come from one
  distribution (``p <`` :data:`~hf_distprof.core.stats.ALPHA`, the level every verdict of the package uses);
- **enough steps**: at least :data:`MIN_STEPS` steps in each run, and enough for the rank-sum test to reach
  ``p <`` :data:`~hf_distprof.core.stats.ALPHA` at all (:func:`~hf_distprof.core.stats.smallest_p`): 4 steps
  against 4 cannot (0.030), 4 against 5 can (0.020).

The thresholds were set from pairs of clean 2-rank CPU runs on a shared 2-core machine (see the guide's
"Comparing runs"), where the run-to-run drift of a phase's median, not the rank-sum test, is what a clean pair
gets wrong: with 29 steps per run the test alone calls a 3% drift of the machine's load significant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

from hf_distprof.core.stats import ALPHA, mann_whitney_p, scaled_mad, smallest_p
from hf_distprof.core.verdicts import MATERIAL_PCT

MIN_EFFECT_PCT = 10.0
"""Smallest relative change of a median that can be significant, in % of run A's median."""
MIN_EFFECT_POINTS = 10.0
"""For figures that are percentages (imbalance, communication share): smallest change in points."""
NOISE_FACTOR = 1.0
"""The change of the median must exceed this many scaled MADs of the noisier run's steps."""
MIN_STEPS = 5
"""Fewest steps per run for any verdict."""

SIGNIFICANT, NOT_SIGNIFICANT, TOO_FEW = "significant", "not significant", "too few steps"
ONE_VALUE = "one value"
"""A figure each run has once (a peak): shown with its delta, never judged."""
PROFILED = "profiled steps"
"""A figure read from the profiler's window: shown with its delta, never judged (the profiler slows the steps it
traces, by an amount that varies from run to run, and a window holds a few steps)."""


@dataclass
class Difference:
    """Run B against run A for one figure, and whether the change is beyond the runs' noise."""

    median_a: float | None
    median_b: float | None
    delta: float | None
    """``median_b - median_a`` in the figure's unit."""
    delta_pct: float | None
    """``delta`` in % of ``median_a`` (None when that is 0 or missing)."""
    noise: float
    """The larger scaled MAD of the two runs' steps, in the figure's unit."""
    p_value: float
    steps_a: int
    steps_b: int
    status: str
    """``significant``, ``not significant``, ``too few steps`` or ``one value``."""
    reason: str
    """Which test decided it, in one phrase."""

    @property
    def significant(self) -> bool:
        return self.status == SIGNIFICANT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    points: bool = False,
    step_s: float | None = None,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> Difference:
    """Decide whether ``b``'s steps differ from ``a``'s beyond their noise (see the module docstring).

    Args:
        a: Per-step values of run A (warm-up left out).
        b: Per-step values of run B.
        points: The values are percentages: the effect threshold is :data:`MIN_EFFECT_POINTS` points.
        step_s: Run A's median step time when the values are seconds of a phase: the change must also be
            :data:`MATERIAL_PCT` of it. None: no materiality check.
        min_effect_pct: Smallest relative change of the median that can be significant, in % of ``a``'s median
            (``compare --min-effect-pct``); figures that are percentages keep :data:`MIN_EFFECT_POINTS`.

    Returns:
        The difference with its decision.
    """
    n_a, n_b = len(a), len(b)
    med_a = median(a) if a else None
    med_b = median(b) if b else None
    if med_a is None or med_b is None:
        return Difference(med_a, med_b, None, None, 0.0, 1.0, n_a, n_b, TOO_FEW, "no steps in one run")
    delta = med_b - med_a
    delta_pct = 100.0 * delta / abs(med_a) if med_a != 0 else None
    noise = max(scaled_mad(a), scaled_mad(b))
    p = mann_whitney_p(a, b)

    def result(status: str, reason: str) -> Difference:
        return Difference(med_a, med_b, delta, delta_pct, noise, p, n_a, n_b, status, reason)

    if min(n_a, n_b) < MIN_STEPS:
        return result(TOO_FEW, f"fewer than {MIN_STEPS} steps in a run")
    if smallest_p(n_a, n_b) >= ALPHA:  # then even runs with no step in common would come out "not significant"
        return result(TOO_FEW, f"{n_a} and {n_b} steps: the rank-sum test cannot reach p < {ALPHA:g}")
    if points:
        if abs(delta) < MIN_EFFECT_POINTS:
            return result(NOT_SIGNIFICANT, f"change below {MIN_EFFECT_POINTS:g} points")
    elif delta_pct is None or abs(delta_pct) < min_effect_pct:
        return result(NOT_SIGNIFICANT, f"change below {min_effect_pct:g}%")
    if abs(delta) <= NOISE_FACTOR * noise:
        return result(NOT_SIGNIFICANT, "within the step-to-step noise")
    if step_s is not None and step_s > 0 and abs(delta) < MATERIAL_PCT / 100.0 * step_s:
        return result(NOT_SIGNIFICANT, f"less than {MATERIAL_PCT:g}% of the step time")
    if p >= ALPHA:
        return result(NOT_SIGNIFICANT, f"rank-sum p = {p:.3g} >= {ALPHA:g}")
    return result(SIGNIFICANT, f"beyond the noise (rank-sum p = {p:.2g})")


def single_difference(a: float | None, b: float | None) -> Difference:
    """A figure each run has once (a peak over the run): its delta, and no verdict, having no noise to judge by."""
    delta = None if a is None or b is None else b - a
    pct = 100.0 * delta / abs(a) if delta is not None and a else None
    return Difference(a, b, delta, pct, 0.0, 1.0, int(a is not None), int(b is not None), ONE_VALUE,
                      "one value per run: no step-to-step noise to judge it by")
