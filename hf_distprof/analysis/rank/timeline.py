"""One rank's timeline for the what-if model (pure; runs in the parsing worker, where the events are).

The model (:mod:`hf_distprof.analysis.whatif.model`) replays the traced steps as a graph of *points* on each rank,
each reached from an earlier point of the same rank after some local work, and some also gated by the
completion of a collective (which needs every rank's arrival). This module turns one parsed trace into those
points; the replay, the scenarios and the critical path are computed across ranks from them.

Every point's time is ``max(time of its predecessor + work, completion of its collective + wake)``. Replaying
the measured works gives back the measured times up to the ranks' clock skew; a scenario changes the works
(or the transfers) and replays.

**CPU (gloo) traces: two lanes per rank.** The training thread (*main lane*) runs from step start to step
end through the points where it issues a collective (its ``c10d::*`` op) and where it stops waiting for one
(the end of a wait: a gap, or FSDP's wait-op self time, with a collective in flight, that ends after one of
this rank's collectives ends: it is bound to the last one to end in it; or the first such gap to end up to
:data:`RESUME_SLACK_US` before the span of a collective in flight all along ends, since gloo's worker wakes the
waiting thread before it records the end; or the return of a synchronous ``c10d::`` op, which blocks until its
collective completes, from the arrival on). Between them is local work. A gloo
span starts (the rank *arrives*) a little after its issue, or, when the gloo worker was still busy with an
earlier collective (issued before that one ended, started after), right after that one completes.

**GPU traces: one chain per rank**: the step's start and end (CPU) and each NCCL kernel's start (arrival) and
end, in time order. A kernel ends when its collective completes, and no earlier than its start plus the
computation that ran beside it (its hidden part), which a faster peer cannot remove.

Each local piece of work carries its data-loading time (``enumerate(DataLoader)`` on the training thread; on
GPU only while the GPU is idle) and its phases (the step timer's ``hf_distprof/<phase>`` ranges when the trace
has them, else data loading / backward / compute / other on CPU, busy / idle on GPU), for the critical path.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.cpu import OURS_PREFIX, PHASE_PREFIX, MainThreadSplit, main_thread_ranges
from hf_distprof.analysis.read.events import ParsedTrace, Span
from hf_distprof.analysis.results.rank import Collective, CollectiveKey, RankTimeline

# Point kinds, in the order they sort at equal times (a wait ends before the next op issues a collective).
START, RELEASE, ISSUE, ARRIVE, END = range(5)
KIND_NAMES = ("start", "release", "issue", "arrive", "end")


DATA_LOADING = "data_loading"
RESUME_SLACK_US = 500.0
"""How long before a gloo span's recorded end the waiting thread may resume (measured: 0.1-0.2 ms on 2 busy cores)."""
# What a step timer's phase range is called on the critical path.
_PHASE_NAMES = {"data": "data", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}




@dataclass
class _Point:
    kind: int
    step: int
    t: float
    key: CollectiveKey | None = None
    dep: CollectiveKey | None = None
    wake: float = 0.0
    work_end: float | None = None  # where local work stops (a wait's start); None: at t
    end: float = 0.0
    main: bool = True
    pred_point: _Point | None = None  # set for arrivals: their issue (or None: the latest main point before)
    hidden: float = 0.0  # GPU kernel end: computation beside the kernel since its start
    issue_t: float | None = None
    index: int = -1


def rank_timeline(
    trace: ParsedTrace,
    collectives: list[Collective],
    splits: list[MainThreadSplit],
    gpu_busy: list[iv.Interval] | None = None,
    phase_ranges: list[Span] | None = None,
) -> RankTimeline:
    """The what-if points of one rank.

    Args:
        trace: The parsed trace.
        collectives: Its collectives, ``exposed_us`` set (:func:`hf_distprof.analysis.rank.analyze.analyze_rank`).
        splits: The training thread's split of each step (same order as ``trace.steps``).
        gpu_busy: GPU traces: the union of all GPU activity (sorted, disjoint); None on CPU traces.
        phase_ranges: The step timer's ``hf_distprof/<phase>`` ranges on the training thread, sorted; None:
            found here.

    Returns:
        The timeline; empty without steps.
    """
    if phase_ranges is None:
        phase_ranges = _phase_ranges(trace) if gpu_busy is None else []
    by_step: dict[int, list[Collective]] = {}
    for c in collectives:
        by_step.setdefault(c.step, []).append(c)
    on_gpu = gpu_busy is not None
    points: list[_Point] = []
    ends = sorted((c.end_us, i) for i, c in enumerate(collectives))
    end_times = [e for e, _ in ends]
    c10d_starts = [op[0] for op in trace.c10d_ops]
    for step, split in zip(trace.steps, splits):
        own = by_step.get(step.number, [])
        points.append(_Point(START, step.number, step.start))
        points.append(_Point(END, step.number, step.end))
        if on_gpu:
            points += _gpu_points(step.number, own)
        else:
            points += _cpu_points(trace, step.number, step.start, step.end, own, split, collectives, ends,
                                  end_times, c10d_starts)
    points.sort(key=lambda p: (p.t, p.step, p.kind))  # at equal times a step's end comes before the next's start
    for i, p in enumerate(points):
        p.index = i
    return _columns(trace, points, splits, gpu_busy, phase_ranges)


def _phase_ranges(trace: ParsedTrace) -> list[Span]:
    """The step timer's ``hf_distprof/<phase>`` ranges on the training thread, sorted (hf_distprof's own ranges,
    ``hf_distprof/ours ...``, are not phases: their time is other)."""
    return [r for r in main_thread_ranges(trace, PHASE_PREFIX) if not r[2].startswith(OURS_PREFIX)]


def _cpu_points(
    trace: ParsedTrace,
    number: int,
    start: float,
    end: float,
    own: list[Collective],
    split: MainThreadSplit,
    collectives: list[Collective],
    ends: list[tuple[float, int]],
    end_times: list[float],
    c10d_starts: list[float],
) -> list[_Point]:
    out: list[_Point] = []
    lo, hi = bisect_left(c10d_starts, start), bisect_left(c10d_starts, end)
    ops = trace.c10d_ops[lo:hi]
    op_end = {s: e for s, e, _ in ops}
    for c in own:
        arrive = _Point(ARRIVE, c.step, c.start_us, key=(c.step, c.kind, c.index), end=c.end_us, main=False)
        if c.issued_us is not None and c.issued_us <= c.start_us:
            issue = _Point(ISSUE, c.step, c.issued_us, key=arrive.key)
            out.append(issue)
            returned = op_end.get(c.issued_us)
            # (returning after the arrival, and no further from the end than from the arrival)
            if returned is not None and c.end_us - returned <= min(RESUME_SLACK_US, returned - c.start_us):
                # A blocking op (gloo's synchronous collectives return when theirs completes, or just before its
                # span records the end): from the arrival on, the training thread waits inside it.
                out.append(_Point(RELEASE, number, returned, dep=arrive.key, wake=returned - c.end_us,
                                  work_end=c.start_us))
            arrive.pred_point = issue
            arrive.issue_t = c.issued_us
            # Behind a busy worker: an earlier collective of this rank, in flight at the issue, ended just before.
            k = bisect_right(end_times, c.start_us) - 1
            if k >= 0:
                before = collectives[ends[k][1]]
                if before is not c and c.issued_us < before.end_us <= c.start_us:
                    arrive.dep = (before.step, before.kind, before.index)
                    arrive.wake = c.start_us - before.end_us
        out.append(arrive)
    # The waits: communication time on the training thread, less the c10d ops (which enqueue, or block: above).
    enqueue = iv.merge((max(s, start), min(e, end)) for s, e, _ in ops)
    woken: set[int] = set()  # the collectives a wait was bound to before their span's end
    for ws, we in iv.subtract(split.communication, enqueue):
        # Bound to the last of this rank's collectives to end within the wait (the one it waited for).
        k = bisect_right(end_times, we) - 1
        if k >= 0 and end_times[k] >= ws:
            c = collectives[ends[k][1]]
        elif k + 1 < len(ends) and ends[k + 1][1] not in woken and _woken_early(ws, we, collectives[ends[k + 1][1]]):
            c = collectives[ends[k + 1][1]]
            woken.add(ends[k + 1][1])
        else:
            continue  # nothing ended: a gap while one ran in the background, local work
        out.append(_Point(RELEASE, number, we, dep=(c.step, c.kind, c.index), wake=we - c.end_us, work_end=ws))
    return out


def _woken_early(ws: float, we: float, c: Collective) -> bool:
    """Whether the wait ``[ws, we]`` ended with ``c`` although ``c``'s span ends after it: gloo's worker wakes the
    waiting thread before it records the span's end (0.1-0.2 ms on a busy host). So it is when ``c`` was in flight for
    the whole wait and ends within :data:`RESUME_SLACK_US` of the wait's end, sooner than the wait lasted; the first
    such wait only (the caller's ``woken``): the gaps between the small ops the woken thread runs next are not waits."""
    early = c.end_us - we
    return c.start_us <= ws and 0.0 < early <= RESUME_SLACK_US and early < we - ws


def _gpu_points(number: int, own: list[Collective]) -> list[_Point]:
    out: list[_Point] = []
    for c in own:
        key = (c.step, c.kind, c.index)
        out.append(_Point(ARRIVE, c.step, c.start_us, key=key, end=c.end_us))
        out.append(_Point(RELEASE, c.step, c.end_us, dep=key, hidden=max(0.0, c.duration_us - c.exposed_us),
                          issue_t=c.start_us))
    return out


def _columns(
    trace: ParsedTrace,
    points: list[_Point],
    splits: list[MainThreadSplit],
    gpu_busy: list[iv.Interval] | None,
    phase_ranges: list[Span],
) -> RankTimeline:
    out = RankTimeline()
    step_index = {s.number: k for k, s in enumerate(trace.steps)}
    consecutive = {s.number for prev, s in zip(trace.steps, trace.steps[1:]) if s.number == prev.number + 1}
    last_main = -1
    end_of: dict[int, int] = {}
    labelled: list[int] = []  # points whose work is the training thread's (or the GPU chain's) own: by phase
    for p in points:
        pred, work_from = -1, p.t
        if p.kind == START:
            prev_end = end_of.get(p.step - 1)
            if p.step in consecutive and prev_end is not None:
                pred = prev_end
        elif p.kind == ARRIVE and not p.main:
            pred = p.pred_point.index if p.pred_point is not None else last_main
        else:
            pred = last_main
        if pred >= 0:
            work_from = points[pred].t
        work_to = p.t if p.work_end is None else p.work_end
        if p.kind == RELEASE and gpu_busy is not None:
            assert p.issue_t is not None
            work = max(0.0, p.issue_t + p.hidden - work_from)  # the computation beside the kernel
            out.phases.append((("gpu_busy", work),) if work > 0 else ())
        elif p.kind == ARRIVE and not p.main:
            # The worker picking it up (not the training thread's work); behind a busy worker, gated by the earlier
            # collective alone.
            work = 0.0 if p.dep is not None or pred < 0 else max(0.0, work_to - work_from)
            out.phases.append(())
        else:
            work = max(0.0, work_to - work_from)
            out.phases.append(())
            if work > 0:
                labelled.append(p.index)
        out.kind.append(p.kind)
        out.step.append(p.step)
        out.t.append(p.t)
        out.key.append(p.key)
        out.pred.append(pred)
        out.work.append(work)
        out.dep.append(p.dep)
        out.wake.append(p.wake)
        out.loading.append(0.0)
        out.end.append(p.end)
        out.main.append(p.main)
        if p.main:
            last_main = p.index
        if p.kind == END and p.step in step_index:
            end_of[p.step] = p.index
    if labelled:
        _label(out, labelled, splits, phase_ranges, gpu_busy)
    return out


def _label(
    out: RankTimeline,
    indices: list[int],
    splits: list[MainThreadSplit],
    phase_ranges: list[Span],
    gpu_busy: list[iv.Interval] | None,
) -> None:
    """Fill ``phases`` and ``loading`` of the points at ``indices``: how much of each one's work (from its
    predecessor's time on) each label covers, for every point at once (prefix sums over each label's intervals)."""
    import numpy as np  # in the worker only (see hf_distprof.analysis.rank.analyze.analyze_rank)

    a = np.array([out.t[out.pred[i]] if out.pred[i] >= 0 else out.t[i] for i in indices], dtype=np.float64)
    b = a + np.array([out.work[i] for i in indices], dtype=np.float64)
    labels = _labels(splits, phase_ranges, gpu_busy)
    covered = {name: _cover(spans, a, b) for name, spans in labels}
    # Each piece of work lists its phases in the order they began in it (forward before backward), not by layer.
    begins = [_first(spans, a).tolist() for _, spans in labels]
    other = "other" if gpu_busy is None else "gpu_idle"
    loading = covered.get(DATA_LOADING)
    rows = [[(name, float(x)) for x in col.tolist()] for name, col in covered.items()]
    for k, i in enumerate(indices):
        order = sorted(range(len(rows)), key=lambda n: begins[n][k])
        pieces = [rows[n][k] for n in order if rows[n][k][1] > 0]
        rest = out.work[i] - sum(us for _, us in pieces)
        if rest > 1e-9 * max(1.0, out.work[i]):
            pieces.append((other, rest))
        out.phases[i] = tuple(pieces)
        if loading is not None:
            out.loading[i] = min(float(loading[k]), out.work[i])


def _cover(spans: list[iv.Interval], a: Any, b: Any) -> Any:
    """For each ``[a_k, b_k]``, its length under the disjoint sorted ``spans`` (numpy arrays in, array out)."""
    import numpy as np

    if not spans:
        return np.zeros(len(a))
    starts = np.array([s for s, _ in spans], dtype=np.float64)
    ends = np.array([e for _, e in spans], dtype=np.float64)
    before = np.concatenate(([0.0], np.cumsum(ends - starts)))

    def upto(t: np.ndarray) -> np.ndarray:  # covered length before t
        k = np.searchsorted(starts, t, side="right")
        return before[k] - np.where(k > 0, np.maximum(ends[np.maximum(k - 1, 0)] - t, 0.0), 0.0)

    return upto(b) - upto(a)


def _first(spans: list[iv.Interval], a: Any) -> Any:
    """For each ``a_k``, the first moment at or after it that the disjoint sorted ``spans`` cover (inf: none)."""
    import numpy as np

    if not spans:
        return np.full(len(a), np.inf)
    starts = np.array([s for s, _ in spans], dtype=np.float64)
    ends = np.array([e for _, e in spans], dtype=np.float64)
    k = np.searchsorted(ends, a, side="right")  # the first span that ends after a_k
    inside = k < len(spans)
    at = np.where(inside, np.maximum(a, starts[np.minimum(k, len(spans) - 1)]), np.inf)
    return at


def _labels(
    splits: list[MainThreadSplit], phase_ranges: list[Span], gpu_busy: list[iv.Interval] | None
) -> list[tuple[str, list[iv.Interval]]]:
    """Disjoint sorted intervals per label; what none covers is "other" (CPU) or "gpu_idle" (GPU).

    Layers in order of precedence: on GPU, busy then data loading (while idle); on CPU, data loading, then the
    step timer's phases when the trace has them, else backward then compute (what the split counts as such).
    """
    loading = [w for split in splits for w in split.loading]  # each step's are disjoint, and steps do not overlap
    layers: list[tuple[str, list[iv.Interval]]]
    if gpu_busy is not None:
        layers = [("gpu_busy", gpu_busy), (DATA_LOADING, loading)]
    elif phase_ranges:
        by_name: dict[str, list[iv.Interval]] = {}
        for s, e, name in phase_ranges:
            phase = name[len(PHASE_PREFIX):]
            by_name.setdefault(_PHASE_NAMES.get(phase, phase), []).append((s, e))
        layers = [(DATA_LOADING, loading), *((name, iv.merge(spans)) for name, spans in by_name.items())]
    else:
        layers = [
            (DATA_LOADING, loading),
            ("backward", [w for split in splits for w in split.backward]),
            ("compute", [w for split in splits for w in split.compute]),
        ]
    taken: list[iv.Interval] = []
    out: list[tuple[str, list[iv.Interval]]] = []
    for k, (name, spans) in enumerate(layers):
        out.append((name, _less(spans, taken)))  # each layer fills what earlier ones leave
        if k + 1 < len(layers):
            taken = iv.merge(taken + spans) if taken else list(spans)
    return out


def _less(spans: list[iv.Interval], taken: list[iv.Interval]) -> list[iv.Interval]:
    """``spans`` less ``taken`` (both sorted, disjoint), looking up only the part of ``taken`` each one meets: a
    few data-loading spans against every GPU kernel cost their own length, not the trace's."""
    if not taken:
        return spans
    return [piece for s, e in spans for piece in iv.subtract([(s, e)], iv.clip(taken, s, e))]


def combine(a: RankTimeline | None, b: RankTimeline | None) -> RankTimeline | None:
    """Two windows of one rank as one timeline (the second's indices shifted; its first start stays measured)."""
    if a is None or b is None:
        return a or b
    out = RankTimeline()
    shift = len(a)
    for name in ("kind", "step", "t", "key", "work", "dep", "wake", "loading", "phases", "end", "main"):
        setattr(out, name, getattr(a, name) + getattr(b, name))
    out.pred = a.pred + [p + shift if p >= 0 else -1 for p in b.pred]
    return out
