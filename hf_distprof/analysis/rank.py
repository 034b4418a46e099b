"""Per-rank analyzer (pure): a parsed trace -> per-step CPU and GPU breakdowns, kernels, collectives."""

from __future__ import annotations

from bisect import bisect_right

from hf_distprof.analysis import intervals as iv
from hf_distprof.analysis.cpu import cpu_breakdown
from hf_distprof.analysis.events import ParsedTrace, Step
from hf_distprof.analysis.gpu import gpu_breakdown, kernel_stats
from hf_distprof.analysis.kernels import COMMUNICATION, c10d_kind, gloo_kind, kernel_category, nccl_kind
from hf_distprof.analysis.model import AnalysisOptions, Collective, RankResult, StepResult


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


def _collectives(trace: ParsedTrace, gpu_steps: list[list[int]]) -> list[Collective]:
    """Each collective's own time span, keyed by (step, kind, k-th of that kind in the step)."""
    out: list[Collective] = []
    if len(trace.gpu):
        gpu = trace.gpu
        for step, indices in zip(trace.steps, gpu_steps):
            comm = sorted(
                (gpu.start[i], gpu.end[i], nccl_kind(gpu.name[i]))
                for i in indices
                if kernel_category(gpu.name[i]) == COMMUNICATION
            )
            out.extend(_numbered(step.number, comm))
        return out
    starts = [s.start for s in trace.steps]
    spans_per_step: list[list[tuple[float, float, str]]] = [[] for _ in trace.steps]
    for s, e, name in trace.comm_spans:
        spans_per_step[_step_index(starts, s)].append((s, e, gloo_kind(name)))
    ops_per_step: list[list[str]] = [[] for _ in trace.steps]
    for s, _, name in trace.c10d_ops:
        kind = c10d_kind(name)
        if kind not in ("", "barrier", "wait", "monitored_barrier"):
            ops_per_step[_step_index(starts, s)].append(kind)
    for step, spans, kinds in zip(trace.steps, spans_per_step, ops_per_step):
        # The c10d op names the collective better (a reduce-scatter runs as gloo:all_reduce); use its
        # kinds when the counts line up one to one.
        if len(kinds) == len(spans):
            spans = [(s, e, k) for (s, e, _), k in zip(spans, kinds)]
        out.extend(_numbered(step.number, spans))
    return out


def _numbered(step: int, spans: list[tuple[float, float, str]]) -> list[Collective]:
    seen: dict[str, int] = {}
    out = []
    for s, e, kind in spans:
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        out.append(Collective(step=step, kind=kind, index=k, start_us=s, end_us=e))
    return out


def analyze_rank(trace: ParsedTrace, options: AnalysisOptions) -> RankResult:
    """Analyse one rank's parsed trace.

    Args:
        trace: The parsed trace.
        options: Thresholds (only ``tiny_kernel_us`` and ``top_kernels`` matter here).

    Returns:
        Per-step breakdowns, the HTA-compatible GPU aggregate, kernel stats and the collectives.
    """
    gpu = trace.gpu
    gpu_steps = assign_gpu_events_to_steps(trace)
    collectives = _collectives(trace, gpu_steps)
    if len(gpu):
        in_flight = iv.merge((c.start_us, c.end_us) for c in collectives)
    else:
        in_flight = iv.merge((s, e) for s, e, _ in trace.comm_spans)
    op_starts = [op[0] for op in trace.main_ops]
    steps = []
    for step, indices in zip(trace.steps, gpu_steps):
        steps.append(_step_result(trace, step, indices, in_flight, collectives, options, op_starts))
    selected = hta_selection(trace)
    starts = [gpu.start[i] for i in selected]
    ends = [gpu.end[i] for i in selected]
    names = [gpu.name[i] for i in selected]
    cat_us, cat_n, top = kernel_stats(gpu.start, gpu.end, gpu.name, options.top_kernels)
    return RankResult(
        rank=trace.rank,
        path=trace.path,
        device="gpu" if len(gpu) else "cpu",
        backend=trace.backend,
        world_size=trace.world_size,
        host=trace.host,
        n_events=trace.n_events,
        steps=steps,
        gpu_total=gpu_breakdown(starts, ends, names, options.tiny_kernel_us),
        kernel_categories_us=cat_us,
        kernel_categories_count=cat_n,
        top_kernels=top,
        collectives=collectives,
        base_time_ns=trace.base_time_ns,
    )


def _step_result(
    trace: ParsedTrace,
    step: Step,
    indices: list[int],
    in_flight: list[iv.Interval],
    collectives: list[Collective],
    options: AnalysisOptions,
    op_starts: list[float],
) -> StepResult:
    gpu = trace.gpu
    breakdown = gpu_breakdown(
        [gpu.start[i] for i in indices],
        [gpu.end[i] for i in indices],
        [gpu.name[i] for i in indices],
        options.tiny_kernel_us,
    )
    return StepResult(
        step=step.number,
        start_us=step.start,
        duration_us=step.duration,
        cpu=cpu_breakdown(trace.main_ops, in_flight, step.start, step.end, op_starts),
        gpu=breakdown,
        n_collectives=sum(1 for c in collectives if c.step == step.number),
    )
