"""Result and option dataclasses of the analysis. Plain data: every result serialises to JSON."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.core.verdicts import SlowRankVerdict

if TYPE_CHECKING:
    from hf_distprof.analysis.manifest import RunSummary
    from hf_distprof.analysis.whatif import WhatIfModel, WhatIfScenario
    from hf_distprof.analysis.whatif_path import CriticalSegment
    from hf_distprof.analysis.whatif_timeline import RankTimeline


@dataclass
class GpuBreakdown:
    """HTA's temporal breakdown and communication/computation overlap over one set of GPU events.

    ``kernel_time_us`` is HTA's "kernel time": from the start of the first GPU event to the end of the
    last. ``idle`` is the part of it with no GPU event running, ``compute`` the union of computation
    kernels, ``non_compute`` the rest (communication, memory and other kernels not under computation).
    """

    kernel_time_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_us: float
    """Union of communication kernels."""
    comm_comp_overlap_pct: float | None
    """HTA's overlap: % of communication time during which computation also runs (None: no comm)."""
    exposed_comm_us: float
    """Communication time with no computation running: what the step pays for communication."""
    exposed_comm_pct: float
    memory_us: float
    n_kernels: int
    n_tiny_kernels: int
    category_overlap_us: dict[str, float] = field(default_factory=dict)
    """Exclusive time per combination of running categories, HTA's ``kernel_type`` table."""


@dataclass
class CpuBreakdown:
    """The main (training-loop) thread's time in one step, split into exclusive categories.

    ``compute``: inside CPU ops or annotations; ``communication``: enqueueing collectives (``c10d::*``)
    plus idle time while a collective of this rank is in flight (the thread waits on it);
    ``data_loading``: inside ``enumerate(DataLoader)``; ``other``: idle time with no collective in flight.
    """

    duration_us: float
    compute_us: float
    communication_us: float
    data_loading_us: float
    other_us: float
    comm_busy_us: float
    """Union of the collectives' own spans (``gloo:*`` on worker threads, NCCL kernels on GPU)."""
    comm_backward_overlap_pct: float | None
    """% of ``comm_busy_us`` that overlaps backward ops on the main thread (None: no collective)."""

    def pct(self, value: float) -> float:
        """``value`` as a percentage of the step."""
        return 100.0 * value / self.duration_us if self.duration_us > 0 else 0.0


@dataclass
class StepResult:
    """One rank's one ``ProfilerStep#N``."""

    step: int
    start_us: float
    duration_us: float
    cpu: CpuBreakdown
    gpu: GpuBreakdown | None
    n_collectives: int

    def busy_us(self, device: str) -> float:
        """The rank's own work in this step: compute kernels on GPU; compute plus data loading on CPU.

        Untraced gaps ("other") are left out: on a loaded host they are mostly the thread being
        descheduled, and counting them made clean runs look imbalanced.
        """
        if device == "gpu":
            return self.gpu.compute_us if self.gpu is not None else 0.0
        return self.cpu.compute_us + self.cpu.data_loading_us


@dataclass
class KernelStat:
    """Aggregate of one kernel name on one rank (all steps)."""

    name: str
    category: str
    kind: str
    count: int
    total_us: float
    min_us: float
    max_us: float

    @property
    def mean_us(self) -> float:
        """Mean duration."""
        return self.total_us / self.count if self.count else 0.0


@dataclass
class Collective:
    """One collective as it ran on one rank: its own time span (GPU kernel or gloo span)."""

    step: int
    kind: str
    index: int  # k-th collective of this kind in the step, the key that matches it across ranks
    start_us: float
    end_us: float
    issued_us: float | None = None
    """When the training code issued it (the c10d op on CPU, the kernel launch on GPU); None if unknown."""
    module: str | None = None
    """The FSDP unit it gathers or reduces for ("" for the root), from ``FSDP::all_gather (<module>)`` /
    ``FSDP::post_backward_reduce (<module>)``; None when not issued by FSDP."""
    phase: str | None = None
    """"forward" or "backward" when issued inside FSDP's forward or backward hooks, else None."""
    exposed_us: float = 0.0
    """The part of its span that nothing hides: on GPU no computation kernel runs, on CPU the training
    thread waits for communication."""
    bytes: int | None = None
    """Its message size as nccl-tests define it (all_gather: the gathered output, reduce_scatter: the
    input, otherwise the buffer), from the trace; None when the trace does not record it."""
    group_size: int | None = None
    """Ranks taking part: the process group's size when the trace records it, else the world size."""
    exposed_share: list[tuple[float, float, int]] = field(default_factory=list)
    """Its share of the rank's exposed communication, as ``(start, end, step)`` pieces: every exposed moment goes to
    one collective, the earliest started of those in flight (the one the rank waits on), so that pieces never
    overlap and the per-kind tables add up to the step's exposed communication (``exposed_us`` counts a moment once
    per collective in flight). ``step`` is the step whose exposed communication the piece is part of."""
    peers_in_us: float | None = None
    """When the last rank taking part reached it, on this rank's clock (clocks aligned across ranks,
    :func:`hf_distprof.analysis.comm.set_waits`); exposed time before then is waiting for a late peer. None when it
    was not matched on every rank."""
    waited_for: int | None = None
    """The rank that arrived last, when it is another rank (this one waited for it); else None."""

    @property
    def duration_us(self) -> float:
        """Its own time."""
        return self.end_us - self.start_us

    @property
    def exposed_share_us(self) -> float:
        """Total of :attr:`exposed_share`."""
        return sum(e - s for s, e, _ in self.exposed_share)


@dataclass
class CommKindStat:
    """One kind of collective (all_gather, reduce_scatter, all_reduce, other) on one rank, per step."""

    kind: str
    kinds: list[str]
    """The collective kinds counted in this row (several for "other": all_to_all, broadcast ...)."""
    count_per_step: float
    time_us: float
    """Mean per step of the collectives' own time (GPU kernels, gloo spans): the union of their spans, so two
    overlapping collectives (gloo's two worker threads, two NCCL streams) count their common time once."""
    exposed_us: float
    """Mean per step of this kind's share of the step's exposed communication (:attr:`Collective.exposed_share`):
    the rows of a rank add up to its exposed communication."""
    exposed_pct: float
    """Exposed time as % of the step (GPU: the step's GPU span; CPU: its wall time), mean over steps: the rows of a
    rank add up to the headline's exposed communication of that rank."""
    exposed_pct_median: float
    """Median over the steps of each step's exposed share (what findings compare to their threshold)."""
    forward_exposed_us: float
    """Per step, exposed time of those issued in FSDP's forward (0 without FSDP annotations)."""
    backward_exposed_us: float
    """Per step, exposed time of those issued in FSDP's backward (0 without FSDP annotations)."""
    wait_us: float = 0.0
    """Of ``exposed_us``: waiting for a late peer (before the last rank reached the same collective)."""
    wait_pct: float = 0.0
    """``wait_us`` as % of the step (same base as ``exposed_pct``), mean over steps."""
    waited_for: list[int] = field(default_factory=list)
    """The ranks waited for, longest wait first."""

    @property
    def transfer_us(self) -> float:
        """Exposed time that is not a wait for a late peer: the collective itself (what the network and the
        collective's size decide)."""
        return max(0.0, self.exposed_us - self.wait_us)

    @property
    def transfer_pct(self) -> float:
        """``transfer_us`` as % of the step."""
        return max(0.0, self.exposed_pct - self.wait_pct)

    @property
    def overlap_pct(self) -> float | None:
        """% of the time that is hidden behind computation; None when there is no time."""
        return 100.0 * (1.0 - self.exposed_us / self.time_us) if self.time_us > 0 else None


@dataclass
class ModuleCommStat:
    """The collectives of one FSDP unit of one kind and phase, per step, averaged over the ranks."""

    module: str
    """The unit's module name; "" is the root."""
    kind: str
    phase: str | None
    count_per_step: float
    time_us: float
    exposed_us: float


@dataclass
class BandwidthStat:
    """Collectives of one kind, group size and message-size bucket, over all ranks
    (:mod:`hf_distprof.analysis.bandwidth`).

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


@dataclass
class BandwidthVsReference:
    """One :class:`BandwidthStat` row against a reference bandwidth measured by ``hf-distprof
    bench-collectives`` (``analyze --bandwidth-ref``; :mod:`hf_distprof.analysis.bandwidth_ref`).

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
class MemoryStepStat:
    """One device's memory in one ``ProfilerStep#N``, from the ``[memory]`` events."""

    step: int
    peak_allocated_bytes: int
    """The most allocated on the device during the step ("Total Allocated"), counting what it held when the
    step began."""
    allocated_bytes: int
    """Sum of the step's allocations."""
    freed_bytes: int
    """Sum of the step's frees."""
    n_allocations: int
    n_frees: int


@dataclass
class MemoryOpStat:
    """The allocations on one device attributed to one operator: the innermost ``cpu_op`` around each
    allocation on its thread ("(no operator)" when none is)."""

    name: str
    allocated_bytes: int
    count: int


@dataclass
class DeviceMemory:
    """One rank's memory on one device over the traced steps (:mod:`hf_distprof.analysis.memory`)."""

    device: str
    """"cpu", "cuda:0" ..."""
    peak_allocated_bytes: int
    """The highest "Total Allocated" over the traced steps."""
    peak_step: int
    """The step in which it is first reached."""
    window_start_us: float
    """Start of the first traced step, in the trace's clock: the origin of ``series_ms``."""
    steps: list[MemoryStepStat]
    """From the first step in which the device allocates or frees (before it, its level is unknown)."""
    top_ops: list[MemoryOpStat]
    """The operators that allocate most bytes over the traced steps, most first."""
    series_ms: list[float]
    """Times of ``series_bytes``, ms since ``window_start_us``; at most ``2 * memory.SERIES_BUCKETS`` points,
    each bucket's lowest and highest, so the peak is always among them."""
    series_bytes: list[int]
    """"Total Allocated" at those times."""

    @property
    def kind(self) -> str:
        """The device type ("cpu", "cuda" ...), what ranks are compared by."""
        return self.device.split(":")[0]


@dataclass
class RankResult:
    """Everything measured on one rank."""

    rank: int
    path: str
    device: str  # "gpu" when the trace holds GPU events, else "cpu"
    backend: str | None
    world_size: int | None
    host: str | None
    n_events: int
    steps: list[StepResult]
    gpu_total: GpuBreakdown | None
    """HTA-compatible aggregate: all GPU events, or those launched before the last step when >1 step."""
    kernel_categories_us: dict[str, float]
    kernel_categories_count: dict[str, int]
    top_kernels: list[KernelStat]
    collectives: list[Collective]
    base_time_ns: int = 0
    """The trace's ``baseTimeNanoseconds`` (newer Kineto): its timestamps count from there."""
    comm_by_kind: list[CommKindStat] = field(default_factory=list)
    """Communication per collective kind, per step (see :mod:`hf_distprof.analysis.comm`)."""
    memory: list[DeviceMemory] = field(default_factory=list)
    """Memory per device, from ``[memory]`` events (``profile_memory``); empty without them."""
    timeline: RankTimeline | None = None
    """The what-if model's points (:mod:`hf_distprof.analysis.whatif_timeline`); not in ``to_dict``."""

    @property
    def mean_step_us(self) -> float:
        """Mean CPU wall time of the profiled steps."""
        return sum(s.duration_us for s in self.steps) / len(self.steps)

    @property
    def exposed_comm_pct(self) -> float:
        """Exposed communication as % of step time: GPU un-overlapped comm, or CPU time waiting on it."""
        if self.device == "gpu":
            return _mean([s.gpu.exposed_comm_pct for s in self.steps if s.gpu is not None])
        return _mean([s.cpu.pct(s.cpu.communication_us) for s in self.steps])

    @property
    def busy_us(self) -> float:
        """Mean per-step work (:meth:`StepResult.busy_us`)."""
        if self.device == "gpu":
            return _mean([s.busy_us("gpu") for s in self.steps if s.gpu is not None])
        return _mean([s.busy_us("cpu") for s in self.steps])

    @property
    def comm_wait_us(self) -> float:
        """Mean per-step communication the rank pays for (exposed on GPU, waited on CPU)."""
        if self.device == "gpu":
            return _mean([s.gpu.exposed_comm_us for s in self.steps if s.gpu is not None])
        return _mean([s.cpu.communication_us for s in self.steps])


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


@dataclass
class Finding:
    """One diagnosis, with the measured numbers that triggered it and what to do."""

    kind: str
    severity: float  # rough % of step time at stake; findings are sorted by it
    title: str
    ranks: list[int]
    evidence: str
    recommendation: str
    numbers: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None
    """How sure: 1 - p of the arrival-order test for rank findings, the share of steps above the threshold
    for per-step shares (:mod:`hf_distprof.core.verdicts`)."""


@dataclass
class FileError:
    """A file that could not be analysed."""

    path: str
    reason: str


@dataclass
class AnalysisResult:
    """The result of ``analyze_paths``: per-rank results, the cross-rank view, findings, bad files."""

    ranks: list[RankResult]
    cross_rank: CrossRankResult | None
    findings: list[Finding]
    errors: list[FileError]
    options: AnalysisOptions
    comm_by_kind: list[CommKindStat] = field(default_factory=list)
    """Communication per collective kind, per step, mean over the ranks."""
    comm_by_module: list[ModuleCommStat] = field(default_factory=list)
    """FSDP's collectives per unit, kind and phase, per step, mean over the ranks (empty without FSDP)."""
    undecided: list[str] = field(default_factory=list)
    """Questions the trace is too short to answer ("not enough evidence"), never findings."""
    profiler_slowdown: dict[str, Any] | None = None
    """Steps inside the trace against the run's other steps, from ``timing_rank*.jsonl`` beside the traces
    (:func:`hf_distprof.core.overhead.profiler_slowdown`); None without them."""
    bandwidth: list[BandwidthStat] = field(default_factory=list)
    """Collective bandwidth per kind, group size and message size (empty when no collective has a size)."""
    unsized_collectives: int = 0
    """Collectives (counted on every rank) without a size: without ``record_param_comms`` sizes (newer
    PyTorch with NCCL) they need recorded shapes, read on NCCL traces with ``message_sizes="shapes"``."""
    bandwidth_reference: list[BandwidthVsReference] = field(default_factory=list)
    """``bandwidth`` rows against ``analyze --bandwidth-ref``'s CSV (empty without it)."""
    bandwidth_reference_file: str | None = None
    """That CSV; None without ``--bandwidth-ref``."""
    run: RunSummary | None = None
    """The run manifest beside the traces (hosts, each window and why it was taken, files it lists that are
    missing); None without one."""
    what_if: list[WhatIfScenario] = field(default_factory=list)
    """What one fix would save, the steps replayed across ranks, largest saving first
    (:mod:`hf_distprof.analysis.whatif`)."""
    critical_path: list[CriticalSegment] = field(default_factory=list)
    """The chain of work and transfers that sets the median traced step's time."""
    what_if_model: WhatIfModel | None = None
    """The replay behind them: its residual (the error bar), the median step and its lanes; None without one."""

    @property
    def exposed_comm_pct(self) -> float:
        """Headline: exposed communication as % of step time, mean over ranks."""
        return _mean([r.exposed_comm_pct for r in self.ranks])

    @property
    def imbalance_pct(self) -> float:
        """Headline: load imbalance across ranks in % (0 with a single rank)."""
        return self.cross_rank.imbalance_pct if self.cross_rank is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with the headline numbers and per-rank derived values included."""
        out = _asdict(self)
        out["exposed_comm_pct"] = self.exposed_comm_pct
        out["imbalance_pct"] = self.imbalance_pct
        for rank_out, rank in zip(out["ranks"], self.ranks):
            rank_out["mean_step_us"] = rank.mean_step_us
            rank_out["exposed_comm_pct"] = rank.exposed_comm_pct
            rank_out["busy_us"] = rank.busy_us
            rank_out.pop("collectives")  # matched in cross_rank; too long to be useful in the output
            rank_out.pop("timeline")  # the what-if model's input; its answer is what_if and critical_path
            if not rank.memory:
                rank_out.pop("memory")  # only traces recorded with profile_memory have the key
            _add_hidden_pct(rank_out["comm_by_kind"], rank.comm_by_kind)
        _add_hidden_pct(out["comm_by_kind"], self.comm_by_kind)
        for row_out, row in zip(out["bandwidth"], self.bandwidth):
            row_out["wait_pct"] = row.wait_pct
        return out

    def to_json(self) -> bytes:
        """The result as indented JSON bytes."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _asdict(obj: Any) -> Any:
    """``dataclasses.asdict(obj)``, the same dict, without copying each rank's collectives and timeline
    (``to_dict`` drops them: an empty list stands in) and without deep-copying numbers and strings (asdict's cost
    is nearly all in those two)."""
    kind = type(obj)
    if kind in _ATOMS:
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        skip = kind is RankResult
        return {
            f.name: [] if skip and f.name in ("collectives", "timeline") else _asdict(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
        }
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple, rebuilt field by field as asdict does
        return kind(*[_asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return kind(_asdict(v) for v in obj)
    if isinstance(obj, dict):
        return kind((_asdict(k), _asdict(v)) for k, v in obj.items())
    return copy.deepcopy(obj)


def _add_hidden_pct(rows_out: list[dict[str, Any]], rows: list[CommKindStat]) -> None:
    for row_out, row in zip(rows_out, rows):
        row_out["hidden_pct"] = row.overlap_pct


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
