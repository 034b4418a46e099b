"""Per-rank analyzer (pure): a parsed trace -> per-step CPU and GPU breakdowns, kernels, collectives.

hf_distprof's own collectives (:mod:`hf_distprof.analysis.rank.ours`) are left out of the rank's collectives, their
time in flight out of the training thread's communication, their kernels out of the steps' GPU breakdowns and the
what-if's GPU busy time, and the training thread's time in hf_distprof's ranges counts as other; each step lists them
apart (:attr:`~hf_distprof.analysis.results.rank.StepResult.own_collectives`)."""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank import exposure
from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.cpu import MainThreadSplit, breakdown_of, split_main_thread, without_ours
from hf_distprof.analysis.rank.device import gpu_events
from hf_distprof.analysis.rank.kernels import (
    COMMUNICATION,
    GLOO_RUNS_AS,
    MAIN_KINDS,
    NO_GLOO_SPAN,
    c10d_kind,
    gloo_kind,
    kernel_category,
    nccl_kind,
    nccl_op_kind,
)
from hf_distprof.analysis.rank.memory import analyze_memory
from hf_distprof.analysis.rank.ours import gloo_ours, own_ranges
from hf_distprof.analysis.rank.timeline import rank_timeline
from hf_distprof.analysis.read.events import RECORD_PARAM_COMMS, ParsedTrace, Span
from hf_distprof.analysis.read.message_sizes import MessageSize, message_bytes
from hf_distprof.analysis.results.rank import Collective, RankResult, StepResult

# NCCL runs these as SendRecv kernels: the nccl:* annotation around the launch names the collective.
_SEND_RECV_KINDS = ("all_to_all", "send", "recv", "gather", "scatter")
# (start, end, kind, issued, size) of one collective, before it is numbered.
_Run = tuple[float, float, str, float | None, MessageSize | None]


def _step_index(starts: list[float], t: float) -> int:
    """Index of the step that contains (or last started before) time ``t``; the first step if none."""
    return max(0, bisect_right(starts, t) - 1)


def _collectives(trace: ParsedTrace, own: list[iv.Interval]) -> tuple[list[Collective], list[Collective]]:
    """A CPU trace's collectives, each keyed by (step, kind, k-th of that kind in the step): the user's, and apart
    hf_distprof's own (:func:`~hf_distprof.analysis.rank.ours.gloo_ours`), numbered apart, so that the user's keys
    match across ranks and their ops and spans pair within each step whatever ours do."""
    ours_spans, ours_ops = gloo_ours(trace, own) if own else ({}, set())
    starts = [s.start for s in trace.steps]
    sizes = trace.message_sizes
    spans_per_step: list[list[tuple[float, float, str, MessageSize | None]]] = [[] for _ in trace.steps]
    own_per_step: list[list[_Run]] = [[] for _ in trace.steps]
    for span in trace.comm_spans:
        s, e, name = span
        if span in ours_spans:
            op = ours_spans[span]
            kind, issued = (gloo_kind(name), None) if op is None else (c10d_kind(op[2]), op[0])
            size = sizes.get(span) or (sizes.get(op) if op is not None else None)
            own_per_step[_step_index(starts, s)].append((s, e, kind, issued, size))
        else:
            spans_per_step[_step_index(starts, s)].append((s, e, gloo_kind(name), sizes.get(span)))
    ops_per_step: list[list[tuple[float, str, MessageSize | None]]] = [[] for _ in trace.steps]
    for span in trace.c10d_ops:
        kind = c10d_kind(span[2])
        if kind not in NO_GLOO_SPAN and span not in ours_ops:
            ops_per_step[_step_index(starts, span[0])].append((span[0], kind, sizes.get(span)))
    out: list[Collective] = []
    ours: list[Collective] = []
    for k, step in enumerate(trace.steps):
        out.extend(_numbered(step.number, _name_gloo_spans(spans_per_step[k], ops_per_step[k]), trace.world_size))
        ours.extend(_numbered(step.number, own_per_step[k], trace.world_size))
    return out, ours


def _name_gloo_spans(
    spans: list[tuple[float, float, str, MessageSize | None]], ops: list[tuple[float, str, MessageSize | None]]
) -> list[_Run]:
    """(start, end, kind, issued, size) of one step's gloo spans, named by the c10d ops that enqueued them.

    The c10d op names the collective better (a reduce-scatter runs as ``gloo:all_reduce``). The ops of
    each gloo span name are matched to those spans in order, when their counts agree; otherwise the spans
    keep the gloo name and no issue time. The size is the span's own recorded input, else its op's.
    """
    spans_by_name: dict[str, list[tuple[float, float, MessageSize | None]]] = {}
    for s, e, name, size in spans:
        spans_by_name.setdefault(name, []).append((s, e, size))
    ops_by_name: dict[str, list[tuple[float, str, MessageSize | None]]] = {}
    for t, kind, size in ops:
        ops_by_name.setdefault(GLOO_RUNS_AS.get(kind, kind), []).append((t, kind, size))
    named: list[_Run] = []
    for name, same in spans_by_name.items():
        issued = ops_by_name.get(name, [])
        if len(issued) == len(same):
            named += [(s, e, kind, t, size or op_size) for (s, e, size), (t, kind, op_size) in zip(same, issued)]
        else:
            named += [(s, e, name, None, size) for s, e, size in same]
    named.sort(key=lambda x: (x[0], x[1], x[2]))
    return named


def _gpu_collectives(trace: ParsedTrace, gpu_steps: list[list[int]]) -> list[Collective]:
    """NCCL kernels as collectives, issued at their launch and named by their kernel or nccl:* op."""
    gpu = trace.gpu
    launches = trace.launches
    ops = exposure.SpanIndex(trace.nccl_ops) if trace.nccl_ops else None
    sizes = trace.message_sizes
    recorded = sorted(span for span in sizes if span[2] == RECORD_PARAM_COMMS)
    params = exposure.SpanIndex(recorded) if recorded else None
    out: list[Collective] = []
    for step, indices in zip(trace.steps, gpu_steps):
        spans: list[_Run] = []
        for i in indices:
            name = gpu.name[i]
            if kernel_category(name) != COMMUNICATION:
                continue
            issued = launches.get(gpu.correlation[i])
            kind = nccl_kind(name)
            around = ops.containing(issued) if ops is not None and issued is not None else []
            if around and kind not in MAIN_KINDS:
                # A SendRecv (or newer generic) kernel: the innermost nccl:* op of a matching kind names it.
                for _, _, op in reversed(around):
                    op_kind = nccl_op_kind(op)
                    if kind != "send_recv" or op_kind in _SEND_RECV_KINDS:
                        kind = op_kind or kind
                        break
            spans.append((gpu.start[i], gpu.end[i], kind, issued, _launch_size(sizes, params, around, issued)))
        spans.sort(key=lambda x: (x[0], x[1], x[2]))
        out.extend(_numbered(step.number, spans, trace.world_size))
    return out


def _launch_size(
    sizes: dict[Span, MessageSize], params: exposure.SpanIndex | None, around: list[Span], issued: float | None
) -> MessageSize | None:
    """The size recorded around a kernel's launch: by the innermost ``record_param_comms`` that states one
    (newer PyTorch), else by the innermost ``nccl:*`` annotation with recorded shapes."""
    if issued is None:
        return None
    inner = params.containing(issued) if params is not None else []
    if inner:
        return sizes[inner[-1]]
    for span in reversed(around):
        size = sizes.get(span)
        if size is not None:
            return size
    return None


def _numbered(step: int, spans: list[_Run], world_size: int | None) -> list[Collective]:
    seen: dict[str, int] = {}
    out = []
    for s, e, kind, issued, size in spans:
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        group = (size.group_size if size is not None else None) or world_size
        out.append(
            Collective(
                step=step,
                kind=kind,
                index=k,
                start_us=s,
                end_us=e,
                issued_us=issued,
                bytes=message_bytes(kind, size.in_bytes, size.out_bytes, group) if size is not None else None,
                group_size=group,
            )
        )
    return out


def analyze_rank(trace: ParsedTrace, options: AnalysisOptions) -> RankResult:
    """Analyse one rank's parsed trace.

    Args:
        trace: The parsed trace.
        options: Thresholds (only ``tiny_kernel_us`` and ``top_kernels`` matter here).

    Returns:
        Per-step breakdowns, the HTA-compatible GPU aggregate, kernel stats, the collectives, and the memory
        per device when the trace holds ``[memory]`` events.
    """
    own = own_ranges(trace)
    device = gpu_events(trace, own)  # one path for the GPU events, chosen once (None on a CPU trace)
    if device is not None:
        collectives, ours = _gpu_collectives(trace, device.comm_kernels()), _gpu_collectives(trace, device.own_steps)
        breakdowns = device.breakdowns(options.tiny_kernel_us)
    else:
        collectives, ours = _collectives(trace, own)
        breakdowns = [None] * len(trace.steps)
    # The collectives in flight (CPU: every gloo span, ours left out).
    in_flight = iv.merge((c.start_us, c.end_us) for c in collectives)
    splits = [without_ours(split, own) for split in _splits(trace, in_flight, waits_block=device is None)]
    per_step = Counter(c.step for c in collectives)
    own_per_step: dict[int, list[Collective]] = {}
    for c in ours:
        own_per_step.setdefault(c.step, []).append(c)
    steps = [
        StepResult(
            step=step.number,
            start_us=step.start,
            duration_us=step.duration,
            cpu=breakdown_of(split, step.duration),
            gpu=breakdown,
            n_collectives=per_step[step.number],
            own_collectives=own_per_step.get(step.number, []),
        )
        for step, breakdown, split in zip(trace.steps, breakdowns, splits)
    ]
    exposure.attribute(collectives, trace.fsdp_spans)
    # Each exposed moment of a step goes to one collective, so that the per-kind rows add up to the step's exposed
    # communication (CPU: the training thread waiting; GPU: communication kernels with no computation running).
    if device is not None:
        device.set_exposure(collectives)
        exposure.share_exposure(collectives, device.exposed_per_step())
        gpu_total, cat_us, cat_n, top = device.totals(options)
    else:
        waiting = iv.merge(w for split in splits for w in split.communication)
        exposure.set_exposure(collectives, waiting, hidden_when_covered=False)
        exposure.share_exposure(collectives, [(step.number, split.communication)
                                              for step, split in zip(trace.steps, splits)])
        gpu_total, cat_us, cat_n, top = None, {}, {}, []
    return RankResult(
        rank=trace.rank,
        path=trace.path,
        device="gpu" if device is not None else "cpu",
        backend=trace.backend,
        world_size=trace.world_size,
        host=trace.host,
        n_events=trace.n_events,
        steps=steps,
        gpu_total=gpu_total,
        kernel_categories_us=cat_us,
        kernel_categories_count=cat_n,
        top_kernels=top,
        collectives=collectives,
        base_time_ns=trace.base_time_ns,
        memory=analyze_memory(trace.memory, trace.steps),
        steps_after_pause=trace.steps_after_pause,
        timeline=rank_timeline(trace, collectives, splits, device.busy() if device is not None else None),
    )


def _splits(trace: ParsedTrace, in_flight: list[iv.Interval], waits_block: bool) -> list[MainThreadSplit]:
    """The main thread's split of every step (vectorised when every op and step time is an int)."""
    from hf_distprof.analysis.rank import fast  # in the worker (numpy: see hf_distprof.analysis.rank.device)

    columns = fast.MainOpColumns.of(trace) if trace.main_ops else None
    if columns is None:
        op_starts = [op[0] for op in trace.main_ops]
        return [
            split_main_thread(trace.main_ops, in_flight, step.start, step.end, op_starts, waits_block)
            for step in trace.steps
        ]
    bounds = columns.step_bounds(trace.steps)
    return [
        columns.split(bounds[2 * k], bounds[2 * k + 1], in_flight, step.start, step.end, waits_block)
        for k, step in enumerate(trace.steps)
    ]
