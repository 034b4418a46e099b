"""``--profile-ranks auto``: which ranks trace a window, the slowest rank and the median rank.

The evidence is each rank's pre-sync work per step (data loading + forward + the compute part of backward, less its
wait for a CPU: :attr:`hf_distprof.timing.recorder.StepTiming.own_work_s`, what the slow-rank verdict judges): under
DDP every rank's whole step lasts as long as the slowest rank's, so that sum is what tells the ranks apart. (On the
pre-sync time with the wait, a rank of a busy host was traced as "the slowest" that the verdict did not name.) The
ranks send their new step times with the note they gather on each agreement step
(:mod:`hf_distprof.callbacks.profiler.triggers`); every rank builds the same :class:`RankView` from the same gathered
notes, so every rank picks the same ranks for a window, with no collective of its own.

Who is slowest is :func:`hf_distprof.core.verdicts.judge_slow_rank`'s candidate (the rank with the largest median
excess over the others), whether or not its evidence is strong enough for a warning: the window is there to
show why it is slow. The median rank is the typical rank beside it, for comparison.

Nothing here reads a clock, a file or a process group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from hf_distprof.core.verdicts import judge_slow_rank

AUTO = "auto"
# Steps per rank the view keeps (the latest) and judges: recent enough to follow a rank that becomes slow.
VIEW_STEPS = 32
# Fewest ranks for which tracing two of them saves anything: with 1 or 2 ranks every rank is traced.
MIN_RANKS = 3


@dataclass
class RankChoice:
    """Which ranks trace one window, and why; one record of ``profile_ranks.json``.

    Attributes:
        window_first: The window's first step (its warm-up's, when it has one).
        view_step: The agreement step whose gathered step times decided; None when there was none yet.
        ranks: The ranks that trace the window, ascending.
        slowest: The slowest rank by the evidence; None without evidence.
        median: The median rank among the others; None without evidence or with fewer than 3 ranks.
        reason: One sentence: why these ranks.
        steps: The steps judged (untraced ones every rank timed).
        own_work_s: Per rank, its median pre-sync work (less its wait for a CPU) over ``steps``, in seconds.
        verdict: The slow-rank verdict's status over ``steps`` (``raised``, ``quiet``, ``undecided``); None
            without evidence.
    """

    window_first: int
    view_step: int | None
    ranks: list[int]
    slowest: int | None
    median: int | None
    reason: str
    steps: list[int] = field(default_factory=list)
    own_work_s: dict[int, float] = field(default_factory=dict)
    verdict: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready types (rank keys as strings, as JSON has them)."""
        out = asdict(self)
        out["own_work_s"] = {str(r): v for r, v in self.own_work_s.items()}
        return out


class RankView:
    """The live cross-rank view: each rank's latest pre-sync times per step, as gathered on agreement steps.

    Args:
        keep: Steps kept per rank (the latest).
    """

    def __init__(self, keep: int = VIEW_STEPS) -> None:
        self.keep = keep
        self.times: dict[int, dict[int, float]] = {}
        self.updated_at: int | None = None

    def add(self, step: int, rows: Mapping[int, Sequence[tuple[int, float]]]) -> None:
        """Take what each rank sent on agreement step ``step``: ``rank -> [(step, own_work_s), ...]``."""
        for rank, pairs in rows.items():
            times = self.times.setdefault(rank, {})
            times.update((int(s), float(v)) for s, v in pairs)
            for old in sorted(times)[: max(0, len(times) - self.keep)]:
                del times[old]
        self.updated_at = step

    def per_step(self, world_size: int) -> tuple[list[int], dict[int, list[float]]]:
        """The latest steps every rank timed, and each rank's values at them (empty when a rank has none)."""
        if any(r not in self.times for r in range(world_size)):
            return [], {}
        common = set.intersection(*(set(self.times[r]) for r in range(world_size))) if world_size else set()
        steps = sorted(common)[-self.keep:]
        return steps, {r: [self.times[r][s] for s in steps] for r in range(world_size)}


def choose_ranks(view: RankView, world_size: int, window_first: int, threshold_pct: float) -> RankChoice:
    """The ranks that trace the window starting at ``window_first``: the slowest and the median rank.

    With fewer than :data:`MIN_RANKS` ranks every rank (the slowest and the median are all there is). Before the
    view holds a step that every rank timed (a window before the first agreement step that saw one), ranks 0
    and ``world_size - 1``: two ranks as always, the first and the last (on different hosts when there are
    several), and the reason says there was no evidence.

    Args:
        view: The gathered step times (the same on every rank).
        world_size: Ranks in the run.
        window_first: The window's first step.
        threshold_pct: ``--imbalance-threshold-pct``, for the slow-rank verdict recorded beside the choice.

    Returns:
        The choice, with its evidence.
    """
    everyone = list(range(world_size))
    steps, per_step = view.per_step(world_size)
    if not steps:
        if world_size < MIN_RANKS:
            return RankChoice(window_first, None, everyone, None, None,
                              f"{world_size} rank{'s' if world_size != 1 else ''}: every rank traces")
        ranks = sorted({0, world_size - 1})
        return RankChoice(window_first, None, ranks, None, None,
                          "no cross-rank view yet (no untraced step timed on every rank before this window): the "
                          f"first and the last rank, {ranks[0]} and {ranks[-1]}")
    verdict = judge_slow_rank(per_step, threshold_pct, what="its pre-sync work")
    slowest = verdict.rank if verdict.rank is not None else 0
    mids = {r: median(v) for r, v in per_step.items()}
    others = sorted((r for r in everyone if r != slowest), key=lambda r: (mids[r], r))
    typical = others[(len(others) - 1) // 2] if others else None
    span = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
    # (The excess is the verdict's: step by step, not the ratio of the medians beside it.)
    evidence = (f"rank {slowest} is the slowest (median pre-sync work {mids[slowest]:.4f} s; step by step a median "
                f"{verdict.effect_pct:+.1f}% over the others'; slow-rank verdict: {verdict.status})")
    if world_size < MIN_RANKS:
        ranks, reason = everyone, f"{world_size} rank{'s' if world_size != 1 else ''}: every rank traces; {evidence}"
    else:
        assert typical is not None
        ranks = sorted({slowest, typical})
        reason = f"{evidence}; rank {typical} is the median rank ({mids[typical]:.4f} s)"
    return RankChoice(
        window_first, view.updated_at, ranks, slowest, typical if world_size >= MIN_RANKS else None,
        f"{reason}; from {len(steps)} untraced {span}, gathered at step {view.updated_at}",
        steps, mids, verdict.status,
    )
