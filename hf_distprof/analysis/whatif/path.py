"""The cross-rank critical path of one replayed step, and the step's lanes for the report's figure (pure).

The critical path is followed backwards from the latest rank's step end: through a point's own work when that
set its time, else through the collective that gated it, to the transfer on the rank that arrived last and on
along that rank, until the step's start (its earliest rank's). Its links add up to that span.
"""

from __future__ import annotations

from typing import Any

from hf_distprof.analysis.rank.timeline import ARRIVE, START
from hf_distprof.analysis.results.rank import CollectiveKey
from hf_distprof.analysis.results.whatif import CriticalSegment
from hf_distprof.analysis.whatif.replay import GATED, Graph, Replay


def collective_name(key: CollectiveKey) -> str:
    """``all_reduce#1``: the kind and its k-th of the step."""
    return f"{key[1]}#{key[2]}"


def _window(g: Graph, rep: Replay, step: int) -> tuple[float, float, int]:
    """(start, end, rank index ending last) of ``step`` in the replay."""
    n = len(g.ranks)
    origin = min(rep.value[r][g.start_at[r][step]] for r in range(n))
    end, last = max((rep.value[r][g.end_at[r][step]], r) for r in range(n))
    return origin, end, last


COLLECTIVE_START = "collective start"
"""The family of a piece of work that is a collective's start on its worker (gloo), not a phase of the step."""


WAKE_UP_SHOWN_US = 5.0
"""A rank's lag after a collective's completion shorter than this is part of the collective's link, not a link of its
own (NCCL kernels end microseconds apart on every rank)."""


def _pieces(g: Graph, r: int, i: int) -> list[tuple[str, float, str]]:
    """The local work of point ``i`` of rank index ``r`` by phase, as replayed (scaled to its replayed work):
    ``(name, us, family)``, the family the phase itself or :data:`COLLECTIVE_START`."""
    tl = g.tl[r]
    w = g.work[r][i]
    if tl.kind[i] == ARRIVE and not tl.main[i]:
        key = tl.key[i]
        return [(f"{collective_name(key)} start", w, COLLECTIVE_START)] if key is not None and w > 0 else []
    pieces = list(tl.phases[i])
    total = sum(us for _, us in pieces)
    if w > total:  # a wait on a collective not matched on every rank stays local time
        pieces.append(("waiting (unmatched collective)", w - total))
    elif total > w > 0:
        pieces = [(name, us * w / total) for name, us in pieces]
    return [(name, us, name) for name, us in pieces]


def critical_path(g: Graph, rep: Replay, step: int, transfer: dict[CollectiveKey, float]) -> list[CriticalSegment]:
    """The chain of work and transfers that sets ``step``'s time in the replay ``rep``.

    Args:
        g: The graph.
        rep: A replay of it.
        step: A step every rank traced.
        transfer: The transfers ``rep`` used.

    Returns:
        The links in time order, consecutive links of one rank, kind and name merged.
    """
    origin, _, r = _window(g, rep, step)
    i = g.end_at[r][step]
    out: list[CriticalSegment] = []  # backwards
    for _ in range(sum(len(tl) for tl in g.tl)):  # a path never visits a point twice
        at = rep.value[r][i]
        if at <= origin or (g.tl[r].kind[i] == START and g.tl[r].step[i] == step):
            break
        if rep.bound[r][i] == GATED:
            key = g.dep[r][i]
            assert key is not None
            done = rep.done[key]
            woke = max(done, origin)  # (a collective of the step before, completed before this step's start)
            name = collective_name(key) if key[0] == step else f"step {key[0]}'s {collective_name(key)}"
            if at - woke >= WAKE_UP_SHOWN_US:
                out.append(CriticalSegment(g.ranks[r], "collective", f"{name} wake-up", (at - woke) / 1e3,
                                           (woke - origin) / 1e3))
                end = done
            else:  # woken before the span's recorded end (it left the collective then), or within microseconds
                end = at
            last = rep.last[key]
            span = transfer.get(key, 0.0)
            start = max(done - span, origin)
            if end > start:
                out.append(CriticalSegment(g.ranks[last], "collective", name, (end - start) / 1e3,
                                           (start - origin) / 1e3))
            r, i = last, g.arrive_at[last][key]
            continue
        t = at
        for name, us, family in reversed(_pieces(g, r, i)):
            begin = max(t - us, origin)
            what = "collective" if family == COLLECTIVE_START else "phase"
            if t > begin:
                out.append(CriticalSegment(g.ranks[r], what, name, (t - begin) / 1e3, (begin - origin) / 1e3))
            t = begin
        p = g.tl[r].pred[i]
        if p < 0:
            break
        i = p
    return _merged(out[::-1])


def _merged(path: list[CriticalSegment]) -> list[CriticalSegment]:
    """Each stretch of local work on one rank (between two collectives) as one link per phase, in order of first
    appearance and summed, laid end to end from the stretch's start: a phase interleaved with gaps ("compute,
    other, compute ...") reads as one figure."""
    out: list[CriticalSegment] = []
    stretch: list[CriticalSegment] = []

    def flush() -> None:
        if not stretch:
            return
        by_name: dict[str, CriticalSegment] = {}
        for seg in stretch:
            if seg.name in by_name:
                by_name[seg.name].ms += seg.ms
            else:
                by_name[seg.name] = CriticalSegment(seg.rank, seg.kind, seg.name, seg.ms, 0.0)
        t = stretch[0].start_ms
        for seg in by_name.values():
            seg.start_ms = t
            t += seg.ms
            out.append(seg)
        stretch.clear()

    for seg in path:
        if seg.kind == "phase" and (not stretch or stretch[-1].rank == seg.rank):
            stretch.append(seg)
            continue
        flush()
        if seg.kind == "phase":
            stretch.append(seg)
        elif out and (out[-1].rank, out[-1].kind, out[-1].name) == (seg.rank, seg.kind, seg.name):
            out[-1].ms += seg.ms
        else:
            out.append(seg)
    flush()
    return out


def lanes(g: Graph, rep: Replay, step: int, transfer: dict[CollectiveKey, float]) -> list[dict[str, Any]]:
    """``step`` as replayed, per rank: its work by phase, its waits, and each transfer on the rank that arrived
    last; ``{rank, start_ms, end_ms, name, family}`` from the step's start, clipped to the step (``family``: what the
    figure draws it as: its phase, "waiting", "transfer" or :data:`COLLECTIVE_START`)."""
    origin, end, _ = _window(g, rep, step)
    out: list[dict[str, Any]] = []

    def add(r: int, a: float, b: float, name: str, family: str) -> None:
        a, b = max(a, origin), min(b, end)
        if b <= a:
            return
        prev = out[-1] if out else None
        if prev is not None and prev["rank"] == g.ranks[r] and prev["name"] == name and \
                abs(prev["end_ms"] - (a - origin) / 1e3) < 1e-9:
            prev["end_ms"] = (b - origin) / 1e3
            return
        out.append({"rank": g.ranks[r], "start_ms": (a - origin) / 1e3, "end_ms": (b - origin) / 1e3, "name": name,
                    "family": family})

    for r, tl in enumerate(g.tl):
        v = rep.value[r]
        for i in range(len(tl)):
            if not tl.main[i] or v[i] < origin or (i > 0 and tl.pred[i] >= 0 and v[tl.pred[i]] > end):
                continue
            p = tl.pred[i]
            t = v[p] if p >= 0 else v[i]
            for name, us, family in _pieces(g, r, i):
                add(r, t, t + us, name, family)
                t += us
            if rep.bound[r][i] == GATED and v[i] > t:
                add(r, t, v[i], "waiting", "waiting")
    for key, done in rep.done.items():
        if key[0] == step:
            add(rep.last[key], done - transfer.get(key, 0.0), done, f"transfer {collective_name(key)}", "transfer")
    return out
