"""A burst (pure): one rank holding the others back in a few steps only, at a cost the run pays.

The slow-rank verdict (:mod:`hf_distprof.core.verdicts`) names a rank that is slowest in most steps: a rank slow for
five steps of fifty is rightly not "the slow rank", but its peers waited for it all that time (a trial's 0.3 s data
stall in steps 19-23 was half of its peer's run, and no output named it). A burst is that wait, said: the steps in which
one rank's own work exceeded its peers' median by more than the imbalance threshold of the run's median step, in one
stretch (at most one judged step between two of them), at least :data:`MIN_STEPS` of them, adding up to at least
:data:`MATERIAL_PCT` of the run's judged step time without the largest one. One stall is a host's hiccup, and a small
excess over many steps is the verdict's to judge, not a burst; but one stall that alone cost the run
:data:`SINGLE_PCT` of its time is said, as a wait its peers paid once (not as the rank's pattern).

Stalls, apart: the same rank stalling again and again (a slow file every N batches), each stall longer than
:data:`STALL_FACTOR` times that threshold (half the median step at the default 10%: no hiccup of a shared host), at
least two, adding up without the largest to :data:`MATERIAL_PCT` of the run (a trial's two 2-second stalls of one rank's
loader, a third of the run, were said only as anomaly captures that named both ranks alike).

Beside a slow rank (the verdict over the run names one), the same rules, each rank's excess counted beyond its usual one
(its median over the judged steps, when above zero) and only where it stands out from its own spread (more than
:data:`SPREAD_K` scaled MADs of it) in at most :data:`RARE_SHARE` of the steps: the slow rank's usual excess is the
verdict's, a slowness that wobbles, drifts or comes in two levels is its pattern, and what a burst or stalls add on top
is what the others waited for besides (a trial: a rank named for 0.9 ms more loading per step stalled 60 ms in three
steps, half the run, and no output said it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median

from hf_distprof.core.stats import scaled_mad
from hf_distprof.core.verdicts import QUIET_WHY, UNDECIDED, SlowRankVerdict

MIN_STEPS = 3
"""A burst spans at least this many steps (one or two stalls on a shared host are its noise, not a rank's pattern)."""
PHASE_NAMES = {"data": "data loading", "compute": "forward and backward compute"}
"""The phases a burst is put in, as said (the pre-sync parts: loading, and the rest of its own work before the sync)."""
MATERIAL_PCT = 10.0
"""The excess of the burst's steps, summed without its largest, is at least this % of the run's judged step time."""
STALL_FACTOR = 5.0
"""A step apart from a stretch counts as a stall when its excess is more than this many times the burst's floor."""
SPREAD_K = 3.0
"""Beside a slow rank, a step stands out when its excess beyond the rank's usual is more than this many scaled MADs of
the rank's excess (its own step-to-step spread)."""
SINGLE_PCT = 25.0
"""One stall alone is said when it costs the run at least this % of its judged step time (a step some ten times the
median in a run of 30): no hiccup of a shared host, a wait its peers paid (trial U: one rank's 35 s stall, 76% of
the run, was said nowhere, and the table named its peer slowest)."""
RARE_SHARE = 0.25
"""Beside a slow rank, a rank whose steps stand out in more than this share of the steps has no burst or stalls: that is
how it is slow (two levels, a drift), the verdict's to say."""


@dataclass
class Burst:
    """One rank's burst: the steps, what its peers waited for it there, and which phase of its step took it."""

    rank: int
    steps: list[int]
    excess_s: float
    """Its own work over its peers' median, summed over the burst's steps: what they waited for it."""
    pct: float
    """``excess_s`` in % of the run's judged step time."""
    run_s: float
    """The run's judged step time (what ``pct`` is of)."""
    phase: str | None = None
    """The phase of its step with the largest excess in the burst's steps (the step timer's phases), if known."""
    stalls: bool = False
    """Stalls apart (steps not in one stretch), not one burst."""
    beside: int | None = None
    """The run's slow rank, when the verdict named one: the stalls are then counted beyond each rank's usual excess."""
    usual_s: float = 0.0
    """The rank's usual excess per step left out of ``excess_s`` (beside a slow rank; 0 otherwise)."""
    judged: int = 0
    """The run's judged steps (what ``steps`` are among)."""
    gate: str = ""
    """Without a slow rank: which test kept the verdict over the run quiet (:attr:`SlowRankVerdict.gate`), if known."""
    single: bool = False
    """One stall alone (:data:`SINGLE_PCT`): said as a wait its peers paid, not as a pattern of the rank's."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def span(self) -> str:
        """"steps 19-23" or "steps 4, 9, 20-22" ("steps 4, 6, 8, 10, 12, 14, ..., 52, 54" of many)."""
        runs: list[list[int]] = []
        for s in self.steps:
            if runs and s == runs[-1][-1] + 1:
                runs[-1].append(s)
            else:
                runs.append([s])
        said = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
        if len(said) > 10:  # the first and the last few of many
            said = [*said[:6], "...", *said[-2:]]
        return ("step " if len(self.steps) == 1 else "steps ") + ", ".join(said)

    @property
    def phase_name(self) -> str:
        """The phase, as said ("data loading"); empty when unknown."""
        return PHASE_NAMES.get(self.phase, self.phase) if self.phase else ""

    @property
    def what(self) -> str:
        """"in a burst", "in stalls", or, over more than a quarter of the run's steps (a slowness that comes and goes,
        every other step, say), "in 26 of 53 judged steps", as said."""
        if self.single:
            return "in one stall"
        if self.stalls:
            return "in stalls"
        if self.judged and len(self.steps) > RARE_SHARE * self.judged:
            return f"in {len(self.steps)} of {self.judged} judged steps"
        return "in a burst"

    @property
    def message(self) -> str:
        """The finding's sentence, the same in the step timer's table and in ``analyze``."""
        where = f" (its {self.phase_name})" if self.phase else ""
        also = " also" if self.beside == self.rank else ""
        over = "in all, beyond its usual excess" if self.usual_s > 0 else "in all"
        return (f"Rank {self.rank}{also} held the others back {self.what}: {self.span}, its own work "
                f"{self.excess_s:.3f} s over its peers' {over}{where}, {self.pct:.1f}% of the run's {self.run_s:.2f} s "
                f"of judged steps; the others waited for it there ({self.against})")

    @property
    def against(self) -> str:
        """How it stands beside the slow-rank verdict, as said."""
        if self.single:
            return "once: one stall says nothing of its usual speed; --profile-on-anomaly traces the steps after one"
        if self.beside is None:
            if self.gate == "undecided":
                return "the verdict over the run has too few steps to decide whether it is the run's slow rank"
            if self.gate and self.gate != "persistence":  # (a trial: "slowest in too few steps" beside 35 of 53)
                return (f"not the slow rank of the run: the verdict over the run, which judges the median step, is "
                        f"quiet, {QUIET_WHY.get(self.gate, self.gate)}")
            return "not the slow rank of the run: slowest in too few steps"
        if self.beside == self.rank:
            return "on top of its usual excess, which the slow-rank verdict names"
        return f"besides rank {self.beside}, the slow rank of the run"


def find_burst(work: dict[int, list[float]], steps: list[int], step_time: list[float], threshold_pct: float,
               phases: dict[str, dict[int, list[float]]] | None = None, slow_rank: int | None = None,
               gate: str = "") -> Burst | None:
    """The burst of the run's judged steps, if one.

    Args:
        work: rank -> its own work in each judged step (s).
        steps: The judged steps' numbers, in ``work``'s order.
        step_time: The judged steps' times (s).
        threshold_pct: The imbalance threshold (``--imbalance-threshold-pct``): a step is in a burst when the rank's
            excess is more than this % of the run's median step.
        phases: phase -> rank -> seconds in each judged step, for the phase that took the burst.
        slow_rank: The rank the verdict over the run names slow, if it does: then each rank's excess beyond its usual
            (:func:`usual_excess`), where it stands out from its spread, in a few steps only (:data:`RARE_SHARE`).
        gate: Else, the test that kept that verdict quiet, which the finding says.
    """
    ranks = sorted(work)
    if len(ranks) < 2 or len(steps) < MIN_STEPS or not step_time:
        return None
    floor = threshold_pct / 100.0 * median(step_time)
    beside = slow_rank is not None
    usual = {r: usual_excess(work, r) for r in ranks} if beside else dict.fromkeys(ranks, 0.0)
    least = {r: max(floor, SPREAD_K * scaled_mad(_excess(work, r))) if beside else floor for r in ranks}
    hot: dict[int, list[tuple[int, float]]] = {r: [] for r in ranks}
    for i in range(len(steps)):
        slow = max(ranks, key=lambda r: (work[r][i], -r))
        excess = work[slow][i] - median(work[r][i] for r in ranks if r != slow) - usual[slow]
        if excess > least[slow]:
            hot[slow].append((i, excess))
    if beside:  # standing out in many steps is how the rank is slow: the verdict's
        hot = {r: h if len(h) <= RARE_SHARE * len(steps) else [] for r, h in hot.items()}
    run_s = sum(step_time)
    # Each rank's hot steps in stretches (at most one judged step between two), the costliest stretch its burst.
    stretches = [(r, group) for r in ranks for group in _stretches(hot[r])]
    if not stretches or run_s <= 0:
        return None
    rank, group = max(stretches, key=lambda rg: (sum(e for _, e in rg[1]), -rg[0]))
    stalls = single = False
    if not _material(group, MIN_STEPS, run_s):
        # Else the same rank's long stalls, wherever they are: one rank's, at least twice any other's (ranks that all
        # stall alike have a shared cause, not one rank's).
        big = {r: [(i, e) for i, e in hot[r] if e > STALL_FACTOR * floor] for r in ranks}
        totals = {r: sum(e for _, e in big[r]) for r in ranks}
        able = [r for r in ranks if _material(big[r], 2, run_s) and len(_stretches(big[r])) >= 2]
        single = False
        if not able:  # one stall alone, if it cost the run that much, and no other rank stalled as long
            if not any(big.values()):
                return None
            rank, (i, e) = max(((r, ie) for r in ranks for ie in big[r]), key=lambda rie: (rie[1][1], -rie[0]))
            # (Another long step beside it is a burst's to judge, too short for one; a stall of another rank half as
            # long, a shared cause. A small stall elsewhere in the run leaves it one stall.)
            if 100.0 * e / run_s < SINGLE_PCT or any(0 < abs(j - i) <= 2 for j, _ in big[rank]) or any(
                    x >= e / 2 for r in ranks if r != rank for _, x in big[r]):
                return None
            able, big[rank], totals[rank], single = [rank], [(i, e)], e, True
        rank = max(able, key=lambda r: (totals[r], -r))
        if any(2 * totals[r] > totals[rank] for r in ranks if r != rank):
            return None
        group, stalls = big[rank], True
    total = sum(e for _, e in group)
    at = [i for i, _ in group]
    phase = None
    if phases:
        def excess_of(by_rank: dict[int, list[float]]) -> float:
            beyond = usual_excess(by_rank, rank) if beside else 0.0
            return sum(by_rank[rank][i] - median(by_rank[r][i] for r in ranks if r != rank) - beyond for i in at)

        usable = {p: v for p, v in phases.items() if all(r in v for r in ranks)}
        phase = max(usable, key=lambda p: excess_of(usable[p]), default=None)
    return Burst(rank, [steps[i] for i in at], total, 100.0 * total / run_s, run_s, phase, stalls, slow_rank,
                 usual[rank], len(steps), gate if slow_rank is None else "", single)


def usual_excess(work: dict[int, list[float]], rank: int) -> float:
    """``rank``'s usual excess over its peers: the median over the steps of its work less its peers' median, or 0 when
    that is below 0 (a rank faster than its peers has no excess to leave out)."""
    return max(0.0, median(_excess(work, rank)))


def _excess(work: dict[int, list[float]], rank: int) -> list[float]:
    """``rank``'s work less its peers' median, step by step."""
    peers = [r for r in work if r != rank]
    return [work[rank][i] - median(work[r][i] for r in peers) for i in range(len(work[rank]))]


def _material(group: list[tuple[int, float]], least: int, run_s: float) -> bool:
    """At least ``least`` steps, and without its largest step it still costs the run :data:`MATERIAL_PCT`: a burst,
    not one stall of the host."""
    return len(group) >= least and 100.0 * (sum(e for _, e in group) - max(e for _, e in group)) / run_s >= MATERIAL_PCT


def _stretches(hot: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """``hot`` (judged step index, excess) in stretches: a gap of one judged step keeps a stretch together."""
    out: list[list[tuple[int, float]]] = []
    for i, e in hot:
        if out and i - out[-1][-1][0] <= 2:
            out[-1].append((i, e))
        else:
            out.append([(i, e)])
    return out


def quiet_gate(run: SlowRankVerdict | None) -> str:
    """Why the verdict over the run names no rank, as a burst says it (:attr:`Burst.gate`): its gate, ``undecided``
    (too few steps), or empty without a verdict. The step timer's table and ``analyze`` alike."""
    if run is None:
        return ""
    return "undecided" if run.status == UNDECIDED else run.gate
