"""One trace's GPU events, through one of two whole paths chosen once per trace (pure).

:func:`gpu_events` picks the path: int64 columns (numpy, :class:`hf_distprof.analysis.rank.fast.ColumnPath`) when
every time is an int, as Kineto's microsecond timestamps are, else the reference path (:class:`ReferencePath`: pure
Python over lists, any time). Both give the very same results (the columns' contract, :mod:`~hf_distprof.analysis.
rank.fast`); :func:`~hf_distprof.analysis.rank.analyze.analyze_rank` asks the one it got, never both.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Protocol

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank import exposure
from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.gpu import gpu_breakdown, kernel_stats
from hf_distprof.analysis.rank.kernels import COMMUNICATION, COMPUTATION, kernel_category
from hf_distprof.analysis.rank.ours import own_kernels
from hf_distprof.analysis.read.events import ParsedTrace
from hf_distprof.analysis.results.rank import Collective, GpuBreakdown, KernelStat

Totals = tuple[GpuBreakdown | None, dict[str, float], dict[str, int], list[KernelStat]]
"""HTA's aggregate over the trace, then time and count per kernel category, and the top kernels per category."""


class GpuPath(Protocol):
    """What the analysis of one rank asks of its GPU events."""

    own_steps: list[list[int]]
    """Per step, the kernels of hf_distprof's own collectives (left out of everything else)."""

    def comm_kernels(self) -> list[list[int]]:
        """Per step, the events its collectives are found among (at least its communication kernels)."""

    def breakdowns(self, tiny_kernel_us: float) -> list[GpuBreakdown | None]:
        """Per step, HTA's breakdown of its events."""

    def set_exposure(self, collectives: list[Collective]) -> None:
        """Each collective's ``exposed_us``: its span less the computation kernels running beside it."""

    def exposed_per_step(self) -> list[tuple[int, list[iv.Interval]]]:
        """Per step, its communication kernels with no computation kernel of the step running."""

    def totals(self, options: AnalysisOptions) -> Totals:
        """HTA's aggregate and the kernel statistics over the trace."""

    def busy(self) -> list[iv.Interval]:
        """The union of all GPU activity but our collectives' kernels (the what-if timeline's busy and idle)."""


def _step_index(starts: list[float], t: float) -> int:
    """Index of the step that contains (or last started before) time ``t``; the first step if none."""
    return max(0, bisect_right(starts, t) - 1)


def assign_gpu_events_to_steps(trace: ParsedTrace) -> list[list[int]]:
    """Indices of the GPU events of each step.

    A GPU event belongs to the step whose CPU extent holds its launch (found by correlation id), since a
    kernel often runs after the step that launched it has ended on the CPU. Events without a launch
    record go by their own start time.
    """
    starts = [s.start for s in trace.steps]
    per_step: list[list[int]] = [[] for _ in trace.steps]
    launches = trace.launches
    gpu = trace.gpu
    for i, (start, corr) in enumerate(zip(gpu.start, gpu.correlation)):
        per_step[_step_index(starts, launches.get(corr, start))].append(i)
    return per_step


def hta_selection(trace: ParsedTrace) -> list[int]:
    """The GPU events HTA 0.5.0 analyses for this rank.

    With more than one profiler step HTA keeps only kernels whose launch (matched by correlation) starts
    before the last step, dropping the last, possibly incomplete, step; with one step it keeps them all.
    (HTA counts distinct step names over all ranks; here the rank's own steps are counted.)
    """
    gpu = trace.gpu
    if len(trace.steps) <= 1:
        return list(range(len(gpu)))
    last = trace.steps[-1].start
    launches = trace.launches
    return [i for i, corr in enumerate(gpu.correlation) if corr in launches and launches[corr] < last]


class ReferencePath:
    """The GPU events as Python lists: every step's events, any time (ints or floats)."""

    def __init__(self, trace: ParsedTrace, own: list[iv.Interval]) -> None:
        self.trace = trace
        self.per_step = assign_gpu_events_to_steps(trace)
        self.own_steps: list[list[int]] = [[] for _ in trace.steps]
        if own:
            self.per_step, self.own_steps = own_kernels(trace, self.per_step, own)

    def comm_kernels(self) -> list[list[int]]:
        return self.per_step  # every event of the step: the collectives' finder keeps the communication kernels

    def breakdowns(self, tiny_kernel_us: float) -> list[GpuBreakdown | None]:
        gpu = self.trace.gpu
        return [gpu_breakdown([gpu.start[i] for i in ix], [gpu.end[i] for i in ix], [gpu.name[i] for i in ix],
                              tiny_kernel_us) for ix in self.per_step]

    def set_exposure(self, collectives: list[Collective]) -> None:
        gpu = self.trace.gpu
        compute = iv.merge(
            (s, e) for s, e, name in zip(gpu.start, gpu.end, gpu.name) if kernel_category(name) == COMPUTATION
        )
        exposure.set_exposure(collectives, compute, hidden_when_covered=True)

    def exposed_per_step(self) -> list[tuple[int, list[iv.Interval]]]:
        gpu = self.trace.gpu
        out = []
        for step, indices in zip(self.trace.steps, self.per_step):
            cats = [(gpu.start[i], gpu.end[i], kernel_category(gpu.name[i])) for i in indices]
            comm_m = iv.merge((s, e) for s, e, cat in cats if cat == COMMUNICATION)
            comp_m = iv.merge((s, e) for s, e, cat in cats if cat == COMPUTATION)
            out.append((step.number, iv.subtract(comm_m, comp_m)))
        return out

    def totals(self, options: AnalysisOptions) -> Totals:
        gpu = self.trace.gpu
        selected = hta_selection(self.trace)
        total = gpu_breakdown([gpu.start[i] for i in selected], [gpu.end[i] for i in selected],
                              [gpu.name[i] for i in selected], options.tiny_kernel_us)
        return (total, *kernel_stats(gpu.start, gpu.end, gpu.name, options.top_kernels))

    def busy(self) -> list[iv.Interval]:
        gpu = self.trace.gpu
        left_out = {i for indices in self.own_steps for i in indices}
        if not left_out:
            return iv.merge(zip(gpu.start, gpu.end))
        return iv.merge((s, e) for i, (s, e) in enumerate(zip(gpu.start, gpu.end)) if i not in left_out)


def gpu_events(trace: ParsedTrace, own: list[iv.Interval]) -> GpuPath | None:
    """The trace's GPU events through the path that fits them; None for a trace without GPU events.

    Args:
        trace: The parsed trace.
        own: hf_distprof's own ranges on the training thread (their collectives' kernels are set apart).
    """
    if not len(trace.gpu):
        return None
    # Imported here, in the worker: numpy starts a thread at import, and the parent process of the workers must
    # have none to fork them rather than spawn them (hf_distprof.analysis.rank.workers._start_method).
    from hf_distprof.analysis.rank import fast

    columns = fast.ColumnPath.of(trace, own)
    return columns if columns is not None else ReferencePath(trace, own)
