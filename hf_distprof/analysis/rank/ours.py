"""hf_distprof's own collectives in a trace (pure): which collectives hf_distprof issued itself, not the user.

Its capture agreements (``--profile-on-demand``, ``--profile-on-anomaly``), the step timer's and the memory logger's
gathers of their figures, the run manifest's collectives at train start and end: each is issued inside a
``hf_distprof/ours <what>`` range on the training thread (:func:`hf_distprof.dist.ours`, a ``user_annotation``). A
collective is ours when it was issued inside one: on CPU (gloo), its ``c10d::*`` op started inside one (its
``gloo:*`` span on a worker thread is found by pairing, :func:`gloo_ours`); on GPU, its NCCL kernel was launched
inside one. :mod:`hf_distprof.analysis.rank.analyze` leaves them out of the user's collectives and communication.
"""

from __future__ import annotations

from bisect import bisect_right

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.cpu import OURS_PREFIX, main_thread_ranges
from hf_distprof.analysis.rank.kernels import (
    COMMUNICATION,
    GLOO_RUNS_AS,
    NO_GLOO_SPAN,
    c10d_kind,
    gloo_kind,
    kernel_category,
)
from hf_distprof.analysis.read.events import ParsedTrace, Span


def own_ranges(trace: ParsedTrace) -> list[iv.Interval]:
    """hf_distprof's own ranges on the training thread (``hf_distprof/ours ...``), merged."""
    return iv.merge((s, e) for s, e, _ in main_thread_ranges(trace, OURS_PREFIX))


def inside(ranges: list[iv.Interval], starts: list[float], t: float) -> bool:
    """Whether ``t`` lies in one of the disjoint sorted ``ranges`` (``starts`` are theirs)."""
    i = bisect_right(starts, t) - 1
    return i >= 0 and t <= ranges[i][1]


def gloo_ours(trace: ParsedTrace, own: list[iv.Interval]) -> tuple[dict[Span, Span | None], set[Span]]:
    """The gloo spans (each with its op, or None) and the ``c10d::*`` ops of hf_distprof's own collectives: the ops
    that start inside one of its ``own`` ranges, and the spans they enqueued.

    An op is paired with its span over the whole trace, not step by step: an async gather of ours issued at the end of
    a step can start on its gloo worker in the next. Gloo starts a group's collectives in the order they were
    enqueued, so the spans of each gloo name take, in order, the earliest op of that name not yet paired that started
    before them; a span with no such op (its op was enqueued before the trace began) is ours when it starts inside one
    of ``own``.
    """
    own_starts = [s for s, _ in own]
    ours_ops: set[Span] = set()
    ops_by_name: dict[str, list[Span]] = {}
    for op in trace.c10d_ops:
        kind = c10d_kind(op[2])
        if kind in NO_GLOO_SPAN:
            continue
        ops_by_name.setdefault(GLOO_RUNS_AS.get(kind, kind), []).append(op)
        if inside(own, own_starts, op[0]):
            ours_ops.add(op)
    ours_spans: dict[Span, Span | None] = {}
    next_op: dict[str, int] = {}
    for span in trace.comm_spans:  # sorted by start
        name = gloo_kind(span[2])
        ops = ops_by_name.get(name, [])
        j = next_op.get(name, 0)
        if j < len(ops) and ops[j][0] <= span[0]:
            next_op[name] = j + 1
            if ops[j] in ours_ops:
                ours_spans[span] = ops[j]
        elif inside(own, own_starts, span[0]):
            ours_spans[span] = None
    return ours_spans, ours_ops


def own_kernels(
    trace: ParsedTrace, step_events: list[list[int]], own: list[iv.Interval]
) -> tuple[list[list[int]], list[list[int]]]:
    """Each step's GPU events less the communication kernels launched inside one of hf_distprof's ``own`` ranges,
    and those kernels apart."""
    gpu, launches = trace.gpu, trace.launches
    starts = [s for s, _ in own]
    kept: list[list[int]] = []
    mine: list[list[int]] = []
    for indices in step_events:
        flags = [kernel_category(gpu.name[i]) == COMMUNICATION
                 and inside(own, starts, launches.get(gpu.correlation[i], gpu.start[i])) for i in indices]
        kept.append([i for i, m in zip(indices, flags) if not m])
        mine.append([i for i, m in zip(indices, flags) if m])
    return kept, mine
