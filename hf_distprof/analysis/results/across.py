"""What comparing the ranks yields (plain data, built in the parent process): skew, stragglers, verdicts and the
collectives' bandwidth."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_distprof.analysis.results.rank import Collective, CollectiveKey
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
class RunEvidence:
    """The run's timed steps beyond the traced window, as the step timer recorded them: what the slow-rank answer and
    the what-if's noise rest on (:func:`hf_distprof.analysis.across.evidence.run_evidence`)."""

    steps: int
    """The steps judged: the ones the step timer's verdict judges (untraced, after its warm-up)."""
    noise_ms: float
    """Step-to-step noise of the step time over those steps (scaled median absolute deviation), ms."""
    slowest_rank: int | None
    """The slow-rank verdict's candidate: the rank whose own work exceeds its peers' most (median over the steps)."""
    fastest_rank: int | None
    """The rank with the least own work per step (median over the steps)."""
    slow_rank_real: bool
    """Whether the verdict engine calls the candidate's excess real (beyond the run's noise and persistent over the
    steps), whatever its size: a what-if saving on that rank counts only then."""
    slow_rank_excess_ms: float | None = None
    """The candidate's excess over its peers' own work, ms per step (median over the steps): at most what its peers
    wait for it, so the most that bringing it to their pace saves (None without a candidate)."""
    fastest_gap_ms: float | None = None
    """The candidate's own work less the fastest rank's, ms per step (median over the steps; with 2 ranks
    ``slow_rank_excess_ms``): the most that every rank at the fastest's pace saves (None without both)."""
    step_ms: float | None = None
    """The median step time over the judged steps, ms."""


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

@dataclass
class StepSpread:
    """Step duration across ranks for one step number."""

    step: int
    min_us: float
    max_us: float
    spread_pct: float  # (max - min) / median

@dataclass
class Straggler:
    """A rank that holds the others back, with the numbers that say so."""

    rank: int
    reason: str  # "late_collectives" or "slow_steps"
    evidence: str
    summary: str
    """The measurement that names it, in one sentence (the start of ``evidence``)."""
    lateness_us: float | None
    step_excess_pct: float | None
    confidence: float | None = None
    """1 - p of the arrival-order test (:mod:`hf_distprof.core.verdicts`); None for the 3+-rank step outlier."""

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
