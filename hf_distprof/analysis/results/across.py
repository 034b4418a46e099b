"""What comparing the ranks yields (plain data, built in the parent process): the ranks on one clock, who waits for
whom, the skew the slow-rank verdicts judge, the step timer's account of the run, the collectives' bandwidth; and the
cross-rank view ``--json`` shows (:class:`CrossRankResult`, its verdicts the judge's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_distprof.analysis.results.findings import Basis
from hf_distprof.analysis.results.rank import Collective, CollectiveKey, CommKindStat, ModuleCommStat
from hf_distprof.core.cause import Attribution
from hf_distprof.core.verdicts import SlowRankVerdict


@dataclass
class Alignment:
    """The ranks on one clock (:func:`hf_distprof.analysis.across.align.align`): computed once per run.

    Not in ``AnalysisResult.to_dict``: its figures are there already, as each rank's ``clock_offset_us`` and
    ``matched_collectives``.
    """

    matched: dict[CollectiveKey, dict[int, Collective]]
    """The collectives found on every rank: (step, kind, k-th of that kind in the step) -> rank -> its collective."""
    offsets: dict[int, float]
    """Microseconds to subtract from each rank's timestamps to put them on the first rank's clock."""
    arrivals: dict[CollectiveKey, dict[int, float]]
    """When each rank reached each matched collective (its start), on the first rank's clock."""



@dataclass
class TimerFigures:
    """What the step timer's records say about the run, computed once (:func:`hf_distprof.analysis.across.evidence.
    timer_figures`): every later stage reads these, never the rows."""

    cpu_wait: dict[int, dict[int, float]] = field(default_factory=dict)
    """rank -> step -> seconds its training thread waited for a CPU (``cpu_wait_s``)."""
    own_work: dict[int, dict[int, float]] = field(default_factory=dict)
    """rank -> step -> the step's own work as the timer judges it (``own_work_s``); empty for older files."""
    own_step: dict[int, float] = field(default_factory=dict)
    """step -> the step less the ranks' wait for a CPU (``own_step_s``, else ``step_s``; the largest over ranks; a
    step no row times is left out)."""
    step_times: dict[int, float] = field(default_factory=dict)
    """step -> its time (the slowest rank's ``step_s``), the warm-up and the profiler's busy steps left out."""
    judged: list[int] = field(default_factory=list)
    """The steps the run's slow-rank verdict judges, in order: every rank's, less the warm-up and the traced steps,
    among the latest the timer keeps (empty for older files or fewer than 2 ranks)."""
    phases: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """phase -> rank -> its seconds in each judged step (data, forward, backward, optimizer)."""
    marked_traced: set[int] = field(default_factory=set)
    """The steps the rows mark as traced by the profiler."""
    parts: dict[int, dict[int, tuple[float, ...]]] = field(default_factory=dict)
    """rank -> step -> (pre-sync time, its wait for a CPU, data loading, own compute, tokens, samples): what the
    run's verdict weighs when own work names no rank, and what says why a rank is slow
    (:func:`hf_distprof.timing.report.step_row`'s parts, read back from the records)."""

    def judged_work(self) -> dict[int, list[float]]:
        """rank -> its own work in each judged step (what the run's verdict judges)."""
        return {r: [self.own_work[r][s] for s in self.judged] for r in sorted(self.own_work)} if self.judged else {}

    def judged_step_time(self) -> list[float]:
        """The step less the ranks' wait for a CPU, in each judged step (what the verdict's materiality weighs)."""
        return [self.own_step.get(s, 0.0) for s in self.judged]

    def judged_parts(self) -> dict[int, list[tuple[float, ...]]]:
        """rank -> its parts in each judged step; empty when a rank lacks them in one (older records)."""
        if not self.judged or any(s not in self.parts.get(r, {}) for r in self.own_work for s in self.judged):
            return {}
        return {r: [self.parts[r][s] for s in self.judged] for r in sorted(self.own_work)}


@dataclass
class RunEvidence:
    """The run's timed steps beyond the traced window, as the step timer recorded them: what the slow-rank answer and
    the what-if's noise rest on (:func:`hf_distprof.analysis.across.evidence.run_evidence`)."""

    steps: int
    """The steps judged: the ones the step timer's verdict judges (untraced, after its warm-up)."""
    noise_ms: float
    """Step-to-step noise of the step time over those steps (scaled median absolute deviation), ms."""
    slowest_rank: int | None
    """The slow-rank verdict's candidate: the rank whose own work exceeds its peers' most (median over the steps;
    :func:`hf_distprof.core.verdicts.candidate`)."""
    fastest_rank: int | None
    """The rank with the least own work per step (median over the steps)."""
    excess_ms: dict[int, float] = field(default_factory=dict)
    """Per rank, its own work over its peers' (their median), ms per step (interquartile mean over the steps): at most
    what its peers wait for it, so the most that bringing it to their pace saves."""
    fastest_gap_ms: float | None = None
    """The candidate's own work less the fastest rank's, ms per step (interquartile mean over the steps; with 2 ranks
    its excess): the most that every rank at the fastest's pace saves (None without both)."""
    step_ms: float | None = None
    """The median step time over the judged steps, ms."""


@dataclass
class PhaseExcess:
    """How much longer one phase of a rank's step is than its peers', per step: the phase that exceeds them most."""

    phase: str
    excess_us: float
    """The rank's time in the phase less the median of its peers', per step (interquartile mean over the steps)."""
    steps: int
    from_timer: bool = False
    """Whether it comes from the step timer's records over the judged steps (else from the traced window)."""


@dataclass
class LatePeer:
    """How long one rank waits at its collectives for one peer that reached them last: the one account of the wait
    per late peer (:func:`hf_distprof.analysis.across.comm.rank_waits`)."""

    peer: int
    pct: float
    """% of the waiting rank's step (the per-kind table's base), mean over its steps."""
    us: float
    """Microseconds per step, mean over its steps."""
    kinds: list[tuple[str, float]] = field(default_factory=list)
    """(per-kind table row, % of the step), largest first (ties: in the order first met)."""


@dataclass
class RankSkew:
    """One rank as seen against its peers."""

    rank: int
    mean_step_us: float
    busy_us: float
    comm_wait_us: float
    lateness_us: float | None
    """How much later than the earliest rank this rank reaches a collective: its latest arrival in each step,
    median over steps."""
    clock_offset_us: float
    lateness_steps: list[int] = field(default_factory=list)
    """The steps with a matched collective, in order."""
    lateness_per_step_us: list[float] = field(default_factory=list)
    """The rank's latest arrival after the earliest rank in each of ``lateness_steps``."""
    start_lag_us: float | None = None
    """The part of ``lateness_us`` that arose before this rank began the step, median over steps: per step its lateness
    less its own excess from its step start to that arrival over its peers' median (aligned clocks); with 2 ranks, for
    the late one, how much later it began the step. None without a matched collective."""

@dataclass
class StepSpread:
    """Step duration across ranks for one step number."""

    step: int
    min_us: float
    max_us: float
    spread_pct: float  # (max - min) / median

@dataclass
class Straggler:
    """A rank that holds the others back, with the numbers that say so (the judge names it:
    :func:`hf_distprof.analysis.judge.verdicts.stragglers`)."""

    rank: int
    reason: str
    """``late_collectives`` (the straggler verdict names it) or ``slow_steps`` (3+ ranks: its steps stand out)."""
    lateness_us: float | None
    step_excess_pct: float | None
    confidence: float | None = None
    """1 - p of the arrival-order test (:mod:`hf_distprof.core.verdicts`); None for the 3+-rank step outlier."""
    step_us: float = 0.0
    """The median rank's mean step, us."""
    mean_step_us: float = 0.0
    """This rank's mean step, us."""
    comm_wait_us: float = 0.0
    """Its exposed communication per step, us."""
    peer_wait_us: float = 0.0
    """Its peers' exposed communication per step (their mean), us."""
    spread_us: float = 0.0
    """``slow_steps``: 3 scaled median absolute deviations of the ranks' mean steps, us."""


@dataclass
class Skew:
    """The ranks against each other in the traced steps (figures only, :func:`hf_distprof.analysis.across.skew.skew`):
    what the slow-rank verdicts judge."""

    per_rank: list[RankSkew]
    step_spread: list[StepSpread]
    imbalance_pct: float
    matched_collectives: int
    lateness: dict[int, list[float]] = field(default_factory=dict)
    """rank -> its latest arrival after the earliest rank in each step every rank has a matched collective in, us."""
    lateness_scale: list[float] = field(default_factory=list)
    """The median step time of each of those steps, us (what lateness is a share of)."""
    busy: dict[int, list[float]] = field(default_factory=dict)
    """rank -> its own work in each step every rank traced, us: busy time, less its wait for a CPU, or the step
    timer's own work in those steps when it has every one."""
    busy_what: str = ""
    """What ``busy`` is, as a verdict names it."""
    busy_step_time: list[float] = field(default_factory=list)
    """The step time of each of those steps, us (the imbalance's materiality)."""
    busy_is_own_work: bool = False
    """Whether ``busy`` is the figure the step timer judges (own work): the window's effect then pools with the
    timer's (:func:`hf_distprof.core.run_verdict.across_the_run`)."""


@dataclass
class RankVerdicts:
    """Which rank holds the others back: the judge's slow-rank verdicts (:func:`hf_distprof.analysis.judge.verdicts.
    judge_ranks`), each with the evidence it rests on."""

    straggler: SlowRankVerdict | None = None
    """Lateness at the step's collectives, the answer (the run's when the step timer decided it)."""
    imbalance: SlowRankVerdict | None = None
    """Busy time (own work) per step, the answer."""
    straggler_window: SlowRankVerdict | None = None
    """What the traced window alone says about lateness."""
    imbalance_window: SlowRankVerdict | None = None
    straggler_basis: Basis = Basis.TRACE
    """What the straggler answer rests on: the window alone (``TRACE``), the window weighed with the step timer's
    verdict (``TRACE_AND_TIMER``), or the step timer's verdict over the run, the window one more sample
    (``STEP_TIMER``)."""
    imbalance_basis: Basis = Basis.TRACE
    run: SlowRankVerdict | None = None
    """The step timer's verdict over the run's untraced steps (judged again from its records, else its summary's)."""
    run_json: dict[str, Any] | None = None
    """The same as written (``timing_summary.json``'s ``imbalance_verdict`` when its records cannot say), whatever
    fields it has: a partial one still says whether the timer named a rank."""
    run_real: bool | None = None
    """With the step timer's records: whether the run's candidate's excess is real (beyond its noise and persistent,
    whatever its size), which a saving on its pace needs to count; None without them."""
    stragglers: list[Straggler] = field(default_factory=list)
    cause: Attribution | None = None
    """Why the run's verdict names its rank, from the step timer's records (:mod:`hf_distprof.core.cause`); None when
    it names none or the records lack the figures."""

    def raised(self) -> list[tuple[str, SlowRankVerdict, Basis]]:
        """The raised verdicts that name a rank, the straggler's first."""
        out = [("straggler", self.straggler, self.straggler_basis), ("imbalance", self.imbalance, self.imbalance_basis)]
        return [(name, v, basis) for name, v, basis in out if v is not None and v.raised and v.rank is not None]


@dataclass
class CrossRankResult:
    """Comparison of the ranks."""

    ranks: list[int]
    per_rank: list[RankSkew]
    step_spread: list[StepSpread]
    imbalance_pct: float
    """Load imbalance of busy time: the busiest rank over the median of the others, - 1, in %
    (:func:`hf_distprof.core.verdicts.imbalance_pct`)."""
    matched_collectives: int
    stragglers: list[Straggler]
    straggler_verdict: SlowRankVerdict | None = None
    """The noise-aware decision on lateness at collectives, with its evidence (raised, quiet, undecided)."""
    imbalance_verdict: SlowRankVerdict | None = None
    """The same decision on busy time per step."""
    straggler_window: SlowRankVerdict | None = None
    """What the traced window alone says about lateness (before the step timer's records are weighed): the answer
    when the timer is absent, one more sample beside the timer's answer otherwise."""
    imbalance_window: SlowRankVerdict | None = None
    """What the traced window alone says about busy time."""
    slowest_rank: int | None = None
    """The rank the answer calls slowest (the box, the trackers' headline): the one the first slow-rank finding names,
    else the one the what-if replays at its peers' pace (:func:`hf_distprof.analysis.judge.findings.slowest_rank`)."""
    slowest_by: str | None = None
    """What names it: ``finding:<kind>`` (``slow_rank``, ``straggler``, ``imbalance``); else the verdict whose
    candidate it is (``imbalance``, ``straggler``: the box states its figure); else where the what-if took it from:
    ``run`` (the most own work over the run's judged steps, the step timer's records), ``lateness`` (the latest at
    the traced steps' collectives), ``replay`` (the most local work per traced step). None with one rank."""

@dataclass
class BandwidthStat:
    """Collectives of one kind, group size and message-size bucket, over all ranks
    (:mod:`hf_distprof.analysis.across.bandwidth`).

    Bandwidths are in GB/s (1e9 bytes per second, as nccl-tests print them). ``algbw`` is bytes over the
    collective's whole time; ``busbw`` scales it by nccl-tests' factor for the kind, so that it compares
    with the link's bandwidth. A collective's time includes waiting for the last rank to arrive: the
    ``transfer_*`` bandwidths divide by the rest, the time data was moving, and are the honest figures.
    """

    kind: str
    group_size: int | None
    bucket: str
    """Size range, like "1-4 MiB" (low bound included)."""
    bucket_low_bytes: int
    bucket_high_bytes: int
    ranks: int
    """Ranks with collectives in this row."""
    count: int
    """Collectives in this row, counted once per rank that ran them."""
    count_per_rank: float
    mean_bytes: float
    time_us: float
    """Their time, summed, per rank (mean over the ranks)."""
    algbw_gbps: float | None
    busbw_gbps: float | None
    """None for a kind without an nccl-tests factor."""
    matched: int
    """Collectives in this row found on every rank, whose wait could be measured (0 with one rank)."""
    wait_us: float
    """Of the matched ones' time, per rank: waiting for the last rank to arrive."""
    transfer_us: float
    """Of the matched ones' time, per rank: the rest, data moving."""
    transfer_algbw_gbps: float | None
    """Bytes of the matched collectives over their transfer time; None when none is matched."""
    transfer_busbw_gbps: float | None

    @property
    def wait_pct(self) -> float | None:
        """% of the matched collectives' time spent waiting for a late peer; None when none is matched."""
        total = self.wait_us + self.transfer_us
        return 100.0 * self.wait_us / total if self.matched and total > 0 else None

@dataclass(frozen=True)
class ReferencePoint:
    """One measured size of one collective kind."""

    kind: str
    bytes: int
    busbw_gbps: float
    world_size: int

@dataclass
class BandwidthVsReference:
    """One :class:`BandwidthStat` row against a reference bandwidth measured by ``hf-distprof
    bench-collectives`` (``analyze --bandwidth-ref``; :mod:`hf_distprof.analysis.across.reference`).

    Of the row's time per rank, ``late_peer_us`` was spent waiting for the last rank to arrive; the rest,
    ``time_us``, moved data at ``busbw_gbps`` and would have taken ``at_ref_us`` at the reference's busbw.
    The difference, when positive, is ``slow_network_us``: time lost to a network slower than measured.
    """

    kind: str
    group_size: int | None
    bucket: str
    mean_bytes: float
    ref_bytes: int
    """The reference size used: the nearest (in ratio) of the same kind."""
    ref_world_size: int
    ref_busbw_gbps: float
    basis: str
    """"transfer" (the matched collectives, waits taken out) or "whole" (one rank: waits cannot be told apart)."""
    busbw_gbps: float
    time_us: float
    """Per rank: the transfer time (basis "transfer") or the whole time ("whole")."""
    at_ref_us: float
    """``time_us`` at the reference busbw."""
    slow_network_us: float
    """``time_us - at_ref_us``, 0 when the trace was at least as fast."""
    late_peer_us: float | None
    """Per rank: waiting for the last rank (basis "transfer"); None with basis "whole"."""


@dataclass
class ReferenceTotals:
    """Per rank, over the :class:`BandwidthVsReference` rows: the compared time, the same at reference speed, the
    time lost to a slow network, the wait for a late peer (us)."""

    time_us: float
    at_ref_us: float
    slow_network_us: float
    late_peer_us: float
    waits_separated: bool = True
    """Whether the rows' waits for a late peer are known (``late_peer_us``), so that ``time_us`` is the transfers
    alone; False with one rank, where the compared time includes the waits."""


@dataclass
class Across:
    """Every figure the across stage computes, once (:func:`hf_distprof.analysis.across.compare.compare`): what the
    what-if replays and the judge decides from."""

    alignment: Alignment
    traced: set[int]
    """The steps the traces hold (on any rank)."""
    common_steps: list[int]
    """The steps every rank traced, in order."""
    timer: TimerFigures
    evidence: RunEvidence | None
    """The step timer's account of the run's judged steps; None without records of 2+ ranks."""
    skew: Skew | None
    """None with one rank."""
    comm_by_kind: list[CommKindStat]
    """The per-kind table averaged over the ranks."""
    comm_by_module: list[ModuleCommStat]
    wait_pct_per_step: dict[int, list[float]]
    """rank -> per step (its steps, in order), that wait in % of the step (GPU: its GPU span)."""
    transfer_pct_per_step: dict[int, list[float]]
    """rank -> per step, the exposed communication that is neither such a wait nor the rank's lag after the
    collectives completed, % of the step (GPU: its GPU span)."""
    exposed_pct_per_step: dict[int, dict[str, list[float]]]
    """rank -> per-kind table row -> its exposed share of each of the rank's steps, % (on the table's base)."""
    late_peers: dict[int, list[LatePeer]]
    """waiting rank -> the peers it waits for, longest wait first (ties: the lower rank)."""
    phase_excess: dict[int, PhaseExcess]
    """rank -> the phase of its step that exceeds its peers' most (2+ ranks)."""
    pace: tuple[int | None, int | None]
    """The slowest and the fastest rank as the run's evidence sees them, which the what-if's rank-pace scenarios
    change (None: the replay picks by the traced steps' local work)."""
    bandwidth: list[BandwidthStat]
    unsized_collectives: int
    bandwidth_reference: list[BandwidthVsReference]
    reference_totals: ReferenceTotals | None
    lag_pct_per_step: dict[int, list[float]] = field(default_factory=dict)
    """rank -> per step, its exposed communication after its collectives completed (its lag: on gloo, mostly its
    thread waiting for a CPU), % of the step (GPU: its GPU span)."""
