"""The statistics every verdict uses, with its one significance level: pure functions, no torch, no I/O.

:data:`ALPHA` is the level of every test a finding rests on: the arrival-order tests of the slow-rank verdicts
(:mod:`hf_distprof.core.verdicts`) and the rank-sum test of a comparison between runs
(:mod:`hf_distprof.core.difference`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median
from typing import Any

ALPHA = 0.02
"""Largest chance probability of the arrival-order evidence that still counts as a verdict. Stricter than
the usual 0.05 because each run asks several such questions (the live verdict, the straggler and the
imbalance verdicts of the analysis): about 0.05 / 3. Two ranks then need 6 steps, 8 ranks 2."""


MAD_SCALE = 1.4826
"""Median absolute deviation -> standard deviation for normally distributed noise."""


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if n <= 1000:  # exact
        return min(1.0, sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k, n + 1)))
    # In log space: math.comb(n, i) overflows a float past n ~ 1000 (long runs keep thousands of steps).
    lp, lq, lnf = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = sum(
        math.exp(lnf - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq) for i in range(k, n + 1)
    )
    return min(1.0, total)


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool), else None: the one check of a number read
    from a file (JSON documents, the step timer's records, the run manifest)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; 0 for no values (an empty table reads as zero, never as an error)."""
    return sum(values) / len(values) if values else 0.0


def scaled_mad(values: Sequence[float]) -> float:
    """Median absolute deviation, scaled to a standard deviation for normal noise; 0 for fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    mid = median(values)
    return MAD_SCALE * median(abs(v - mid) for v in values)


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of ``values`` (the 25%-trimmed mean; quarter steps weighed by their share when the
    count is not a multiple of 4): robust to up to a quarter of outliers on either side, as the median is, and,
    unlike the median, the middle of a two-level series (a rank slow by 30 ms in every other step: 15 ms, where the
    median lands on either level, 0 or 30 ms, by one step's chance)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("interquartile_mean of no values")
    lo, hi = n / 4.0, 3.0 * n / 4.0
    total = 0.0
    for i, v in enumerate(ordered):  # value i covers [i, i + 1) of the sorted line; its share inside [lo, hi)
        share = min(i + 1.0, hi) - max(float(i), lo)
        if share > 0:
            total += share * v
    return total / (hi - lo)


def fisher_p(p1: float, p2: float) -> float:
    """Fisher's combination of two independent p-values: P(chi2 with 4 degrees of freedom >= -2 ln(p1 p2))."""
    q = max(p1, 0.0) * max(p2, 0.0)
    return 0.0 if q <= 0.0 else min(1.0, q * (1.0 - math.log(q)))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U (Wilcoxon rank-sum) test.

    The normal approximation with the tie correction and a continuity correction (what
    ``scipy.stats.mannwhitneyu(method="asymptotic")`` does); good from about 5 values per side.

    Args:
        a: One sample.
        b: The other sample.

    Returns:
        The p-value; 1.0 when either sample is empty or every value is tied.
    """
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = sorted([(float(v), 0) for v in a] + [(float(v), 1) for v in b])
    ranks = [0.0] * len(pooled)
    tie_term = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2.0 + 1.0  # mid-rank of the tied group, ranks counted from 1
        t = j - i + 1
        tie_term += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u1 = r1 - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    mean_u = n1 * n2 / 2.0
    var_u = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var_u <= 0:
        return 1.0
    z = (abs(u1 - mean_u) - 0.5) / math.sqrt(var_u)
    if z <= 0:
        return 1.0
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest p-value :func:`mann_whitney_p` can give for samples of ``n_a`` and ``n_b`` values: that of two
    samples with no value in common."""
    return mann_whitney_p(range(n_a), range(n_a, n_a + n_b))
