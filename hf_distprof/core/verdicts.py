"""The one place where measured numbers become a verdict: is a rank slow, is a share too high, is the
profiler distorting the run, is memory uneven or growing.

Pure functions over per-step (or per-window) numbers; no torch, no I/O. The live step timer and the
offline trace analyzer both call these, with the same thresholds, so the two cannot disagree about what a
figure means or when it is worth a warning.

A verdict is raised only when the evidence holds up against the run's own noise:

- **effect size**: the slow rank's median excess over its peers is above the user's threshold *and*
  above the step-to-step variation the run itself shows, and at least 5% of the step time;
- **persistence / arrival order**: the rank is the slowest (the last to arrive) in most steps, and more
  often than chance would make it: with ``R`` ranks each is last with probability ``1/R`` in a clean
  run, so being last in ``k`` of ``n`` steps must have a binomial tail probability below ``alpha``. Last
  in 11 of 12 steps of 3 ranks (p < 0.001) is a straggler; last in 6 of 12 (p = 0.07) is noise. With 2
  ranks this is the sign test of their per-step difference: slower in 20 of 24 steps is p < 0.001, in 15
  of 24 p = 0.15. Only the count, not the size of each step's difference, because the noise of a shared
  host is one-sided: a step in which one rank stalls (a core taken by other work, a slower core for a few
  seconds) is a large positive excess, never as large a negative one, and a test that weighs sizes (the
  Wilcoxon signed-rank test, which this used to be) read a few such stalls as persistence: over 31 clean
  2-rank CPU runs beside a busy core it named a rank in 7, slowest in as few as 15 of 24 steps, where the
  count names 4, each the slowest in 18 to 22 of 24 (``docs/measurements.md``). (The candidate is chosen by
  the data, so for 2 ranks the two-sided level is ``2 alpha``; the effect-size and materiality gates are
  what keep clean runs quiet.)
- **enough data**: when even "last in every step" could not reach ``alpha`` (2 ranks need 6 steps,
  8 ranks need 2), the answer is "not enough evidence", never a verdict.

``confidence`` is ``1 - p`` of the persistence test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from hf_distprof.core.stats import ALPHA, binomial_tail, scaled_mad

MOST = 0.5
"""A slow rank must be the slowest in more than this share of the steps."""
MATERIAL_PCT = 5.0
"""A slow rank must cost its peers at least this % of the step (their wait) to be worth a finding: a rank
whose own work is 30% longer, but 4 ms of a 180 ms communication-bound step, changes nothing."""

RAISED, QUIET, UNDECIDED = "raised", "quiet", "undecided"


@dataclass
class SlowRankVerdict:
    """Whether one rank is slower than its peers, and the evidence either way.

    Percentages are of ``scale`` (the peers' own value for work imbalance, the step time for lateness).
    """

    status: str
    """``raised`` (a finding), ``quiet`` (no finding) or ``undecided`` (not enough evidence)."""
    rank: int | None
    """The candidate: the rank with the largest median excess (None with fewer than 2 ranks or no step)."""
    effect_pct: float
    """The candidate's median excess over the median of the other ranks, per step."""
    threshold_pct: float
    noise_pct: float
    """Step-to-step variation of the ranks' own values (scaled MAD, median over ranks)."""
    slowest_in: int
    """Steps in which the candidate was the slowest rank."""
    steps: int
    ranks: int
    p_value: float
    """Chance of evidence this strong in a balanced run: of being the slowest in ``slowest_in`` of ``steps``
    steps or more (binomial, ``1/ranks`` per step)."""
    min_steps: int
    """Fewest steps in which any verdict is possible with this many ranks."""
    reason: str
    """One sentence: why this status."""
    effect_abs: float = 0.0
    """The candidate's median excess in the values' own unit (seconds, microseconds)."""
    also: list[int] = field(default_factory=list)
    """With 3+ ranks, other ranks that pass the same tests beside the candidate (a late minority)."""
    per_step_excess_pct: list[float] = field(default_factory=list)
    gate: str = ""
    """Which test kept a ``quiet`` verdict quiet: ``threshold``, ``floor`` (above the threshold, but by no more than
    the absolute floor ``min_abs``), ``material``, ``noise``, ``persistence`` or ``stand_out`` (empty when raised,
    undecided, or nothing to compare)."""
    test: str = "binomial"
    """Which persistence test gave ``p_value``: ``binomial`` (arrival order; with the step timer's records, what
    :func:`hf_distprof.core.run_verdict.across_the_run` or :func:`~hf_distprof.core.run_verdict.follow_the_run` add to
    it)."""
    claim: str = ""
    """The effect in words, which the reasons build on ("rank 1's pre-sync work exceeds its peers' by a median
    20.1%"); empty with nothing to compare."""
    to_decide: str = ""
    """With ``undecided``: what would decide it (more traced steps, the step timer over more steps); else empty."""
    cost_pct: float | None = None
    """What the candidate's peers wait for it: its excess in % of the step time, median over the steps (the materiality
    test's figure); None when no step times were given."""
    confidence: float = field(init=False)
    """``1 - p_value``: how unlikely the arrival order is in a balanced run."""

    def __post_init__(self) -> None:
        self.confidence = 1.0 - self.p_value

    @property
    def raised(self) -> bool:
        return self.status == RAISED

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


QUIET_WHY = {
    "threshold": "under the threshold",
    "floor": "too few microseconds to tell from scheduling noise",
    "material": "too small a share of the step to matter",
    "noise": "within the run's noise",
    "persistence": "not the slowest in enough steps",
    "stand_out": "not standing out from the other ranks",
    "outside": "slow in the traced window only",
}
"""Why a quiet verdict is quiet, by the gate that kept it so (:attr:`SlowRankVerdict.gate`), in a few words: what the
step timer's table and the analysis's box say beside the slowest rank."""


def min_steps(ranks: int, alpha: float = ALPHA) -> int:
    """Fewest steps in which "slowest in every step" is below ``alpha`` for ``ranks`` ranks."""
    if ranks < 2:
        return 0
    return max(1, math.floor(math.log(alpha) / math.log(1.0 / ranks)) + 1)


def imbalance_pct(values: Sequence[float]) -> float:
    """How much more the largest value is than the median of the others, in %.

    The one definition of imbalance: for work per rank (pre-sync time, busy time, peak memory) it says how
    much longer the slowest rank works than a typical peer, which is what the others wait for. 0 for
    fewer than two values or a zero median.
    """
    if len(values) < 2:
        return 0.0
    top = max(range(len(values)), key=lambda i: values[i])
    others = median(v for i, v in enumerate(values) if i != top)
    return 100.0 * (values[top] / others - 1.0) if others > 0 else 0.0


def medians_of_the_others(values: Sequence[float]) -> list[float]:
    """For each value, the median of all the others: O(n log n), not O(n^2), so 1000 ranks stay cheap."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    order = sorted(range(n), key=lambda i: values[i])
    ranked = [values[i] for i in order]
    position = {i: p for p, i in enumerate(order)}

    def at(k: int, skip: int) -> float:  # k-th smallest of the values without the one ranked ``skip``
        return ranked[k] if k < skip else ranked[k + 1]

    m = n - 1
    out = []
    for i in range(n):
        p = position[i]
        out.append(at(m // 2, p) if m % 2 else (at(m // 2 - 1, p) + at(m // 2, p)) / 2.0)
    return out


def per_step_excess(
    per_step: Mapping[int, Sequence[float]], ranks: Sequence[int], n: int, scale: Sequence[float] | None
) -> tuple[dict[int, list[float]], dict[int, list[float]], dict[int, int]]:
    """Each rank's excess over the median of the other ranks in each of the first ``n`` steps, in % of that median
    (or of ``scale[s]``; 0 where the denominator is not positive) and in the values' unit, and in how many steps
    each rank is the slowest (the first of ``ranks`` on a tie).

    In numpy, one array of steps x ranks: the step timer judges up to :data:`KEPT_CELLS` values on every logging
    step, which a loop over the steps took 40-180 ms to do. Exactly the loop's results (the same operations on the
    same float64 values in the same order: ``tests/unit/test_verdicts.py`` holds the loop and compares) for finite
    values; with a NaN or an infinity among them (numpy and Python order NaN differently) the loop itself runs, and so
    it does for a table of at most :data:`LOOP_CELLS` values (a traced window's: 3-60 steps of a few ranks), where
    the loop takes a few milliseconds and importing numpy (in ``analyze``'s parent process, which imports it for
    nothing else) would take 45."""
    if n * len(ranks) <= LOOP_CELLS:
        return _per_step_excess_loop(per_step, ranks, n, scale)
    return _per_step_excess_numpy(per_step, ranks, n, scale)


LOOP_CELLS = 2048
"""Tables of steps x ranks up to this size are judged by the loop (:func:`per_step_excess`)."""


def _per_step_excess_numpy(
    per_step: Mapping[int, Sequence[float]], ranks: Sequence[int], n: int, scale: Sequence[float] | None
) -> tuple[dict[int, list[float]], dict[int, list[float]], dict[int, int]]:
    """:func:`per_step_excess` in numpy (its exact results; the loop's for a NaN or an infinity)."""
    import numpy as np  # imported when first needed: the analysis's parent process stays without numpy's threads

    values = np.array([[float(v) for v in per_step[r][:n]] for r in ranks], dtype=np.float64).T  # (n, R)
    if not np.isfinite(values).all() or (scale is not None and not np.isfinite(np.array(scale[:n], float)).all()):
        return _per_step_excess_loop(per_step, ranks, n, scale)
    width = len(ranks)
    slowest = np.bincount(np.argmax(values, axis=1), minlength=width)
    order = np.argsort(values, axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(width), order.shape), axis=1)

    def at(k: int) -> np.ndarray:  # the k-th smallest of each step's values without the rank's own
        return np.where(k < position, ranked[:, [k]], ranked[:, [k + 1]])

    m = width - 1
    others = at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2.0
    denom = others if scale is None else np.array([float(x) for x in scale[:n]], dtype=np.float64)[:, None]
    denom = np.broadcast_to(denom, values.shape)
    diff = values - others
    pct = np.divide(100.0 * diff, denom, out=np.zeros_like(diff), where=denom > 0)
    return ({r: pct[:, i].tolist() for i, r in enumerate(ranks)},
            {r: diff[:, i].tolist() for i, r in enumerate(ranks)},
            {r: int(slowest[i]) for i, r in enumerate(ranks)})


def _per_step_excess_loop(
    per_step: Mapping[int, Sequence[float]], ranks: Sequence[int], n: int, scale: Sequence[float] | None
) -> tuple[dict[int, list[float]], dict[int, list[float]], dict[int, int]]:
    """:func:`per_step_excess` one step at a time, for values numpy would order differently (NaN)."""
    excess: dict[int, list[float]] = {r: [] for r in ranks}
    excess_abs: dict[int, list[float]] = {r: [] for r in ranks}
    slowest_count = dict.fromkeys(ranks, 0)
    for s in range(n):
        values = {r: float(per_step[r][s]) for r in ranks}
        slowest_count[max(ranks, key=lambda r: values[r])] += 1
        for r, others in zip(ranks, medians_of_the_others([values[r] for r in ranks]), strict=True):
            denom = others if scale is None else float(scale[s])
            excess_abs[r].append(values[r] - others)
            excess[r].append(100.0 * (values[r] - others) / denom if denom > 0 else 0.0)
    return excess, excess_abs, slowest_count


@dataclass(frozen=True)
class Candidate:
    """The rank a slow-rank verdict would weigh: the largest median excess over its peers (:func:`candidate`)."""

    rank: int
    effect_pct: float
    """Its median excess over the median of the other ranks, per step, in % (of ``scale`` when given)."""
    effect_abs: float
    """The same in the values' own unit."""
    slowest_in: int
    """Steps in which it was the slowest rank."""


def _candidate(ranks: Sequence[int], excess: Mapping[int, Sequence[float]], slowest_count: Mapping[int, int]) -> int:
    """The rank with the largest median excess; among equals, the slowest in more steps (then the first)."""
    return max(ranks, key=lambda r: (median(excess[r]), slowest_count[r]))


def candidate(per_step: Mapping[int, Sequence[float]], scale: Sequence[float] | None = None) -> Candidate | None:
    """The rank :func:`judge_slow_rank` would judge for ``per_step`` (the same choice, whatever the verdict): the one
    fact the what-if's pace and the verdicts share. None with fewer than 2 ranks or no step."""
    ranks = sorted(per_step)
    n = min((len(per_step[r]) for r in ranks), default=0)
    if len(ranks) < 2 or n == 0:
        return None
    excess, excess_abs, slowest_count = per_step_excess(per_step, ranks, n, scale)
    rank = _candidate(ranks, excess, slowest_count)
    return Candidate(rank, median(excess[rank]), median(excess_abs[rank]), slowest_count[rank])


def judge_slow_rank(
    per_step: Mapping[int, Sequence[float]],
    threshold_pct: float,
    *,
    scale: Sequence[float] | None = None,
    min_abs: float = 0.0,
    abs_unit: str = "",
    abs_floor_is: str = "an excess is noise",
    alpha: float = ALPHA,
    what: str = "its work",
    step_time: Sequence[float] | None = None,
    min_step_pct: float = MATERIAL_PCT,
) -> SlowRankVerdict:
    """Decide whether one rank is slower than the others, step by step.

    Args:
        per_step: rank -> its value in each step (same steps, same order for every rank); larger is
            slower (pre-sync work, busy time, lateness at collectives).
        threshold_pct: The user's threshold for the median excess, in % of ``scale``.
        scale: Per-step denominators (the step time, for lateness). None: the median of the other
            ranks' values in that step (relative excess of work).
        min_abs: The median excess must also be above this, in the values' unit (scheduler noise floor).
        abs_unit: The values' unit as the reason writes it after a number (" us").
        abs_floor_is: What an excess under ``min_abs`` is, for the reason ("... below which <this>").
        alpha: See :data:`ALPHA`.
        what: How the evidence names the values ("its pre-sync work", "its arrival at collectives").
        step_time: Per-step step times (same unit as the values): the median excess must also be more than
            ``min_step_pct`` of them (materiality). None: no such check.
        min_step_pct: See :data:`MATERIAL_PCT`.

    Returns:
        The verdict; ``raised`` only when effect, noise, persistence and enough-data all agree.
    """
    ranks = sorted(per_step)
    n = min((len(per_step[r]) for r in ranks), default=0)
    need = min_steps(len(ranks), alpha)
    if len(ranks) < 2 or n == 0:
        return SlowRankVerdict(QUIET, None, 0.0, threshold_pct, 0.0, 0, n, len(ranks), 1.0, need,
                               "fewer than 2 ranks or no step to compare")
    excess, excess_abs, slowest_count = per_step_excess(per_step, ranks, n, scale)
    candidate = _candidate(ranks, excess, slowest_count)
    effect = median(excess[candidate])
    effect_abs = median(excess_abs[candidate])
    noise = median(_noise_pct(per_step[r][:n], scale) for r in ranks)
    k = slowest_count[candidate]
    test, p = "binomial", binomial_tail(k, n, 1.0 / len(ranks))
    order = f"it is the slowest in {k} of {n} steps (p = {p:.3f} in a balanced run of {len(ranks)} ranks)"
    of = " of the step" if scale is not None else ""  # (else of its peers' value: "17.7%" more work than theirs)
    late = f"rank {candidate}'s {what} exceeds its peers' by a median {effect:.1f}%{of}"
    cost = None if step_time is None else median(
        100.0 * e / t if t > 0 else 0.0 for e, t in zip(excess_abs[candidate], step_time))
    base = dict(rank=candidate, effect_pct=effect, threshold_pct=threshold_pct, noise_pct=noise, slowest_in=k,
                steps=n, ranks=len(ranks), p_value=p, min_steps=need, effect_abs=effect_abs,
                per_step_excess_pct=excess[candidate], test=test, claim=late, cost_pct=cost)
    if effect <= threshold_pct:
        return SlowRankVerdict(QUIET, **base, gate="threshold",
                               reason=f"{late}, within the {threshold_pct:g}% threshold")
    if effect_abs <= min_abs:
        return SlowRankVerdict(QUIET, **base, gate="floor", reason=(
            f"{late}, above the {threshold_pct:g}% threshold but by {effect_abs:.4g}{abs_unit}, not more than the "
            f"{min_abs:g}{abs_unit} below which {abs_floor_is}"))
    if cost is not None:
        if cost <= min_step_pct:
            return SlowRankVerdict(
                QUIET, **base, gate="material",
                reason=f"{late}, but that costs its peers only {cost:.1f}% of the step (less than {min_step_pct:g}%)",
            )
    # Whether the candidate stands out from its peers is no question of the number of steps: in steps where several
    # ranks are late together, none of them is the straggler (a trial: "undecided, trace 2 steps" where two ranks
    # arrived 0.5 ms before the candidate, 7 ms after the others).
    def together(standing_out: set[int]) -> SlowRankVerdict | None:
        if len(ranks) < 3 or candidate in standing_out:
            return None
        few = f" (in {n} step{'s' if n != 1 else ''}, too few to tell more: at least {need} are needed)" if n < need \
            else ""
        return SlowRankVerdict(
            QUIET, **base, gate="stand_out",
            reason=f"{late}, but it does not stand out from the spread across the {len(ranks)} ranks (3 scaled "
            f"median absolute deviations): several ranks are behind together, not one straggler{few}")

    if n < need:
        quiet = together(_standing_out({r: per_step[r][:n] for r in ranks}))
        if quiet is not None:
            return quiet
        return SlowRankVerdict(
            UNDECIDED, **base,
            reason=f"not enough evidence: {late} (threshold {threshold_pct:g}%), but {n} steps of {len(ranks)} "
            f"ranks cannot tell a slow rank from chance; at least {need} are needed",
        )
    if effect <= noise:
        return SlowRankVerdict(
            QUIET, **base, gate="noise",
            reason=f"{late}, but the run's own step-to-step variation is {noise:.1f}%: within the noise",
        )
    if k <= MOST * n or p >= alpha:
        return SlowRankVerdict(QUIET, **base, gate="persistence", reason=f"{late}, but {order}: not persistent")
    standing_out = _standing_out({r: per_step[r][:n] for r in ranks})
    quiet = together(standing_out)
    if quiet is not None:
        return quiet
    also = [
        r for r in ranks
        if r != candidate and r in standing_out and median(excess[r]) > max(threshold_pct, noise)
        and median(excess_abs[r]) > min_abs and sum(e > 0 for e in excess[r]) > MOST * n
    ]
    return SlowRankVerdict(
        RAISED, **base, also=also,
        reason=f"{late} (threshold {threshold_pct:g}%, step-to-step noise {noise:.1f}%); {order}",
    )


OWN_WORK = "pre-sync work (data + forward + backward compute, less its wait for a CPU)"
"""What the step timer compares across ranks (``own_work_s`` in its records), as its verdicts name it."""
ARRIVAL = "pre-sync time (data + forward + backward compute, its wait for a CPU included)"
"""What its peers wait for at the gradient sync (``pre_sync_s`` in the step timer's records)."""
KEPT_CELLS = 20_000
"""Step x rank values the step timer's verdict judges at most (the latest steps): bounds its memory and time
(40-180 ms per verdict on this machine at this size, 2 to 1024 ranks), whatever the run's length and world size."""


def judge_own_work(
    own_work: Mapping[int, Sequence[float]], threshold_pct: float, step_time: Sequence[float]
) -> SlowRankVerdict:
    """The step timer's slow-rank verdict: each rank's own work per step (pre-sync time less its wait for a CPU;
    on GPU, pre-sync device time) against its peers', material against the step time.

    The one rule for the live timer (:class:`hf_distprof.timing.report.StepSeries`) and for the analysis, which
    judges the timer's records of the untraced steps again (:mod:`hf_distprof.analysis.read.timer_records`).
    """
    return judge_slow_rank(own_work, threshold_pct, what=OWN_WORK, step_time=step_time)


def judge_run(
    own_work: Mapping[int, Sequence[float]], arrival: Mapping[int, Sequence[float]], threshold_pct: float,
    own_step: Sequence[float], step_time: Sequence[float],
) -> SlowRankVerdict:
    """The step timer's slow-rank verdict over a run's steps: the live timer's and the analysis's one rule.

    First each rank's own work (:func:`judge_own_work`: its wait for a CPU taken out, so that a busy host does not
    pass for a slow rank); when that names no rank, its pre-sync time with the wait included (:data:`ARRIVAL`),
    material against the whole step: a rank whose peers wait for it beyond the noise is named whatever the cause,
    its machine included (:mod:`hf_distprof.core.cause` says which).

    Args:
        own_work: rank -> its own work per step.
        arrival: rank -> its pre-sync time per step, its wait for a CPU included (the same steps).
        threshold_pct: The slow-rank threshold.
        own_step: Per step, the step less the ranks' wait for a CPU (own work's materiality).
        step_time: Per step, the step time (the arrival's materiality).
    """
    work = judge_own_work(own_work, threshold_pct, own_step)
    if work.raised or not arrival:
        return work
    waited = judge_slow_rank(arrival, threshold_pct, what=ARRIVAL, step_time=step_time)
    return waited if waited.raised else work


def _standing_out(per_step: Mapping[int, Sequence[float]]) -> set[int]:
    """Ranks whose median value is more than 3 scaled MADs above the median rank's (3+ ranks only)."""
    if len(per_step) < 3:
        return set(per_step)
    mids = {r: median(v) for r, v in per_step.items()}
    center = median(mids.values())
    spread = scaled_mad(list(mids.values()))
    return {r for r, m in mids.items() if m - center > 3.0 * spread}


def _noise_pct(values: Sequence[float], scale: Sequence[float] | None) -> float:
    """Step-to-step variation of one rank's values in % (of their median, or of the median scale)."""
    if len(values) < 2:
        return 0.0
    denom = median(values) if scale is None else median(scale[: len(values)])
    return 100.0 * scaled_mad(values) / denom if denom > 0 else 0.0


@dataclass
class ShareVerdict:
    """Whether a per-step share (exposed communication, data loading) is above its threshold."""

    status: str
    median_pct: float
    threshold_pct: float
    above_in: int
    steps: int
    reason: str

    @property
    def raised(self) -> bool:
        return self.status == RAISED

    @property
    def confidence(self) -> float:
        """Share of the steps above the threshold."""
        return self.above_in / self.steps if self.steps else 0.0


def judge_share(per_step_pct: Sequence[float], threshold_pct: float, what: str) -> ShareVerdict:
    """A share is a finding when its median over steps is above the threshold, most steps are, and, when some step is
    not, the median is above it by more than the steps' own spread allows (their scaled MAD over the square root of
    their count). Every step above it is above it, whatever the spread (a worse step never silences a finding).

    So one slow data fetch among several steps is not a data-bound run, nor are three traced steps at 12.8, 6.4 and
    10.3% a run above 10% (a trial's clean run: "Data-loading bound" beside a what-if that found no saving).
    """
    n = len(per_step_pct)
    if n == 0:
        return ShareVerdict(QUIET, 0.0, threshold_pct, 0, 0, "no step")
    mid = median(per_step_pct)
    above = sum(v > threshold_pct for v in per_step_pct)
    text = f"{what} is {mid:.1f}% of the step (median of {n} steps), above {threshold_pct:g}% in {above} of {n}"
    if mid <= threshold_pct or above <= MOST * n:
        return ShareVerdict(QUIET, mid, threshold_pct, above, n, text)
    spread = scaled_mad(per_step_pct) / math.sqrt(n)
    if above < n and mid - threshold_pct <= spread:
        return ShareVerdict(QUIET, mid, threshold_pct, above, n, f"{text}, within its step-to-step noise "
                            f"(+-{spread:.1f} points)")
    # No comparison with chance beyond that: one traced step already measures a share (HTA reports a one-step trace's
    # shares too).
    return ShareVerdict(RAISED, mid, threshold_pct, above, n, text)


