"""The what-if replay (pure): the ranks' timelines as one graph, replayed with measured or changed works.

See :mod:`hf_distprof.analysis.whatif` for the model and the scenarios. A point's time is
``max(its predecessor's + work, its collective's completion + wake)``; a collective completes when every rank
has arrived, plus its transfer. The ranks are evaluated together, each as far as the collectives they wait for
allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

from hf_distprof.analysis.bandwidth import bus_factor
from hf_distprof.analysis.whatif_timeline import ARRIVE, END, ISSUE, START, CollectiveKey, RankTimeline

if TYPE_CHECKING:
    from hf_distprof.analysis.bandwidth_ref import ReferencePoint
    from hf_distprof.analysis.model import RankResult

LOCAL, GATED = 0, 1
"""What set a point's time in a replay: its own rank's work, or a collective's completion."""


@dataclass
class Graph:
    ranks: list[int]
    tl: list[RankTimeline]
    t0: list[list[float]]  # measured times on the first rank's clock
    work: list[list[float]]
    dep: list[list[CollectiveKey | None]]  # only matched collectives
    wake: list[list[float]]  # from the collective's completion to the point (us; may be < 0 within the skew)
    transfer: dict[CollectiveKey, float]
    steps: list[int]
    start_at: list[dict[int, int]]
    end_at: list[dict[int, int]]
    segment: list[list[tuple[Any, ...] | None]]
    bytes_of: dict[CollectiveKey, tuple[int | None, int | None]]


@dataclass
class Replay:
    value: list[list[float]]
    bound: list[list[int]]
    done: dict[CollectiveKey, float]
    last: dict[CollectiveKey, int]  # rank index arriving last


def build(ranks: list[RankResult], offsets: dict[int, float]) -> Graph | None:
    """The replay graph of the ranks' timelines; None when a rank has none or no step is common to all."""
    tls = [r.timeline for r in ranks]
    if not ranks or any(t is None or not len(t) for t in tls):
        return None
    timelines: list[RankTimeline] = [t for t in tls if t is not None]
    t0 = [[x - offsets.get(r.rank, 0.0) for x in tl.t] for r, tl in zip(ranks, timelines)]
    arrivals: dict[CollectiveKey, list[tuple[float, float]]] = {}
    for times, tl in zip(t0, timelines):
        for i, kind in enumerate(tl.kind):
            key = tl.key[i]
            if kind == ARRIVE and key is not None:
                arrivals.setdefault(key, []).append((times[i], times[i] + tl.end[i] - tl.t[i]))
    matched = {k for k, v in arrivals.items() if len(v) == len(ranks)}
    # The transfer: the collective's time on the rank that arrived last (the others waited for that one).
    transfer = {k: max(0.0, max(arrivals[k])[1] - max(arrivals[k])[0]) for k in matched}
    completed = {k: max(arrivals[k])[1] for k in matched}  # measured, on the first rank's clock
    work, dep, wake, starts, ends, segments = [], [], [], [], [], []
    for times, tl in zip(t0, timelines):
        w = list(tl.work)
        d: list[CollectiveKey | None] = list(tl.dep)
        lag = [0.0] * len(tl)
        own_end = {tl.key[i]: times[i] + tl.end[i] - tl.t[i] for i, kind in enumerate(tl.kind) if kind == ARRIVE}
        for i, k in enumerate(d):
            if k is None:
                continue
            if k not in matched or k not in own_end:  # no sync: the measured wait stays, as local time
                d[i] = None
                w[i] = tl.t[i] - tl.t[tl.pred[i]] if tl.pred[i] >= 0 else 0.0
            else:
                # A collective does not end at the same moment everywhere (gloo's last rank can finish ms before
                # the others): this rank's lag behind the completion is kept, as part of its wake.
                lag[i] = tl.wake[i] + own_end[k] - completed[k]
        work.append(w)
        dep.append(d)
        wake.append(lag)
        starts.append({tl.step[i]: i for i, k in enumerate(tl.kind) if k == START})
        ends.append({tl.step[i]: i for i, k in enumerate(tl.kind) if k == END})
        segments.append(_segments(tl, matched))
    common = set.intersection(*(set(s) & set(e) for s, e in zip(starts, ends)))
    if not common:
        return None
    sizes = {(c.step, c.kind, c.index): (c.bytes, c.group_size) for c in ranks[0].collectives}
    return Graph([r.rank for r in ranks], timelines, t0, work, dep, wake, transfer, sorted(common), starts, ends,
                  segments, sizes)


def _segments(tl: RankTimeline, matched: set[CollectiveKey]) -> list[tuple[Any, ...] | None]:
    """For each point on the main lane, the stretch of work it ends: up to the next collective this rank issues
    (CPU) or starts (GPU), or to the step's end; comparable across ranks. None off the main lane."""
    out: list[tuple[Any, ...] | None] = [None] * len(tl)
    marker: tuple[Any, ...] | None = None
    for i in range(len(tl) - 1, -1, -1):
        if not tl.main[i]:
            continue
        kind, key = tl.kind[i], tl.key[i]
        if kind == END:
            marker = (tl.step[i], "end", 0)
        elif kind in (ISSUE, ARRIVE) and key in matched:
            marker = key
        out[i] = marker
    return out


def replay(g: Graph, work: list[list[float]] | None = None, transfer: dict[CollectiveKey, float] | None = None
           ) -> Replay:
    """Every point's time with the given works and transfers (the measured ones when None)."""
    work = g.work if work is None else work
    transfer = g.transfer if transfer is None else transfer
    n = len(g.ranks)
    value = [[0.0] * len(tl) for tl in g.tl]
    bound = [[LOCAL] * len(tl) for tl in g.tl]
    done: dict[CollectiveKey, float] = {}
    latest: dict[CollectiveKey, tuple[float, int]] = {}
    count: dict[CollectiveKey, int] = {}
    cursor = [0] * n
    while True:
        moved = False
        for r in range(n):
            tl, v, b, w, d, t0 = g.tl[r], value[r], bound[r], work[r], g.dep[r], g.t0[r]
            pred, wake, kind, key = tl.pred, g.wake[r], tl.kind, tl.key
            i, size = cursor[r], len(tl)
            while i < size:
                k = d[i]
                gate = None
                if k is not None:
                    gate = done.get(k)
                    if gate is None:
                        break
                p = pred[i]
                at = v[p] + w[i] if p >= 0 else t0[i]
                if gate is not None and gate + wake[i] > at:
                    at, b[i] = gate + wake[i], GATED
                v[i] = at
                c = key[i]
                if kind[i] == ARRIVE and c is not None and c in transfer:
                    best = latest.get(c)
                    if best is None or at > best[0]:
                        latest[c] = (at, r)
                    count[c] = count.get(c, 0) + 1
                    if count[c] == n:
                        done[c] = latest[c][0] + transfer[c]
                i += 1
            moved |= i != cursor[r]
            cursor[r] = i
        if all(cursor[r] == len(g.tl[r]) for r in range(n)):
            break
        if not moved:
            _unblock(g, cursor, done, latest, transfer)
    return Replay(value, bound, done, {k: r for k, (_, r) in latest.items()})


def _unblock(g: Graph, cursor: list[int], done: dict[CollectiveKey, float],
             latest: dict[CollectiveKey, tuple[float, int]], transfer: dict[CollectiveKey, float]) -> None:
    """Ranks waiting on each other (their measured order disagrees by less than the clock skew): the collective
    awaited by the earliest blocked point completes with the arrivals it has."""
    r = min((r for r in range(len(g.ranks)) if cursor[r] < len(g.tl[r])), key=lambda r: g.t0[r][cursor[r]])
    k = g.dep[r][cursor[r]]
    assert k is not None
    done[k] = (latest[k][0] if k in latest else g.t0[r][cursor[r]]) + transfer.get(k, 0.0)


def step_times(g: Graph, rep: Replay) -> dict[int, list[float]]:
    """Step -> each rank's step time (us) in the replay."""
    return {s: [rep.value[r][g.end_at[r][s]] - rep.value[r][g.start_at[r][s]] for r in range(len(g.ranks))]
            for s in g.steps}


def measured_step_times(g: Graph) -> dict[int, list[float]]:
    """Step -> each rank's measured step time (us)."""
    return {s: [tl.t[g.end_at[r][s]] - tl.t[g.start_at[r][s]] for r, tl in enumerate(g.tl)] for s in g.steps}


def _statistic(per_step: dict[int, list[float]]) -> float:
    return median(sum(v) / len(v) for v in per_step.values())


def _scaled(g: Graph, targets: dict[int, dict[tuple[Any, ...], float]]) -> list[list[float]]:
    """The works with each rank's stretches (segments) of work set to ``targets[rank index][segment]``."""
    out = []
    for r, (w, seg) in enumerate(zip(g.work, g.segment)):
        own: dict[tuple[Any, ...], float] = {}
        for i, s in enumerate(seg):
            if s is not None:
                own[s] = own.get(s, 0.0) + w[i]
        goal = targets.get(r)
        if not goal:
            out.append(w)
            continue
        factor = {s: goal[s] / total for s, total in own.items() if s in goal and total > 0}
        out.append([x * factor.get(s, 1.0) if s is not None else x for x, s in zip(w, seg)])
    return out


def segment_work(g: Graph) -> list[dict[tuple[Any, ...], float]]:
    """Each rank's local work per stretch (segment), in us."""
    out = []
    for w, seg in zip(g.work, g.segment):
        own: dict[tuple[Any, ...], float] = {}
        for x, s in zip(w, seg):
            if s is not None:
                own[s] = own.get(s, 0.0) + x
        out.append(own)
    return out


def _per_step_work(g: Graph, seg_work: list[dict[tuple[Any, ...], float]]) -> list[float]:
    """Each rank's local work per step, median over the common steps (us)."""
    out = []
    for own in seg_work:
        per_step: dict[int, float] = {}
        for s, x in own.items():
            per_step[s[0]] = per_step.get(s[0], 0.0) + x
        out.append(median(per_step.get(s, 0.0) for s in g.steps))
    return out


def scenarios(g: Graph, reference: list[ReferencePoint] | None = None
              ) -> tuple[list[tuple[str, str, list[int], Replay]], int | None, int | None]:
    """The scenario replays: (id, title, ranks changed, replay); and the slowest and fastest rank indices."""
    n = len(g.ranks)
    out: list[tuple[str, str, list[int], Replay]] = []
    seg_work = segment_work(g)
    slowest = fastest = None
    if n > 1:
        totals = _per_step_work(g, seg_work)
        slowest = max(range(n), key=lambda r: (totals[r], -r))
        fastest = min(range(n), key=lambda r: (totals[r], r))
        peers = [seg_work[r] for r in range(n) if r != slowest]
        goal = {s: median(p[s] for p in peers if s in p) for s in seg_work[slowest] if any(s in p for p in peers)}
        out.append(("slow_rank", f"rank {g.ranks[slowest]} at its peers' median pace", [g.ranks[slowest]],
                    replay(g, _scaled(g, {slowest: goal}))))
    loading = [[max(0.0, x - dl) for x, dl in zip(w, tl.loading)] for w, tl in zip(g.work, g.tl)]
    changed = [g.ranks[r] for r, tl in enumerate(g.tl) if any(x > 0 for x in tl.loading)]
    out.append(("no_data_loading", "data loading at zero on every rank", changed, replay(g, loading)))
    out.append(("hide_communication", "exposed communication hidden (transfers fully overlapped)", list(g.ranks),
                replay(g, transfer=dict.fromkeys(g.transfer, 0.0))))
    if n > 1 and fastest is not None:
        goal_f = seg_work[fastest]
        others = [g.ranks[r] for r in range(n) if r != fastest]
        out.append(("fastest_pace", f"every rank at the fastest rank's (rank {g.ranks[fastest]}) pace", others,
                    replay(g, _scaled(g, {r: goal_f for r in range(n) if r != fastest}))))
    if reference:
        at_ref = _transfers_at(g, reference)
        if at_ref:
            out.append(("network_at_reference", "transfers at the reference bandwidth (--bandwidth-ref)",
                        list(g.ranks), replay(g, transfer=at_ref)))
    return out, slowest, fastest


def _transfers_at(g: Graph, reference: list[ReferencePoint]) -> dict[CollectiveKey, float]:
    """Each transfer at the reference busbw of its kind and nearest size, when faster than measured; {} when no
    collective has both a size and a reference."""
    from hf_distprof.analysis.bandwidth_ref import nearest_reference

    out = dict(g.transfer)
    found = False
    for k, t in g.transfer.items():
        size, group = g.bytes_of.get(k, (None, None))
        factor = bus_factor(k[1], group)
        ref = nearest_reference(reference, k[1], size, group) if size else None
        if ref is not None and factor and size:
            out[k] = min(t, size * factor / (ref.busbw_gbps * 1e3))  # bytes / (GB/s) in us
            found = True
    return out if found else {}
