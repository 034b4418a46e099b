"""What if (pure): the traced steps replayed across ranks, their critical path, and what one fix would save.

Each rank's timeline (:mod:`hf_distprof.analysis.rank.timeline`) is a chain of points reached after local
work; a collective completes when its last rank arrives plus its *transfer* time (its duration on that last
rank: the rest of every other rank's time in it was waiting for that one). Replaying the measured works gives
every rank's step times back; the difference is the model's error bar, shown with every prediction. A scenario
changes the works (or the transfers) and replays the same steps:

- ``slow_rank``: the slowest rank (the most local work per step, on average over the steps) does, between each two
  of its collectives, what its peers do there (their median);
- ``no_data_loading``: data loading takes no time on any rank;
- ``hide_communication``: every transfer is hidden (a collective completes when its last rank arrives; a rank's
  lag past the completion stays);
- ``fastest_pace``: every rank does, between each two collectives, what the fastest rank does there (more than two
  ranks: with two it is ``slow_rank``'s replay);
- ``network_at_reference`` (with a bandwidth reference): every transfer at the reference busbw of its size.

The measured step time is the mean over the steps and the ranks of each rank's step (start to end of its
``ProfilerStep#N``): time adds up over steps, and a fix's worth is what it saves over all of them. A scenario's
saving is how much sooner the traced steps end than in the replay of the measured works, per step, mean over ranks
(:func:`window_saving`), and its predicted step the measured one less that saving.
The first traced step of a window starts on each rank at its measured time (the state the untraced steps before it
left), so a scenario changes what follows, not that; and since a point's time only moves with the works and
transfers before it, a scenario that only takes time away never reads slower. (The median of the replayed steps did:
a step that starts sooner on a rank that was not the bottleneck waits longer in it, so with communication hidden the
median step of a demo run read 0.7% slower while the three steps ended sooner; and a median step less a mean saving
mixes two statistics.)
"""

from __future__ import annotations

from collections import Counter
from statistics import median

from hf_distprof.analysis.results.across import Alignment, ReferencePoint, RunEvidence
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.whatif import ReplayedRank, WhatIf, WhatIfModel, WhatIfScenario
from hf_distprof.analysis.whatif import path as whatif_path
from hf_distprof.analysis.whatif import replay as wr
from hf_distprof.core.stats import scaled_mad

MS_PER_HOUR = 3.6e6
RANK_SCENARIOS = ("slow_rank", "fastest_pace")
"""The scenarios that change one rank's pace: their saving counts only when the run's slow-rank evidence is real
(the judge's word)."""


def run_saving_pct(scenario: str, evidence: RunEvidence | None, slowest: int | None) -> float | None:
    """What a rank-pace scenario saves over the run, in % of the run's median step; None for other scenarios, without
    the step timer's records, or when they do not have the rank replayed at its peers' pace (``slowest``).

    Bringing the slowest rank to its peers' pace saves its own-work excess over them per step (what they wait for
    it), every rank at the fastest's pace the slowest's own work over the fastest's: measured over the run's judged
    steps, not the few traced ones, which the profiler slows and reshapes (a replay of 3 traced steps promised 30%
    where the run's 24 judged steps showed that rank 9.9% over its peer, 5% of the step)."""
    if evidence is None or scenario not in RANK_SCENARIOS or not evidence.step_ms or slowest is None:
        return None
    gap = evidence.excess_ms.get(slowest) if scenario == "slow_rank" else evidence.fastest_gap_ms
    return None if gap is None else max(0.0, 100.0 * gap / evidence.step_ms)


def what_if(
    ranks: list[RankResult], alignment: Alignment, reference: list[ReferencePoint] | None = None,
    evidence: RunEvidence | None = None, pace: tuple[int | None, int | None] = (None, None),
) -> WhatIf | None:
    """Replay the traced steps of ``ranks``, find the median step's critical path and replay each scenario.

    Figures only: whether a saving counts (beyond the noise, on a rank's pace only when that rank's excess is real) is
    the judge's (:func:`hf_distprof.analysis.judge.whatif.judge_scenarios`).

    Args:
        ranks: Per-rank results with their timelines, sorted by rank.
        alignment: The ranks on one clock and the collectives matched across them (the replay's sync points).
        reference: ``analyze --bandwidth-ref``'s points: adds the ``network_at_reference`` scenario.
        evidence: The step timer's account of the run's other steps: the noise a saving must stand out from is the
            run's (not the few traced steps'), and a rank's pace saves over the run what its own work there exceeds.
            None: the traced steps' own noise.
        pace: The slowest and fastest rank as the run's evidence sees them (``Across.pace``); where it names none,
            the replay picks by the traced steps' local work.

    Returns:
        The answer, scenarios in the order replayed; None when some rank has no timeline or no step is common to
        every rank.
    """
    g = wr.build(ranks, alignment)
    if g is None:
        return None
    base = wr.replay(g)
    measured, replayed = wr.measured_step_times(g), wr.step_times(g, base)
    now = _stat(measured)
    error = max(abs(a - b) for s in g.steps for a, b in zip(replayed[s], measured[s]))
    noise = scaled_mad([sum(v) / len(v) for v in measured.values()]) if len(g.steps) > 1 else None
    runs, slowest, fastest = wr.scenarios(g, reference, pace)
    out = []
    for name, title, changed, rep in runs:
        scenario = wr.step_times(g, rep)
        saving = window_saving(g, base, rep)
        predicted = now - saving
        per_step = running_saving_pct(g, base, rep)
        own = scaled_mad([sum(v) / len(v) for v in scenario.values()]) if noise is not None else None
        out.append(WhatIfScenario(
            scenario=name, title=title, ranks=changed, step_ms_now=now / 1e3, step_ms_predicted=predicted / 1e3,
            saving_ms=saving / 1e3, saving_pct=100.0 * saving / now if now > 0 else 0.0,
            hours_per_1000_steps=saving * 1000 / MS_PER_HOUR / 1e3, error_ms=error / 1e3,
            noise_ms=None, predicted_noise_ms=own / 1e3 if own is not None else None, saving_pct_per_step=per_step,
            run_saving_pct=run_saving_pct(name, evidence, g.ranks[slowest] if slowest is not None else None)))
    order = sorted(g.steps, key=lambda s: sum(replayed[s]) / len(replayed[s]))
    mid = order[(len(order) - 1) // 2]
    per_step_syncs = Counter(k[0] for k in g.transfer)
    per_rank = []
    for r, rank in enumerate(g.ranks):
        m = [measured[s][r] for s in g.steps]
        p = [replayed[s][r] for s in g.steps]
        per_rank.append(ReplayedRank(rank, sum(m) / len(m) / 1e3, sum(p) / len(p) / 1e3,
                                     max(abs(a - b) for a, b in zip(p, m)) / 1e3))
    model = WhatIfModel(
        steps=list(g.steps), median_step=mid, step_ms_measured=now / 1e3, step_ms_replayed=_stat(replayed) / 1e3,
        error_ms=error / 1e3, noise_ms=noise / 1e3 if noise is not None else None,
        run_noise_ms=evidence.noise_ms if evidence is not None else None,
        run_steps=evidence.steps if evidence is not None else None,
        sync_points=int(median(per_step_syncs.get(s, 0) for s in g.steps)),
        slowest_rank=g.ranks[slowest] if slowest is not None else None,
        fastest_rank=g.ranks[fastest] if fastest is not None else None,
        ranks=per_rank, lanes=whatif_path.lanes(g, base, mid, g.transfer))
    return WhatIf(out, whatif_path.critical_path(g, base, mid, g.transfer), model)


def window_saving(g: wr.Graph, base: wr.Replay, rep: wr.Replay) -> float:
    """How much sooner the replay ``rep`` ends the traced steps than ``base`` (the measured works replayed), per step,
    mean over the ranks (us; < 0 when it ends them later).

    Per rank, each stretch of consecutive traced steps (a window; its first step starts at its measured time in every
    replay) gains the difference at its last common step's end less the difference at its first common step's start
    (a step only this rank traced, before it, is not counted); the stretches' gains added up, over the steps between
    those two points."""
    common = set(g.steps)
    savings = []
    for r in range(len(g.ranks)):
        starts, ends, base_at, rep_at = g.start_at[r], g.end_at[r], base.value[r], rep.value[r]
        gained, held = 0.0, 0
        for _, stretch in _stretches(g, r):
            shared = [i for i, s in enumerate(stretch) if s in common]
            if not shared:
                continue
            first, last = stretch[shared[0]], stretch[shared[-1]]
            gained += (base_at[ends[last]] - rep_at[ends[last]]) - (base_at[starts[first]] - rep_at[starts[first]])
            held += shared[-1] - shared[0] + 1
        savings.append(gained / held if held else 0.0)
    return sum(savings) / len(savings)


def _stretches(g: wr.Graph, r: int) -> list[tuple[int, list[int]]]:
    """Rank index ``r``'s traced steps in stretches of consecutive steps: (the point where the stretch starts, a fixed
    time in every replay: a window's first step, or one after a gap; its steps that have an end)."""
    starts, ends, pred = g.start_at[r], g.end_at[r], g.tl[r].pred
    out: list[tuple[int, list[int]]] = []
    for s in sorted(starts):
        if pred[starts[s]] < 0 or not out:
            out.append((starts[s], []))
        if s in ends:
            out[-1][1].append(s)
    return out


def running_saving_pct(g: wr.Graph, base: wr.Replay, rep: wr.Replay) -> list[float]:
    """For each traced step, how much sooner ``rep`` reaches its end than ``base``, in % of the time from the start
    of its stretch's first common step to that end (summed over ranks): what the change has saved by then. A step's
    own time can grow where the steps before it shrank (a rank that starts it sooner waits longer in it); the running
    figure does not swing with that."""
    common = set(g.steps)
    firsts = []
    for r in range(len(g.ranks)):
        first: dict[int, int] = {}
        for _, stretch in _stretches(g, r):
            shared = [s for s in stretch if s in common]
            first.update(dict.fromkeys(shared, g.start_at[r][shared[0]] if shared else 0))
        firsts.append(first)
    out = []
    for s in g.steps:
        was = now = 0.0
        for r, first in enumerate(firsts):
            end, start = g.end_at[r][s], first[s]
            was += base.value[r][end] - base.value[r][start]
            now += rep.value[r][end] - rep.value[r][start]
        out.append(100.0 * (1.0 - now / was) if was > 0 else 0.0)
    return out


def _stat(per_step: dict[int, list[float]]) -> float:
    """Mean over the steps and the ranks."""
    return sum(sum(v) / len(v) for v in per_step.values()) / len(per_step)
