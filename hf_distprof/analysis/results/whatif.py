"""What the what-if model yields (plain data): scenarios, the model's fit, the critical path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    """Measured: the mean over the traced steps and the ranks of the step time."""
    step_ms_predicted: float
    """``step_ms_now`` less ``saving_ms``."""
    saving_ms: float
    """How much sooner the replay with the change ends the traced steps than the replay of the measured works, per
    step, mean over ranks (:func:`hf_distprof.analysis.whatif.model.window_saving`); < 0: later."""
    saving_pct: float
    hours_per_1000_steps: float
    """The saving over 1,000 steps, in hours."""
    error_ms: float
    """The model's error bar: its largest replay residual (see :class:`WhatIfModel`)."""
    noise_ms: float | None
    """The step-to-step noise a saving must stand out from, the judge's choice
    (:func:`hf_distprof.analysis.judge.whatif.noise_of`): the run's, over its judged steps, with the step timer's
    records; else the smaller of the measured steps' and the predicted steps' (each the scaled median absolute
    deviation of the step times over the traced steps). Each inflates on its own side: a rank slow in every other step
    makes the measured times bimodal, which is what the scenario removes; a rank given its peers' work step by step
    takes on their variation. None with one traced step (and no records)."""
    predicted_noise_ms: float | None = None
    """The predicted steps' own step-to-step noise (scaled median absolute deviation over the traced steps); None with
    one traced step."""
    beyond_noise: bool = False
    """Whether the saving that counts (:attr:`counted_pct`) is larger than both the error bar and ``noise_ms`` (never
    with one traced step, whose noise is unknown), and on a rank's pace only when the slow-rank verdict calls that
    rank's excess real: the judge's decision (:func:`hf_distprof.analysis.judge.whatif.judge_scenarios`)."""
    not_counted: str | None = None
    """Why the saving does not count (``beyond_noise`` false): ``slower`` (the replay predicts a longer step),
    ``one step`` (one traced step and no step timer's records: the noise is unknown), ``noise`` (not larger than the
    error bar and the noise) or ``verdict`` (a rank's pace the slow-rank verdict does not call real); None when it
    counts."""
    saving_pct_per_step: list[float] = field(default_factory=list)
    """By each traced step's end, what the scenario has saved so far, in % of the time since its window began (summed
    over ranks; :func:`hf_distprof.analysis.whatif.model.running_saving_pct`)."""
    run_saving_pct: float | None = None
    """What this rank's pace saves over the run (``slow_rank``, ``fastest_pace`` with the step timer's records): the
    slowest rank's own-work excess per step over its peers (over the fastest rank for ``fastest_pace``), median over
    the run's judged steps, in % of their median step; None for other scenarios, without the records, or where they
    do not measure what the verdict named (a rank it raised from the traced window weighed with too few judged steps,
    or on its arrival with its wait for a CPU: :func:`hf_distprof.analysis.judge.whatif.judge_scenarios`). The replay
    describes the traced steps, which the profiler slows and reshapes; the verdicts weigh the run: a saving counts
    (``beyond_noise``, "what to fix first", the box) on the smaller of the two (:attr:`counted_pct`)."""

    @property
    def held_to_run(self) -> bool:
        """Whether the run's figure is smaller than the replay's: then it is the saving that counts."""
        return self.run_saving_pct is not None and self.run_saving_pct < self.saving_pct

    @property
    def counted_pct(self) -> float:
        """The saving that counts, % of the step: ``saving_pct``, or the run's figure when it is smaller (the one place
        it is computed)."""
        run = self.run_saving_pct
        return run if run is not None and run < self.saving_pct else self.saving_pct

    @property
    def counted_ms(self) -> float:
        """The same in milliseconds: ``saving_ms``, or the run's figure of the measured step."""
        return self.step_ms_now * self.counted_pct / 100.0 if self.held_to_run else self.saving_ms

@dataclass
class ReplayedRank:
    """One rank's step time, measured and replayed (means over the steps)."""

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
    run_noise_ms: float | None = None
    """The step-to-step noise over the run's judged steps (the step timer's records), which the scenarios' savings are
    held against; None without the step timer's records (then each scenario's own noise is used)."""
    run_steps: int | None = None
    """How many of the run's steps ``run_noise_ms`` is over."""
    rank_saving_real: bool = True
    """Whether a saving on one rank's pace (``slow_rank``, ``fastest_pace``) may count: the verdict engine calls that
    rank's excess real over the run (the step timer's records), or, without them, the traced window's verdict is
    raised for it. When False those scenarios are never beyond the noise, whatever their saving. The judge's
    decision (:func:`hf_distprof.analysis.judge.whatif.judge_scenarios`)."""
    ranks: list[ReplayedRank] = field(default_factory=list)
    lanes: list[dict[str, Any]] = field(default_factory=list)
    """The median step as replayed, for the figure: ``{rank, start_ms, end_ms, name}`` (a phase, "waiting", or
    "transfer <collective>")."""

@dataclass
class CriticalSegment:
    """One link of the critical path: local work on a rank, or a collective's transfer."""

    rank: int
    kind: str
    """"phase" (local work: ``name`` is its phase) or "collective" (``name`` is the collective, transfer or
    wake-up)."""
    name: str
    ms: float
    start_ms: float
    """From the step's start (its earliest rank's), in the replay."""

@dataclass
class WhatIf:
    """The model's answer: ranked scenarios, the critical path of the median step, and the model itself."""

    scenarios: list[WhatIfScenario]
    critical_path: list[CriticalSegment]
    model: WhatIfModel
