"""The what-if model judged (pure): which savings count, in the one order every output shows them, and "what to fix
first" when one fix would save more than the threshold and the noise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hf_distprof.analysis.results.across import RankVerdicts, RunEvidence
from hf_distprof.analysis.results.facts import FixFirstFacts
from hf_distprof.analysis.results.findings import REPLAY, Judgement
from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario
from hf_distprof.analysis.whatif.model import RANK_SCENARIOS
from hf_distprof.core.run_verdict import decided

WHAT_TO_FIX_FIRST = "what_to_fix_first"
"""The kind of the what-if finding."""

_PHASES = {"slow_rank": None, "no_data_loading": "data", "hide_communication": "communication",
           "fastest_pace": None, "network_at_reference": "communication"}


def by_saving(scenarios: list[WhatIfScenario]) -> list[WhatIfScenario]:
    """The scenarios in the one order every output shows them: the saving that counts, largest first (ties: in the
    order replayed)."""
    return sorted(scenarios, key=lambda s: -s.counted_pct)


def noise_of(scenario: WhatIfScenario, model: WhatIfModel) -> float | None:
    """The step-to-step noise a scenario's saving must stand out from: the run's own, over its judged steps (the step
    timer's records), when there; else the smaller of the measured and the predicted traced steps' (None with one
    traced step)."""
    if model.run_noise_ms is not None:
        return model.run_noise_ms
    if model.noise_ms is None or scenario.predicted_noise_ms is None:
        return None
    return min(model.noise_ms, scenario.predicted_noise_ms)


def replay_pace(verdicts: RankVerdicts, pace: tuple[int | None, int | None],
                bursts: Sequence[Judgement] = ()) -> tuple[int | None, int | None]:
    """The slowest and fastest rank the what-if replays at a peer's pace: the rank the first raised slow-rank verdict
    names (the straggler's, then the imbalance's: the order of the box's slow-rank finding), else a burst's beside no
    slow rank (``bursts``: the rank its peers waited for, which the box and the step timer's table name), else
    ``pace`` (``Across.pace``: the run's candidate, else the latest at the traced steps' collectives).

    Where the step timer decided over the run, the verdicts follow it: its candidate on own work, as the live table
    marks it, or the rank it raised on its arrival at the sync (its wait for a CPU included). Where its judged steps
    were too few to decide, the window's verdict weighed with them may name another rank: the replay is then of that
    rank, not of the few steps' candidate (a run of 4 judged steps named rank 0 by 11.9% while the traced steps had
    rank 1 loading for 81 ms of 150: the table replayed rank 0 ("no: slower") under findings naming rank 1). The
    fastest stays the run's unless it is that rank.
    """
    named = next((v.rank for _, v, _ in verdicts.raised()), None)
    if named is None:
        named = next((f.ranks[0] for f in bursts if f.kind == "burst" and f.facts.burst.beside is None), None)
    if named is None or named == pace[0]:
        return pace
    return named, pace[1] if pace[1] != named else None


def judge_scenarios(answer: WhatIf, verdicts: RankVerdicts, evidence: RunEvidence | None) -> WhatIf:
    """Whether each saving counts, and the scenarios in order.

    A saving counts (``beyond_noise``) when the part of it that counts (:attr:`WhatIfScenario.counted_pct`: the
    replay's, or what the pace saves over the run when that is less) is larger than the model's error and the noise;
    on a rank's pace only when the slow-rank verdict calls that rank's excess real: a raised verdict naming it, else
    over the run (the step timer's records, whatever its size), or, without them, the traced window's verdict raised
    for the rank replayed. The run's figure holds a rank's pace only where it measures what the verdict named: the
    run's own-work candidate, over steps enough for the run's own verdict; else (a rank the window's verdict weighed
    with too few steps raised, or one raised on its arrival with its wait for a CPU) the replay's saving stands.

    Args:
        answer: The replay.
        verdicts: The slow-rank verdicts.
        evidence: The step timer's account of the run's judged steps (None without its records).
    """
    model = answer.model
    named = any(v.rank == model.slowest_rank for _, v, _ in verdicts.raised())
    # (A trial's 4 judged steps said rank 1's pace saved 0.0% of the run, which the verdict called "slow across the
    # run" from its 20 traced steps with them.)
    unheld = named and (not decided(verdicts.run) or evidence is None or evidence.slowest_rank != model.slowest_rank)
    if named:
        real = True
    elif evidence is not None:
        # (The run's figure is its candidate's: a burst's rank replayed beside it is not called real by it.)
        real = bool(verdicts.run_real) and evidence.slowest_rank == model.slowest_rank
    else:
        # Either window verdict raised for the rank replayed makes its excess real (a quiet straggler verdict beside a
        # raised imbalance one says the rank is not late at the collectives, not that it is not slower).
        windows = [v for v in (verdicts.straggler, verdicts.imbalance) if v is not None]
        real = not windows
    judged = []
    for s in answer.scenarios:
        if unheld and s.scenario == "slow_rank":
            s = replace(s, run_saving_pct=None)
        noise = noise_of(s, model)
        if s.counted_ms < 0:
            why: str | None = "slower"
        elif noise is None:
            why = "one step"  # one traced step and no records: its noise is unknown
        elif s.counted_ms <= max(s.error_ms, noise):
            why = "noise"
        elif s.scenario in RANK_SCENARIOS and not real:
            why = "verdict"
        else:
            why = None
        judged.append(replace(s, noise_ms=noise, beyond_noise=why is None, not_counted=why))
    return WhatIf(by_saving(judged), answer.critical_path, replace(model, rank_saving_real=real))


def what_to_fix_first(answer: WhatIf, threshold_pct: float, on_gpu: bool = True, backend: str | None = None,
                      fsdp: bool = False) -> Judgement | None:
    """The finding that opens the list when a scenario saves more than the noise and more than ``threshold_pct``
    % of the step (``AnalysisOptions.what_if_pct``); None otherwise.

    Args:
        answer: The judged replay (:func:`judge_scenarios`).
        threshold_pct: What is worth fixing, % of the step.
        on_gpu, backend, fsdp: What the advice fits (no pinned memory without a GPU, the backend's own settings).
    """
    worth = [s for s in answer.scenarios if s.beyond_noise and s.counted_pct > threshold_pct]
    if not worth:
        return None
    top = worth[0]
    return Judgement(
        kind=WHAT_TO_FIX_FIRST,
        severity=top.counted_pct,
        ranks=list(top.ranks),
        facts=FixFirstFacts(top, worth, answer.model, threshold_pct, on_gpu, backend, fsdp),
        phase=_PHASES.get(top.scenario),
        basis=REPLAY,
        steps=len(answer.model.steps),
        numbers={"step_ms_now": top.step_ms_now, "step_ms_predicted": top.step_ms_predicted,
                 "saving_pct": top.saving_pct, "error_ms": top.error_ms,
                 **({"run_saving_pct": top.run_saving_pct} if top.run_saving_pct is not None else {})},
        # As for a per-step share: by how many of the steps' ends the replay has saved more than the threshold.
        confidence=sum(p > threshold_pct for p in top.saving_pct_per_step) / len(top.saving_pct_per_step),
    )
