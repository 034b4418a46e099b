"""Is memory growing: the one judge of a rank's memory that keeps rising from one logging step to the next, used by
the memory logger, the step timer and the analysis alike."""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any


@dataclass
class MemoryGrowth:
    """Memory of one rank that kept rising from one logging step to the next: a leak, or a cache that grows.

    ``rate_mb_per_step`` is the median of the judged intervals' slopes, so one odd sample moves it little.
    """

    rank: int
    rate_mb_per_step: float
    growth_pct: float
    """What the judged intervals added, in % of the memory at the first one."""
    first_step: int
    """Where the first judged interval starts (the first interval is left out as warm-up when there are enough)."""
    last_step: int
    first_mb: float
    last_mb: float
    rises: int
    intervals: int
    threshold_pct: float
    what: str = "memory"
    """What was sampled (``allocated CUDA memory``, ``process RSS``)."""

    @property
    def message(self) -> str:
        """The warning a user reads."""
        return (
            f"rank {self.rank}: {self.what} grows {self.rate_mb_per_step:.1f} MiB per step "
            f"({self.first_mb:.0f} -> {self.last_mb:.0f} MiB, +{self.growth_pct:.1f}% from step {self.first_step} "
            f"to {self.last_step}; rose in {self.rises} of {self.intervals} logging intervals; threshold "
            f"{self.threshold_pct:g}%): look for tensors kept across steps (losses appended to a list without "
            ".item(), caches, hooks holding activations)"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message}


def memory_growth(
    steps: Sequence[int],
    values_mb: Sequence[float],
    threshold_pct: float,
    rank: int = 0,
    what: str = "memory",
    min_points: int = 4,
    distorted: Sequence[bool] | None = None,
) -> MemoryGrowth | None:
    """A rank's memory that keeps rising across logging steps; None when it does not.

    Judged over the intervals between consecutive samples. Intervals marked ``distorted`` are left out (the
    profiler's own buffers grow the process's RSS while it traces), and so is the first interval (warm-up:
    optimizer state and allocator caches appear in the first steps) when ``min_points - 1`` intervals remain
    without it. Raised when ``min_points - 1`` intervals or more are judged, memory rose in at least 3 of 4
    of them (a saw-tooth of caches filling and freeing is not growth), and what they added is more than
    ``threshold_pct`` of the memory at the first one judged. The rate is the median of the intervals'
    slopes, so one odd sample moves it little.

    Args:
        steps: The optimizer step of each sample, increasing.
        values_mb: The memory at those steps, in MB.
        threshold_pct: Growth below this is not reported.
        rank: The rank the samples are of (named in the result).
        what: What was sampled, for the message.
        min_points: Fewest samples to judge (``min_points - 1`` intervals).
        distorted: Per sample, whether the interval that ends at it is to be left out (the first entry is
            not used).
    """
    if len(steps) != len(values_mb) or (distorted is not None and len(distorted) != len(steps)):
        raise ValueError(f"{len(steps)} steps but {len(values_mb)} values")
    intervals = [(i - 1, i) for i in range(1, len(steps)) if not (distorted is not None and distorted[i])]
    if len(intervals) > min_points - 1:
        intervals = intervals[1:]
    if len(intervals) < min_points - 1 or values_mb[intervals[0][0]] <= 0:
        return None
    deltas = [values_mb[j] - values_mb[i] for i, j in intervals]
    rises = sum(d > 0 for d in deltas)
    base = float(values_mb[intervals[0][0]])
    growth = 100.0 * sum(deltas) / base
    if rises < 0.75 * len(intervals) or growth <= threshold_pct:
        return None
    slopes = [d / (steps[j] - steps[i]) for (i, j), d in zip(intervals, deltas) if steps[j] != steps[i]]
    return MemoryGrowth(
        rank=rank, rate_mb_per_step=median(slopes) if slopes else 0.0, growth_pct=growth,
        first_step=int(steps[intervals[0][0]]), last_step=int(steps[intervals[-1][1]]), first_mb=base,
        last_mb=base + sum(deltas), rises=rises, intervals=len(intervals), threshold_pct=threshold_pct, what=what,
    )


class _Samples:
    """One rank's samples, and running figures over the intervals between them that are not left out (distorted), so
    that most samples are judged without a pass over all of them (:meth:`GrowthWatch.add`)."""

    __slots__ = ("steps", "values", "distorted", "count", "total", "size", "rises", "first", "second_start")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[float] = []
        self.distorted: list[bool] = []
        self.count = 0  # intervals not left out
        self.total = 0.0  # their deltas' sum
        self.size = 0.0  # the sum of their sizes (what bounds the running sum's rounding)
        self.rises = 0  # how many rose
        self.first: tuple[int, float] = (0, 0.0)  # the first one's start (a sample's index) and delta
        self.second_start = 0  # the second one's start

    def append(self, step: int, value_mb: float, distorted: bool) -> None:
        if self.steps and not distorted:
            delta = value_mb - self.values[-1]
            if self.count == 0:
                self.first = (len(self.steps) - 1, delta)
            elif self.count == 1:
                self.second_start = len(self.steps) - 1
            self.count += 1
            self.total += delta
            self.size += abs(delta)
            self.rises += delta > 0
        self.steps.append(step)
        self.values.append(value_mb)
        self.distorted.append(distorted)

    def surely_none(self, threshold_pct: float, min_points: int = 4) -> bool:
        """Whether :func:`memory_growth` is sure to find no growth, from the running figures alone: too few intervals,
        too few rises, or what they added clearly under the threshold. The running sum may differ from a fresh one by
        its rounding, at most about (intervals x machine epsilon x the sum of the deltas' sizes): a growth within that
        (and 1e-6 besides) of the threshold is left to :func:`memory_growth`."""
        start, delta = self.first
        if self.count > min_points - 1:  # the first interval is left out as warm-up
            judged, total, rises = self.count - 1, self.total - delta, self.rises - (delta > 0)
            start = self.second_start
        else:
            judged, total, rises = self.count, self.total, self.rises
        base = self.values[start] if self.count else 0.0
        if judged < min_points - 1 or base <= 0 or rises < 0.75 * judged:
            return True
        rounding = 100.0 * (self.count + 2) * 2.3e-16 * (self.size + abs(delta)) / base
        return 100.0 * total / base < threshold_pct - 1e-6 - rounding


class GrowthWatch:
    """Every rank's memory in use at each logging step, and the growth verdict over it (rank 0 keeps it).

    A sample is judged in constant time while the running figures show no growth (:meth:`_Samples.surely_none`), by a
    pass over every sample (:func:`memory_growth`) otherwise: judging every sample afresh took 2.3 ms at 10,000
    samples, which a long run with memory logged often would pay at every sample.

    Args:
        threshold_pct: ``--memory-growth-threshold-pct``.
        what: What is sampled (``process RSS``, ``allocated CUDA memory``), for the message.
        distorting: Steps whose memory is not the run's own (the profiler's traced steps, whose buffers grow
            the RSS): an interval that holds one is left out. None: every interval counts.
        start: The step training (re)started at: the first sample's interval begins after it.
    """

    def __init__(
        self, threshold_pct: float, what: str, distorting: Callable[[int], bool] | None = None, start: int = 0
    ) -> None:
        self.threshold_pct, self.what, self.distorting, self.start = threshold_pct, what, distorting, start
        self._samples: dict[int, _Samples] = {}
        self._raised: dict[int, bool] = {}

    def add(self, rank: int, step: int, value_mb: float) -> MemoryGrowth | None:
        """Record a sample; returns the verdict when it held at this sample and at the previous one. A sample that is
        not a number (a memory read that failed: NaN) is no sample: the intervals run from the last one read."""
        if not math.isfinite(value_mb):
            return None
        samples = self._samples.setdefault(rank, _Samples())
        previous = samples.steps[-1] if samples.steps else self.start
        hit = self.distorting is not None and any(self.distorting(s) for s in range(previous + 1, step + 1))
        samples.append(step, value_mb, hit)
        verdict = None if samples.surely_none(self.threshold_pct) else self.verdict(rank)
        held_before, self._raised[rank] = self._raised.get(rank, False), verdict is not None
        return verdict if held_before else None

    def verdict(self, rank: int) -> MemoryGrowth | None:
        """The growth verdict over ``rank``'s samples so far (None: no growth, or no samples)."""
        if rank not in self._samples:
            return None
        s = self._samples[rank]
        return memory_growth(s.steps, s.values, self.threshold_pct, rank=rank, what=self.what, distorted=s.distorted)

    def verdicts(self) -> list[MemoryGrowth]:
        """Every rank's raised verdict, in rank order."""
        return [v for v in map(self.verdict, sorted(self._samples)) if v is not None]
