"""What one rank's trace yields (plain data, built in the worker processes): steps, breakdowns, kernels,
collectives, memory and the what-if timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_distprof.core.stats import mean

CollectiveKey = tuple[int, str, int]
"""A collective as matched across ranks: (step, kind, k-th of that kind in the step)."""

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
    ``data_loading``: inside ``enumerate(DataLoader)``; ``other``: idle time with no collective in flight; on GPU
    traces ``gpu_wait``: inside CUDA calls that wait for the GPU (taken out of the ops that make them).
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
    gpu_wait_us: float = 0.0
    """GPU traces: inside CUDA calls that wait for the GPU (``cudaStreamSynchronize`` in ``.item()``, a copy to the
    host ...): the host waiting, not computing; neither compute nor other. 0 on CPU traces."""

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
    own_collectives: list[Collective] = field(default_factory=list)
    """The collectives hf_distprof issued itself in this step (capture agreements, gathers of its own figures: issued
    inside a ``hf_distprof/ours ...`` range), left out of :attr:`n_collectives`, of the rank's collectives and of its
    communication; each numbered among ours of its kind. Per step, so that a rank's windows combine by their steps."""

    def busy_us(self, device: str) -> float:
        """The rank's own work in this step: compute kernels on GPU; compute plus data loading on CPU.

        Untraced gaps ("other") are left out: on a loaded host they are mostly the thread being
        descheduled, and counting them made clean runs look imbalanced.
        """
        if device == "gpu":
            return self.gpu.compute_us if self.gpu is not None else 0.0
        return self.cpu.compute_us + self.cpu.data_loading_us

@dataclass
class StepAfterPause:
    """A traced step left out of every figure because an evaluation or a checkpoint ran at its start: the Trainer runs
    them after a step ends, where the profiler has already opened the next step, and each rank then waits in that
    step's first collective for the slowest to finish it (a wait that is the pause's, not the training's: the step
    timer leaves the same step out, ``after_pause``)."""

    step: int
    pause_us: float
    """This rank's time in the evaluation or checkpoint."""
    rest_us: float
    """The step's time after it, its first collective's wait for the slowest rank included."""
    kept: bool = False
    """Kept in :attr:`RankResult.steps` all the same (from where the pause ended): every step of its window held a
    pause, and a window of no step says nothing."""
    what: str = ""
    """What ran in the pause, as the profiler callback marked it: ``evaluation``, ``checkpoint``, ``evaluation and
    checkpoint``; empty in traces without the marks (recorded before hf_distprof wrote them)."""


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
    :func:`hf_distprof.analysis.across.align.set_waits`); exposed time before then is waiting for a late peer. None
    when it was not matched on every rank."""
    waited_for: int | None = None
    """The rank that arrived last, when it is another rank (this one waited for it); else None."""
    late_peer_wait_us: float | None = None
    """Of its own time, the wait for the last rank to arrive: the last arrival less its own (on the aligned clocks),
    clipped to its duration; None when it was not matched on every rank. Its exposed part is
    :func:`hf_distprof.analysis.across.comm.wait_share`. Set with ``peers_in_us`` by
    :func:`hf_distprof.analysis.across.align.set_waits`."""
    done_in_us: float | None = None
    """When it completed, on this rank's clock: the first end among the ranks (nobody ends before the last has
    contributed), not before the last arrival. Its exposed time after that is its lag, not the collective
    (:func:`hf_distprof.analysis.across.comm.lag_share`; on gloo, mostly its thread waiting for a CPU). Set with
    ``peers_in_us``."""

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
    """One rank's memory on one device over the traced steps (:mod:`hf_distprof.analysis.rank.memory`)."""

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
class RankTimeline:
    """One rank's points, as columns, sorted by measured time (ties: the earlier step first, then :data:`START` ...
    :data:`END`).

    Times are the trace's own (microseconds, this rank's clock); the model aligns the ranks' clocks.
    """

    kind: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    """The step the point belongs to (a collective's point: the collective's step)."""
    t: list[float] = field(default_factory=list)
    """Measured time."""
    key: list[CollectiveKey | None] = field(default_factory=list)
    """ISSUE / ARRIVE: the collective (step, kind, k-th of that kind in the step); else None."""
    pred: list[int] = field(default_factory=list)
    """Index of the point it follows on this rank; -1: none (the first traced step's start, at its measured
    time)."""
    work: list[float] = field(default_factory=list)
    """Local work from the predecessor (us)."""
    dep: list[CollectiveKey | None] = field(default_factory=list)
    """The collective whose completion also gates the point (a wait's end, a kernel's end, an arrival behind a
    busy gloo worker); None: none."""
    wake: list[float] = field(default_factory=list)
    """Time from that completion to the point (us): waking up, starting the next collective."""
    loading: list[float] = field(default_factory=list)
    """Data loading within ``work`` (us)."""
    phases: list[tuple[tuple[str, float], ...]] = field(default_factory=list)
    """``work`` by phase: (name, us), each phase once, in the order of precedence of the labels (data loading
    first), "other" (CPU) or "gpu_idle" (GPU) last; not in time order."""
    end: list[float] = field(default_factory=list)
    """ARRIVE: the collective's measured end on this rank; else 0."""
    main: list[bool] = field(default_factory=list)
    """On the training thread's lane (CPU) or the chain (GPU); False: an arrival on the gloo worker lane."""

    def __len__(self) -> int:
        return len(self.t)

@dataclass
class PeerWait:
    """How long one rank waits, at one kind of collective, for one peer that reached it last."""

    peer: int
    kind: str
    """The per-kind table's row: ``all_gather``, ``reduce_scatter``, ``all_reduce`` or ``other``."""
    pct: float
    """% of the waiting rank's step (the per-kind table's base), mean over its steps."""


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
    """Communication per collective kind, per step (see :mod:`hf_distprof.analysis.across.comm`)."""
    memory: list[DeviceMemory] = field(default_factory=list)
    """Memory per device, from ``[memory]`` events (``profile_memory``); empty without them."""
    peer_waits: list[PeerWait] = field(default_factory=list)
    """Who this rank waits for, at which kind of collective, for how long (set across ranks, once the ranks are
    aligned: :func:`hf_distprof.analysis.across.comm.rank_waits`); empty with one rank."""
    steps_after_pause: list[StepAfterPause] = field(default_factory=list)
    """Traced steps left out of :attr:`steps` and of every figure: an evaluation or a checkpoint ran at their start."""
    timeline: RankTimeline | None = None
    """The what-if model's points (:mod:`hf_distprof.analysis.rank.timeline`); not in ``to_dict``."""

    @property
    def mean_step_us(self) -> float:
        """Mean CPU wall time of the profiled steps."""
        return sum(s.duration_us for s in self.steps) / len(self.steps)

    @property
    def exposed_comm_pct(self) -> float:
        """Exposed communication as % of step time: GPU un-overlapped comm, or CPU time waiting on it."""
        if self.device == "gpu":
            return mean([s.gpu.exposed_comm_pct for s in self.steps if s.gpu is not None])
        return mean([s.cpu.pct(s.cpu.communication_us) for s in self.steps])

    @property
    def busy_us(self) -> float:
        """Mean per-step work (:meth:`StepResult.busy_us`)."""
        if self.device == "gpu":
            return mean([s.busy_us("gpu") for s in self.steps if s.gpu is not None])
        return mean([s.busy_us("cpu") for s in self.steps])

    @property
    def comm_wait_us(self) -> float:
        """Mean per-step communication the rank pays for (exposed on GPU, waited on CPU)."""
        if self.device == "gpu":
            return mean([s.gpu.exposed_comm_us for s in self.steps if s.gpu is not None])
        return mean([s.cpu.communication_us for s in self.steps])

@dataclass
class FileError:
    """A file that could not be analysed."""

    path: str
    reason: str
