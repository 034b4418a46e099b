"""What if (pure): the traced steps replayed across ranks, their critical path, and what one fix would save.

Each rank's timeline (:mod:`hf_distprof.analysis.whatif_timeline`) is a chain of points reached after local
work; a collective completes when its last rank arrives plus its *transfer* time (its duration on that last
rank: the rest of every other rank's time in it was waiting for that one). Replaying the measured works gives
every rank's step times back; the difference is the model's error bar, shown with every prediction. A scenario
changes the works (or the transfers) and replays the same steps:

- ``slow_rank``: the slowest rank (the most local work per step, on average over the steps) does, between each two
  of its collectives, what its peers do there (their median);
- ``no_data_loading``: data loading takes no time on any rank;
- ``hide_communication``: every transfer is hidden (a collective completes when its last rank arrives);
- ``fastest_pace``: every rank does, between each two collectives, what the fastest rank does there;
- ``network_at_reference`` (with a bandwidth reference): every transfer at the reference busbw of its size.

The step time of a replay is the median over the steps of the mean over ranks of each rank's step (start to
end of its ``ProfilerStep#N``). The first traced step starts on each rank at its measured time (the state the
untraced steps before it left), so a scenario changes what follows, not that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from hf_distprof.analysis.model import Finding
from hf_distprof.analysis.whatif_path import CriticalSegment
from hf_distprof.core.stats import scaled_mad

if TYPE_CHECKING:
    from hf_distprof.analysis.bandwidth_ref import ReferencePoint
    from hf_distprof.analysis.model import AnalysisResult, RankResult

MS_PER_HOUR = 3.6e6


@dataclass
class WhatIfScenario:
    """One replay with one change, against the measured steps."""

    scenario: str
    """Short id: ``slow_rank``, ``no_data_loading``, ``hide_communication``, ``fastest_pace``,
    ``network_at_reference``."""
    title: str
    ranks: list[int]
    """The ranks whose work it changes."""
    step_ms_now: float
    """Measured: median over steps of the mean over ranks of the step time."""
    step_ms_predicted: float
    saving_ms: float
    saving_pct: float
    hours_per_1000_steps: float
    """The saving over 1,000 steps, in hours."""
    error_ms: float
    """The model's error bar: its largest replay residual (see :class:`WhatIfModel`)."""
    noise_ms: float | None
    """The step-to-step noise a saving must stand out from: the smaller of the measured steps' and the predicted
    steps' (each the scaled median absolute deviation of the step times over the steps). Each inflates on its own
    side: a rank slow in every other step makes the measured times bimodal, which is what the scenario removes; a
    rank given its peers' work step by step takes on their variation. None with one traced step."""
    beyond_noise: bool
    """Whether the saving is larger than both the error bar and ``noise_ms`` (never with one traced step, whose
    noise is unknown)."""
    saving_pct_per_step: list[float] = field(default_factory=list)
    """The saving in each traced step (its replayed step time against the scenario's), in %."""


@dataclass
class ReplayedRank:
    """One rank's step time, measured and replayed (medians over the steps)."""

    rank: int
    step_ms_measured: float
    step_ms_replayed: float
    residual_ms: float
    """The largest ``|replayed - measured|`` over its steps."""


@dataclass
class WhatIfModel:
    """The model behind the scenarios: how well the replay reproduces the measured steps, and the median step."""

    steps: list[int]
    """The steps every rank traced, replayed."""
    median_step: int
    """The step whose replayed time is the median: the one the critical path and the lanes describe."""
    step_ms_measured: float
    step_ms_replayed: float
    error_ms: float
    """The largest ``|replayed - measured|`` step time over ranks and steps: the error bar of every prediction."""
    noise_ms: float | None
    """Step-to-step noise of the measured step time (scaled median absolute deviation over the steps); None with
    one step. (Each scenario's saving is judged against the smaller of this and its predicted steps' noise.)"""
    sync_points: int
    """Collectives matched on every rank, per step (median), that the replay synchronises the ranks at."""
    slowest_rank: int | None
    """The rank with the most local work per step (mean over the steps); None with one rank."""
    fastest_rank: int | None
    """The rank with the least."""
    ranks: list[ReplayedRank] = field(default_factory=list)
    lanes: list[dict[str, Any]] = field(default_factory=list)
    """The median step as replayed, for the figure: ``{rank, start_ms, end_ms, name}`` (a phase, "waiting", or
    "transfer <collective>")."""


@dataclass
class WhatIf:
    """The model's answer: ranked scenarios, the critical path of the median step, and the model itself."""

    scenarios: list[WhatIfScenario]
    critical_path: list[CriticalSegment]
    model: WhatIfModel


def what_if(
    ranks: list[RankResult], offsets: dict[int, float], reference: list[ReferencePoint] | None = None
) -> WhatIf | None:
    """Replay the traced steps of ``ranks``, find the median step's critical path and replay each scenario.

    Args:
        ranks: Per-rank results with their timelines, sorted by rank.
        offsets: Rank -> its clock's offset to the first rank's (``RankSkew.clock_offset_us``); 0 when missing.
        reference: ``analyze --bandwidth-ref``'s points: adds the ``network_at_reference`` scenario.

    Returns:
        The answer, scenarios sorted by saving (largest first); None when some rank has no timeline or no step
        is common to every rank.
    """
    from hf_distprof.analysis import whatif_path, whatif_replay as wr

    g = wr.build(ranks, offsets)
    if g is None:
        return None
    base = wr.replay(g)
    measured, replayed = wr.measured_step_times(g), wr.step_times(g, base)
    now = _stat(measured)
    error = max(abs(a - b) for s in g.steps for a, b in zip(replayed[s], measured[s]))
    noise = scaled_mad([sum(v) / len(v) for v in measured.values()]) if len(g.steps) > 1 else None
    runs, slowest, fastest = wr.scenarios(g, reference)
    out = []
    for name, title, changed, rep in runs:
        scenario = wr.step_times(g, rep)
        predicted = _stat(scenario)
        saving = now - predicted
        per_step = [100.0 * (1.0 - sum(scenario[s]) / sum(replayed[s])) if sum(replayed[s]) > 0 else 0.0
                    for s in g.steps]
        spread = min(noise, scaled_mad([sum(v) / len(v) for v in scenario.values()])) if noise is not None else None
        out.append(WhatIfScenario(
            scenario=name, title=title, ranks=changed, step_ms_now=now / 1e3, step_ms_predicted=predicted / 1e3,
            saving_ms=saving / 1e3, saving_pct=100.0 * saving / now if now > 0 else 0.0,
            hours_per_1000_steps=saving * 1000 / MS_PER_HOUR / 1e3, error_ms=error / 1e3,
            noise_ms=spread / 1e3 if spread is not None else None,
            beyond_noise=spread is not None and saving > max(error, spread), saving_pct_per_step=per_step))
    out.sort(key=lambda s: -s.saving_ms)
    order = sorted(g.steps, key=lambda s: sum(replayed[s]) / len(replayed[s]))
    mid = order[(len(order) - 1) // 2]
    per_step_syncs = Counter(k[0] for k in g.transfer)
    per_rank = []
    for r, rank in enumerate(g.ranks):
        m = [measured[s][r] for s in g.steps]
        p = [replayed[s][r] for s in g.steps]
        per_rank.append(ReplayedRank(rank, median(m) / 1e3, median(p) / 1e3,
                                     max(abs(a - b) for a, b in zip(p, m)) / 1e3))
    model = WhatIfModel(
        steps=list(g.steps), median_step=mid, step_ms_measured=now / 1e3, step_ms_replayed=_stat(replayed) / 1e3,
        error_ms=error / 1e3, noise_ms=noise / 1e3 if noise is not None else None,
        sync_points=int(median(per_step_syncs.get(s, 0) for s in g.steps)),
        slowest_rank=g.ranks[slowest] if slowest is not None else None,
        fastest_rank=g.ranks[fastest] if fastest is not None else None,
        ranks=per_rank, lanes=whatif_path.lanes(g, base, mid, g.transfer))
    return WhatIf(out, whatif_path.critical_path(g, base, mid, g.transfer), model)


def _stat(per_step: dict[int, list[float]]) -> float:
    """Median over the steps of the mean over ranks."""
    return median(sum(v) / len(v) for v in per_step.values())


_ADVICE = {
    "slow_rank": "Find what rank {ranks} does that its peers do not (the critical path and the straggler and "
                 "imbalance findings say where): uneven data, extra work on that rank, a slower device or host.",
    "no_data_loading": "Load data ahead of the step: DataLoader num_workers > 0, pin_memory=True, "
                       "persistent_workers=True, prefetch_factor; pre-tokenise instead of tokenising per item.",
    "hide_communication": "Overlap communication with computation (DDP bucket_cap_mb, gradient accumulation, "
                          "FSDP prefetching) or send fewer bytes (bf16 reduction, fewer and larger collectives).",
    "fastest_pace": "Give every rank the same work, at the pace of the fastest: balance the data (sequence "
                    "lengths, batch sizes), then look at the hosts and devices of the slower ranks.",
    "network_at_reference": "The transfers run slower than bench-collectives measured on this fabric: check the "
                            "NCCL settings and the network path of the collectives that take longest.",
}


def what_to_fix_first(answer: WhatIf, threshold_pct: float) -> Finding | None:
    """The finding that opens the list when a scenario saves more than the noise and more than ``threshold_pct``
    % of the step (``AnalysisOptions.what_if_pct``); None otherwise."""
    worth = [s for s in answer.scenarios if s.beyond_noise and s.saving_pct > threshold_pct]
    if not worth:
        return None
    top, model = worth[0], answer.model
    ranked = "; ".join(f"{s.title}: {s.step_ms_predicted:.2f} ms (-{s.saving_pct:.1f}%)" for s in worth)
    return Finding(
        kind="what_to_fix_first",
        severity=top.saving_pct,
        title=f"What to fix first: {top.title}",
        ranks=list(top.ranks),
        evidence=(
            f"replaying the {len(model.steps)} traced step(s) across ranks with {top.title} predicts "
            f"{top.step_ms_predicted:.2f} ms per step instead of the measured {top.step_ms_now:.2f} ms: "
            f"{top.saving_pct:.1f}% faster, {top.hours_per_1000_steps:.3f} h saved per 1,000 steps (model error "
            f"+-{top.error_ms:.2f} ms; step-to-step noise {top.noise_ms or 0.0:.2f} ms, the smaller of the measured "
            f"steps' {model.noise_ms or 0.0:.2f} ms and the predicted ones'). Above the "
            f"{threshold_pct:g}% threshold and the noise, in order: {ranked}"
        ),
        recommendation=_ADVICE[top.scenario].format(ranks=", ".join(map(str, top.ranks))),
        numbers={"step_ms_now": top.step_ms_now, "step_ms_predicted": top.step_ms_predicted,
                 "saving_pct": top.saving_pct, "error_ms": top.error_ms},
        # As for a per-step share: how many of the steps, each replayed on its own, save more than the threshold.
        confidence=sum(p > threshold_pct for p in top.saving_pct_per_step) / len(top.saving_pct_per_step),
    )


def apply_what_if(result: AnalysisResult, reference: list[ReferencePoint] | None = None) -> None:
    """Fill ``result``'s ``what_if``, ``critical_path`` and ``what_if_model``, and put the "what to fix first"
    finding (when there is one) at the head of its findings, replacing an earlier one."""
    cross = result.cross_rank
    offsets = {p.rank: p.clock_offset_us for p in cross.per_rank} if cross is not None else {}
    answer = what_if(result.ranks, offsets, reference) if result.ranks else None
    result.findings = [f for f in result.findings if f.kind != "what_to_fix_first"]
    if answer is None:
        result.what_if, result.critical_path, result.what_if_model = [], [], None
        return
    result.what_if, result.critical_path, result.what_if_model = answer.scenarios, answer.critical_path, answer.model
    first = what_to_fix_first(answer, result.options.what_if_pct)
    if first is not None:
        result.findings.insert(0, first)
