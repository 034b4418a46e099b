"""The facts of each kind of finding (plain data): what the judge decided on and every figure the finding's words
state, handed to the tell stage, which writes the words once (:mod:`hf_distprof.analysis.tell.findings`).

One dataclass per kind of :class:`~hf_distprof.analysis.results.findings.Judgement` (its ``facts``), one per kind of
question the run could not decide, and one for the traced window against the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hf_distprof.analysis.results.across import PhaseExcess, RankVerdicts, Straggler
from hf_distprof.analysis.results.findings import Basis, Judgement
from hf_distprof.analysis.results.rank import CommKindStat, DeviceMemory
from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario
from hf_distprof.core.advice import LoaderSettings
from hf_distprof.core.burst import Burst
from hf_distprof.core.cause import Attribution
from hf_distprof.core.verdicts import SlowRankVerdict


@dataclass
class PeerWaits:
    """Who waits for a slow rank at the collectives: the peer that waits longest, by kind, and how many others do."""

    slow: int
    worst: int
    """The waiting rank that waits longest (ties: the lower rank)."""
    kinds: list[tuple[str, float]]
    """Its wait by kind of collective, % of its step, largest first."""
    pct: float
    """Its whole wait, % of its step."""
    us: float
    """The same in microseconds per step."""
    others: list[float] = field(default_factory=list)
    gpu: bool = False
    """Whether the % are of the steps' GPU spans (GPU traces), not their wall time."""
    """The other waiting ranks' waits, % of their step (those worth a sentence)."""


@dataclass
class LateShare:
    """Of one rank's exposed communication, the part that is a wait for late peers."""

    rank: int
    exposed_pct: float
    waited_pct: float
    peers: list[int]


class CommAdvice(str, Enum):
    """Which advice a communication-bound finding gives (the judge's choice)."""

    FSDP_FINDINGS = "fsdp_findings"
    """FSDP findings name the exposed all-gathers and reduce-scatters: point to them."""
    FSDP = "fsdp"
    """FSDP without such findings: prefetching, wrap granularity."""
    DDP = "ddp"
    """DDP: bucket sizes, gradient accumulation."""


@dataclass
class CommBoundFacts:
    gpu: bool
    mean_pct: float
    """The collectives themselves (waits for late peers left out), % of the step, mean over the ranks."""
    worst: int
    worst_pct: float
    worst_median_pct: float
    threshold_pct: float
    exposed_pct: float
    """Exposed communication in all, % of the step, mean over the ranks."""
    late: list[LateShare]
    overlap_pct: float | None
    kind_split: list[tuple[str, float, float]]
    """The worst rank's rows with exposed time: (kind, exposed %, waiting %)."""
    advice: CommAdvice
    """``fsdp_findings`` (FSDP findings say where), ``fsdp`` or ``ddp``."""
    resumed_late: list[tuple[int, float]] = field(default_factory=list)
    """(rank, % of its step) of every rank's exposed communication after completion, left out (shown from the
    judge's ``RESUME_SHOWN_PCT``): also a rank it took under the threshold."""


@dataclass
class ResumeShare:
    """One rank's time in its collectives after they completed, % of its step."""

    rank: int
    mean_pct: float
    median_pct: float
    cpu_wait_ms: float | None = None
    """Its wait for a CPU per traced step (the step timer's run-queue reading, median); None without its records."""
    cpu_wait_pct: float | None = None
    cpu_bound: bool = False
    """Whether that wait is at least half its time past completion (the judge's
    :data:`~hf_distprof.analysis.judge.diagnosis.CPU_WAIT_CAUSE`): the cause said is its host's CPUs."""


@dataclass
class SlowResumeFacts:
    """Ranks that stay in their collectives after the collectives completed on a peer: their thread not running again
    yet (on a shared host, waiting for a CPU), not the transfer."""

    gpu: bool
    ranks: list[ResumeShare]
    """The ranks above the threshold, most first."""
    threshold_pct: float


@dataclass
class WaitingFacts:
    mean_pct: float
    worst: int
    worst_median_pct: float
    steps: int
    threshold_pct: float
    whom: list[tuple[int, float]]
    """The worst rank's peers it waits for, (peer, % of its step), longest first, at most 3."""
    entered_late: list[EnteredLate] = field(default_factory=list)
    """Those of ``whom`` whose lateness arose before the step began (:class:`EnteredLate`), in ``whom``'s order."""
    gpu: bool = False
    """Whether the % are of the steps' GPU spans (GPU traces), not their wall time."""
    all_entered_late: bool = False
    """Whether every peer of ``whom`` is one of them: the advice then points between steps, not inside them."""
    of_ranks: int = 0
    """The ranks ``mean_pct`` is the mean over (every rank read, not only those in the finding)."""


@dataclass
class EnteredLate:
    """A late rank that began the step about as late as it reached the collectives: its delay arose before the step
    began (after the previous step's last collective), not in its work in the step (the judge decides it:
    :func:`hf_distprof.analysis.judge.diagnosis.entered_late`)."""

    rank: int
    start_lag_us: float
    """How much later than the earliest rank it began the step (median over steps)."""
    lateness_us: float
    """How much later than the earliest rank it reached the step's collectives (median over steps)."""


@dataclass
class FsdpFacts:
    kind: str
    """``all_gather`` or ``reduce_scatter``."""
    rank: int
    row: CommKindStat
    steps: int
    threshold_pct: float
    backward: bool
    """all_gather: most of the exposed time in backward."""
    unit: tuple[str, str | None, float] | None
    """The most exposed unit: (module, phase, ms per step)."""
    cpu: bool


@dataclass
class StragglerFacts:
    straggler: Straggler
    verdict: SlowRankVerdict
    basis: Basis
    """What the straggler verdict weighed (:class:`~hf_distprof.analysis.results.findings.Basis`)."""
    matched: int
    """Collectives matched across the ranks."""
    waits: PeerWaits | None = None
    """Who waits for it, when the slow rank's chain does not stand in for this finding."""
    entered_late: EnteredLate | None = None
    """A late straggler whose lateness arose before the step began; None otherwise."""
    late: bool = False
    """Named for its lateness at the step's collectives (``lateness_us``); else for slow steps (``step_excess_pct``)."""
    lateness_pct: float = 0.0
    """With ``late``: its lateness, % of the median rank's step (``step_us``; 0 without one)."""
    named_with: int | None = None
    """The rank the straggler verdict names, when this one is late together with it (a late minority of 3+ ranks)."""
    window_disagrees: bool = False
    """Named by the step timer over the run, while the traced window shows this rank waiting longer at its collectives
    than its peers: the window does not show the slowdown, the run's untraced steps carry the verdict
    (:func:`hf_distprof.analysis.judge.diagnosis.straggler_facts`)."""


@dataclass
class ImbalanceFacts:
    rank: int
    busy_us: float
    typical_us: float
    verdict: SlowRankVerdict
    waits: PeerWaits | None = None


@dataclass
class LowUtilFacts:
    busy_pct: float
    low: int
    ranks: int
    lowest: int
    lowest_pct: float
    threshold_pct: float


@dataclass
class LaunchBoundFacts:
    tiny_pct: float
    kernels_per_step: float
    tiny_kernel_us: float
    idle_pct: float


@dataclass
class DataLoadingFacts:
    pct: float
    hit: int
    ranks: int
    threshold_pct: float
    gpu: bool
    loader: LoaderSettings | None = None
    """The run's DataLoader settings (the step timer's summary): its data advice leaves out what they set."""


@dataclass
class MemoryFacts:
    kind: str
    rank: int
    high: DeviceMemory
    typical_bytes: float
    pct: float
    threshold_pct: float


@dataclass
class ChainFacts:
    """The slow rank's causal chain: one phase of its step explains its peers' waits."""

    rank: int
    phase: PhaseExcess
    source_steps: int
    lateness_us: float | None
    step_us: float
    """Its mean step (wall time) over the traced steps."""
    waits: PeerWaits
    verdicts: list[tuple[str, SlowRankVerdict]]
    """Every raised verdict naming the rank, the straggler's first."""
    data_pct: float | None
    """When a data-loading finding naming only it is folded in: data loading's share of its step."""
    gpu: bool
    cause: Attribution | None = None
    """Why, from the step timer's records over the run (its figures are the live warning's)."""
    lateness_pct: float = 0.0
    """``lateness_us`` as % of ``step_us`` (0 without either)."""
    loader: LoaderSettings | None = None
    """The run's DataLoader settings (the step timer's summary): its data advice leaves out what they set."""


@dataclass
class BurstFacts:
    """A rank that held the others back in a burst of steps, not over the run (:mod:`hf_distprof.core.burst`)."""

    burst: Burst


@dataclass
class RunSlowFacts:
    """The slow rank named by the step timer over the run, its traced window not explaining it."""

    rank: int
    verdict: SlowRankVerdict
    phase: PhaseExcess | None
    """The phase the step timer shows slower (None: none is)."""
    waits: PeerWaits | None
    gpu: bool
    cause: Attribution | None = None
    """Why, from the step timer's records over the run (its figures are the live warning's)."""
    advice_phase: str = "compute"
    """The phase the advice is for: ``phase``'s, else compute (no phase stands out: its work as a whole)."""
    loader: LoaderSettings | None = None
    """The run's DataLoader settings (the step timer's summary): its data advice leaves out what they set."""


@dataclass
class FixFirstFacts:
    top: WhatIfScenario
    worth: list[WhatIfScenario]
    """Every scenario beyond the noise and the threshold, in order."""
    model: WhatIfModel
    threshold_pct: float
    gpu: bool
    backend: str | None
    fsdp: bool
    loader: LoaderSettings | None = None
    """The run's DataLoader settings (the step timer's summary): its data advice leaves out what they set."""


@dataclass
class SlowdownFacts:
    ratio: float
    threshold_ratio: float
    warning: str
    cost: str | None = None
    """What the warning names as the cost (:attr:`hf_distprof.core.overhead.ProfilerSlowdown.cost`)."""


@dataclass
class QuietSlowdown:
    """The profiler's slowdown when it raised no finding (:func:`hf_distprof.analysis.judge.slowdown.quiet_slowdown`):
    its ratio against the untraced steps, or why there is none."""

    threshold_ratio: float
    ratio: float | None = None
    """Median traced step over the median untraced one; None when the run had too few untraced steps (``note``)."""
    note: str | None = None
    """Why there is no ratio, as the step timer wrote it."""
    noise_pct: float | None = None
    """The run's own noise for the ratio; None in older summaries (which compared with every other step)."""
    within_noise: bool = False
    """Whether the ratio is within 1 +- the run's noise (the judge's decision; False without a noise)."""
    noise_only: bool = False
    """Whether the ratio is above the threshold, quiet only because it lies within the run's noise."""
    below_threshold: bool = False
    """Whether the ratio is at most the threshold (neither this nor ``noise_only``: a summary written otherwise)."""
    steps_inside: int | None = None
    """The steps under the profiler (its warm-up and recorded steps); None in older summaries."""
    steps_before: int = 0
    """Untraced steps before the window, left out (a run's first steps run slower)."""
    steps_after: int = 0
    """Untraced steps after the window's start: what the ratio compares with."""
    steps_left_out: list[int] = field(default_factory=list)
    """Steps the profiler ran over, left out of ``steps_inside`` (after a pause); empty in older summaries."""


@dataclass
class Question:
    """A question the run could not decide, as the judge left it (its words: :func:`hf_distprof.analysis.tell.
    findings.undecided`)."""

    question: str
    ranks: list[int]
    basis: Basis
    steps: int | None
    verdict: SlowRankVerdict | None = None
    """A slow-rank verdict too short to decide."""
    withheld: Judgement | None = None
    """A finding withheld: the traced window was distorted and the step timer names no slow rank."""
    ratio: float = 0.0
    """With ``withheld``: how much slower the traced steps ran."""
    timer_reason: str = ""
    """With ``withheld``: the step timer's verdict in words."""
    missing: list[int] = field(default_factory=list)
    """With ``withheld``: the ranks whose traces could not be read, when that is why it was withheld (their peers'
    time in collectives cannot be split into waiting for them and the transfer)."""
    coverage: Coverage | None = None
    """With ``withheld``: ranks that took no window by choice (``--profile-ranks``), when that is why."""
    ended: dict[int, str] = field(default_factory=dict)
    """Of ``missing``: the ranks that ended before the run (``crashed``: its crash file; ``unfinished``)."""


@dataclass
class Coverage:
    """Waits the traces may not hold (:func:`hf_distprof.analysis.judge.coverage.unmeasured`)."""

    untraced: list[int]
    """Ranks that took no window (``--profile-ranks``)."""
    slow: int | None
    """The rank the step timer's verdict over the run names (None: no verdict)."""
    windows: list[tuple[int, int]]
    """The windows (first, last step) that did not trace ``slow``, though it was traced in another."""


@dataclass
class WindowFacts:
    """Where the traced window's own slow-rank verdict disagrees with the run's, which the answer follows."""

    question: str
    window: SlowRankVerdict
    run: SlowRankVerdict
    traced_step_ms: list[float]
    untraced_step_ms: float | None
    noise_pct: float | None
    ratio: float | None = None
    """The traced steps' median over the untraced median; None without both."""
    beyond_noise: bool = False
    """Whether ``ratio`` is further from 1 than the run's own noise (the judge's decision)."""


@dataclass
class Judged:
    """Everything the judge decided (:func:`hf_distprof.analysis.judge.findings.judge`), before the words."""

    verdicts: RankVerdicts
    findings: list[Judgement]
    """In the one order every output shows them."""
    questions: list[Question]
    windows: list[WindowFacts]
    slowdown: dict[str, Any] | None
    """The profiler's slowdown (:func:`hf_distprof.analysis.judge.slowdown.slowdown_of`)."""
    what_if: WhatIf | None
    """The replay, each saving judged, in order (None without one)."""
    quiet_slowdown: QuietSlowdown | None = None
    """The profiler's slowdown when it raised no finding; None when it did, or without one."""
    slowest: tuple[int | None, str | None] = (None, None)
    """The rank the answer calls slowest, and what names it (:func:`hf_distprof.analysis.judge.findings.
    slowest_rank`)."""
    unread: list[int] = field(default_factory=list)
    """The ranks whose traces the run's manifest lists and the analysis did not read (not given, or unreadable)."""
    unmeasured: list[int] = field(default_factory=list)
    """The ranks the others' waits for are not in the traces read (unread, or untraced where it matters): the late-peer
    wait is then no figure (:func:`hf_distprof.analysis.judge.coverage.unmeasured`)."""
