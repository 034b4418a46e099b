"""Communication by collective kind and FSDP unit (pure): who issued each collective, what of it is
exposed, and the per-kind and per-unit tables.

A collective is *exposed* for the part of its own time that no computation hides: on GPU, the part of its
NCCL kernel during which no computation kernel runs (HTA's definition of overlap, per collective); on CPU
backends, the part of its gloo span during which the training thread waits for communication (see
:mod:`hf_distprof.analysis.cpu`). FSDP2 annotates what it issues: ``FSDP::all_gather (<unit>)`` and
``FSDP::post_backward_reduce (<unit>)`` name the unit, and ``FSDP::pre_forward`` / ``FSDP::pre_backward``
(and the other hooks around them) tell forward from backward. A collective is attributed to the innermost
such annotation that contains the moment it was issued.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from statistics import median

from hf_distprof.analysis import intervals as iv
from hf_distprof.analysis.events import Span
from hf_distprof.analysis.kernels import MAIN_KINDS, OTHER_KIND, kind_bucket
from hf_distprof.analysis.model import (
    Collective,
    CommKindStat,
    ModuleCommStat,
    RankResult,
    StepResult,
)

# FSDP's per-unit annotations that issue a collective: the unit is in the parentheses (none for the root).
UNIT_ANNOTATIONS = ("FSDP::all_gather", "FSDP::post_backward_reduce")
FORWARD_PREFIXES = ("FSDP::pre_forward", "FSDP::root_pre_forward", "FSDP::post_forward")
BACKWARD_PREFIXES = (
    "FSDP::pre_backward",
    "FSDP::backward_prefetch",
    "FSDP::post_backward",
    "FSDP::root_post_backward",
)


class SpanIndex:
    """The spans (sorted by start, nested or not, from any thread) that contain a given moment."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        self.starts = [s[0] for s in spans]
        self.longest = max((e - s for s, e, _ in spans), default=0.0)

    def containing(self, t: float) -> list[Span]:
        """The spans with ``start <= t <= end``, outermost (earliest start) first."""
        out: list[Span] = []
        i = bisect_right(self.starts, t) - 1
        floor = t - self.longest
        while i >= 0 and self.starts[i] >= floor:
            span = self.spans[i]
            if span[1] >= t:
                out.append(span)
            i -= 1
        out.reverse()
        return out


def unit_of(name: str) -> str | None:
    """The FSDP unit named by an issuing annotation (``"model.layers.0"``, ``""`` for the root), else None."""
    for prefix in UNIT_ANNOTATIONS:
        if name == prefix:
            return ""
        if name.startswith(prefix + " (") and name.endswith(")"):
            return name[len(prefix) + 2 : -1]
    return None


def fsdp_context(index: SpanIndex, t: float) -> tuple[str | None, str | None]:
    """``(unit, phase)`` of a collective issued at ``t``: the innermost issuing annotation's unit, and
    "backward" / "forward" from the innermost FSDP hook around it (None for either when absent)."""
    module: str | None = None
    phase: str | None = None
    for _, _, name in reversed(index.containing(t)):  # innermost first
        if module is None:
            module = unit_of(name)
        if phase is None:
            if name.startswith(BACKWARD_PREFIXES):
                phase = "backward"
            elif name.startswith(FORWARD_PREFIXES):
                phase = "forward"
    return module, phase


def attribute(collectives: list[Collective], fsdp_spans: list[Span]) -> None:
    """Set ``module`` and ``phase`` of each collective whose issue time is known, from FSDP's annotations."""
    if not fsdp_spans:
        return
    index = SpanIndex(fsdp_spans)
    for c in collectives:
        if c.issued_us is not None:
            c.module, c.phase = fsdp_context(index, c.issued_us)


def overlap(span: tuple[float, float], merged: list[iv.Interval], starts: Sequence[float]) -> float:
    """Length of ``span`` covered by the disjoint sorted intervals ``merged`` (``starts`` are theirs)."""
    start, end = span
    total = 0.0
    i = max(0, bisect_left(starts, start) - 1)
    while i < len(merged) and merged[i][0] < end:
        s, e = merged[i]
        if e > start:
            total += min(e, end) - max(s, start)
        i += 1
    return total


def share_exposure(collectives: list[Collective], exposed: Sequence[tuple[int, list[iv.Interval]]]) -> None:
    """Give every exposed moment of the rank to one collective: its :attr:`~Collective.exposed_share`.

    Where collectives overlap (gloo runs them on two worker threads, NCCL on several streams), the rank waits for
    the earliest started of those in flight: that one owns the moment. A collective thus owns its span less the
    spans of the collectives started before it, and the owned spans are disjoint. Exposed moments no collective
    covers (on CPU, enqueueing a collective: the ``c10d::*`` op) go to the collective issued nearest to them.
    The pieces of a step add up to the step's exposed communication, so the per-kind rows do too.

    Args:
        collectives: The rank's collectives (any order).
        exposed: ``(step, intervals)`` per step: its exposed communication as disjoint sorted intervals (CPU: the
            training thread waiting for communication; GPU: communication kernels with no computation running).
    """
    for c in collectives:
        c.exposed_share = []
    if not collectives:
        return
    ordered = sorted(collectives, key=lambda c: (c.start_us, c.end_us))
    owned: list[iv.Interval] = []
    owner: list[Collective] = []
    frontier = float("-inf")
    for c in ordered:
        start = max(c.start_us, frontier)
        if c.end_us > start:
            owned.append((start, c.end_us))
            owner.append(c)
        frontier = max(frontier, c.end_us)
    starts = [s for s, _ in owned]
    anchors = sorted((c.issued_us if c.issued_us is not None else c.start_us, i) for i, c in enumerate(ordered))
    times = [t for t, _ in anchors]
    for step, intervals in exposed:
        for a, b in intervals:
            i = max(0, bisect_right(starts, a) - 1)
            cur = a
            while cur < b and i < len(owned):
                s, e = owned[i]
                if e <= cur:
                    i += 1
                    continue
                if s > cur:  # a gap no collective owns: the nearest issued one takes it
                    _nearest(ordered, anchors, times, cur).exposed_share.append((cur, min(s, b), step))
                    cur = min(s, b)
                    continue
                end = min(e, b)
                owner[i].exposed_share.append((cur, end, step))
                cur = end
            if cur < b:
                _nearest(ordered, anchors, times, cur).exposed_share.append((cur, b, step))


def _nearest(ordered: list[Collective], anchors: list[tuple[float, int]], times: list[float], t: float) -> Collective:
    """The collective whose issue (else start) time is nearest to ``t``."""
    k = bisect_left(times, t)
    best = min((j for j in (k - 1, k) if 0 <= j < len(anchors)), key=lambda j: abs(times[j] - t))
    return ordered[anchors[best][1]]


def set_waits(ranks: list[RankResult], offsets: dict[int, float],
              matched: dict[tuple[int, str, int], dict[int, Collective]]) -> None:
    """Set each matched collective's :attr:`~Collective.peers_in_us` and :attr:`~Collective.waited_for`.

    A collective cannot complete before the last rank taking part reaches it, so on the ranks that reached it
    earlier the time from their arrival to that moment is a wait for a late peer, whatever the network; the rest
    is the collective itself. Arrivals are the collectives' starts, on clocks aligned by ``offsets``.

    Args:
        ranks: The ranks (their collectives are updated).
        offsets: :func:`hf_distprof.analysis.cross_rank.clock_offsets`.
        matched: :func:`hf_distprof.analysis.cross_rank.match_collectives`.
    """
    for r in ranks:
        for c in r.collectives:
            c.peers_in_us, c.waited_for = None, None
    for same in matched.values():
        arrivals = {rank: c.start_us - offsets.get(rank, 0.0) for rank, c in same.items()}
        last = max(arrivals, key=lambda rank: (arrivals[rank], rank))
        for rank, c in same.items():
            c.peers_in_us = arrivals[last] + offsets.get(rank, 0.0)
            c.waited_for = last if last != rank and arrivals[last] > arrivals[rank] else None


def wait_share(c: Collective) -> list[tuple[float, float, int]]:
    """The pieces of ``c``'s exposed share that are a wait for a late peer: from its own arrival (its start; the
    enqueue before it is not a wait) to :attr:`~Collective.peers_in_us`."""
    if c.peers_in_us is None or c.waited_for is None:
        return []
    until = c.peers_in_us
    return [(max(s, c.start_us), min(e, until), step) for s, e, step in c.exposed_share
            if max(s, c.start_us) < min(e, until)]


def set_exposure(collectives: list[Collective], hiding: list[iv.Interval], hidden_when_covered: bool) -> None:
    """Fill ``exposed_us`` of every collective.

    Args:
        collectives: This rank's collectives.
        hiding: Disjoint sorted intervals. GPU: computation kernels, which hide communication. CPU: the
            training thread waiting for communication, which exposes it.
        hidden_when_covered: True for GPU (exposed = not covered), False for CPU (exposed = covered).
    """
    starts = [s for s, _ in hiding]
    for c in collectives:
        covered = overlap((c.start_us, c.end_us), hiding, starts)
        c.exposed_us = c.duration_us - covered if hidden_when_covered else covered


def _step_basis(step: StepResult, gpu: bool) -> float:
    """What a step's shares are of: its GPU span on GPU traces (as HTA's), its wall time on CPU."""
    if gpu and step.gpu is not None:
        return step.gpu.kernel_time_us
    return step.duration_us


def by_kind(steps: list[StepResult], collectives: list[Collective], gpu: bool) -> list[CommKindStat]:
    """Per-kind table of one rank: all_gather, reduce_scatter, all_reduce, then the other kinds summed.

    Time is the union of a kind's spans per step (not their sum; with the enqueueing ops, on CPU, that its exposed
    share holds); exposed time is the kind's share of the step's
    exposed communication (:func:`share_exposure`), split into the wait for a late peer and the rest
    (:func:`set_waits`). Percentages are of the step (its GPU span on GPU traces, as HTA's; its wall time on CPU),
    averaged over steps, so that a rank's rows add up to its exposed communication in the headline.

    Args:
        steps: The rank's steps.
        collectives: The rank's collectives, with ``exposed_share`` and ``phase`` set (and waits, when known).
        gpu: Whether the rank's trace holds GPU events.

    Returns:
        One row per kind present, in that order; empty when the rank ran no collective.
    """
    if not steps:
        return []
    index = {s.step: i for i, s in enumerate(steps)}
    bases = [_step_basis(s, gpu) for s in steps]
    n = len(steps)
    spans: dict[str, list[list[iv.Interval]]] = {}
    rows: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, set[str]] = {}
    waited: dict[str, dict[int, float]] = {}
    for c in collectives:
        bucket = kind_bucket(c.kind)
        row = rows.get(bucket)
        if row is None:
            row = rows[bucket] = {k: [0.0] * n for k in ("count", "exposed", "wait", "fwd", "bwd")}
            spans[bucket] = [[] for _ in range(n)]
            kinds[bucket] = set()
        i = index.get(c.step)
        if i is not None:
            kinds[bucket].add(c.kind)
            row["count"][i] += 1
            spans[bucket][i].append((c.start_us, c.end_us))
        for s, e, step in c.exposed_share:
            j = index.get(step)
            if j is None:
                continue
            kinds[bucket].add(c.kind)
            row["exposed"][j] += e - s
            spans[bucket][j].append((s, e))  # enqueueing it (CPU) is its time too: exposed never exceeds time
            if c.phase == "forward":
                row["fwd"][j] += e - s
            elif c.phase == "backward":
                row["bwd"][j] += e - s
        for s, e, step in wait_share(c):
            j = index.get(step)
            if j is not None and c.waited_for is not None:
                row["wait"][j] += e - s
                peers = waited.setdefault(bucket, {})
                peers[c.waited_for] = peers.get(c.waited_for, 0.0) + e - s
    out = []
    for bucket in [*MAIN_KINDS, OTHER_KIND]:
        row = rows.get(bucket)
        if row is None or not kinds[bucket]:
            continue
        pct = [100.0 * e / b if b > 0 else 0.0 for e, b in zip(row["exposed"], bases)]
        peers = waited.get(bucket, {})
        out.append(
            CommKindStat(
                kind=bucket,
                kinds=sorted(kinds[bucket]),
                count_per_step=sum(row["count"]) / n,
                time_us=sum(iv.total(iv.merge(step_spans)) for step_spans in spans[bucket]) / n,
                exposed_us=sum(row["exposed"]) / n,
                exposed_pct=sum(pct) / n,
                exposed_pct_median=median(pct),
                forward_exposed_us=sum(row["fwd"]) / n,
                backward_exposed_us=sum(row["bwd"]) / n,
                wait_us=sum(row["wait"]) / n,
                wait_pct=sum(100.0 * w / b if b > 0 else 0.0 for w, b in zip(row["wait"], bases)) / n,
                waited_for=sorted(peers, key=lambda p: (-peers[p], p)),
            )
        )
    return out


def waits_for_peers(rank: RankResult) -> dict[int, dict[str, float]]:
    """peer -> kind -> the % of the step this rank waits at collectives of that kind for that peer (the peer
    arrived last), mean over the rank's steps (same base as the per-kind table)."""
    gpu = rank.device == "gpu"
    index = {s.step: i for i, s in enumerate(rank.steps)}
    bases = [_step_basis(s, gpu) for s in rank.steps]
    out: dict[int, dict[str, float]] = {}
    for c in rank.collectives:
        for s, e, step in wait_share(c):
            j = index.get(step)
            if j is None or c.waited_for is None or bases[j] <= 0:
                continue
            kinds = out.setdefault(c.waited_for, {})
            bucket = kind_bucket(c.kind)
            kinds[bucket] = kinds.get(bucket, 0.0) + 100.0 * (e - s) / bases[j] / len(rank.steps)
    return out


def wait_pct_per_step(rank: RankResult) -> list[float]:
    """Per step, the exposed communication that is a wait for a late peer, % of the step (GPU: its GPU span)."""
    waits = wait_us_per_step(rank)
    bases = [_step_basis(s, rank.device == "gpu") for s in rank.steps]
    return [100.0 * waits[s.step] / b if b > 0 else 0.0 for s, b in zip(rank.steps, bases)]


def wait_us_per_step(rank: RankResult) -> dict[int, float]:
    """step -> microseconds of the step's exposed communication that are a wait for a late peer."""
    out = {s.step: 0.0 for s in rank.steps}
    for c in rank.collectives:
        for s, e, step in wait_share(c):
            if step in out:
                out[step] += e - s
    return out


def by_module(ranks: list[RankResult]) -> list[ModuleCommStat]:
    """Per FSDP unit, kind and phase: collectives per step, their time and exposed time, mean over ranks.

    Args:
        ranks: Per-rank results.

    Returns:
        Rows sorted by exposed time (largest first); empty without FSDP annotations.
    """
    sums: dict[tuple[str, str, str | None], list[float]] = {}
    counted = [r for r in ranks if r.steps]
    for r in counted:
        n = len(r.steps)
        for c in r.collectives:
            if c.module is None:
                continue
            acc = sums.setdefault((c.module, c.kind, c.phase), [0.0, 0.0, 0.0])
            acc[0] += 1 / n
            # Its span with the enqueueing its share holds (CPU), and its share of the exposed time: overlapping
            # collectives do not count a moment twice, and the exposed time never exceeds the time.
            acc[1] += iv.total(iv.merge([(c.start_us, c.end_us), *((a, b) for a, b, _ in c.exposed_share)])) / n
            acc[2] += c.exposed_share_us / n
    k = len(counted) or 1
    rows = [
        ModuleCommStat(module, kind, phase, count / k, time / k, exposed / k)
        for (module, kind, phase), (count, time, exposed) in sums.items()
    ]
    return sorted(rows, key=lambda r: (-r.exposed_us, r.module, r.kind))


def mean_by_kind(ranks: list[RankResult]) -> list[CommKindStat]:
    """The per-kind table averaged over the ranks (for the headline and the JSON's top level)."""
    rows: dict[str, list[CommKindStat]] = {}
    for r in ranks:
        for row in r.comm_by_kind:
            rows.setdefault(row.kind, []).append(row)
    k = len(ranks) or 1
    out = []
    for kind in [*MAIN_KINDS, OTHER_KIND]:
        same = rows.get(kind)
        if not same:
            continue
        out.append(
            CommKindStat(
                kind=kind,
                kinds=sorted({x for row in same for x in row.kinds}),
                count_per_step=sum(r.count_per_step for r in same) / k,
                time_us=sum(r.time_us for r in same) / k,
                exposed_us=sum(r.exposed_us for r in same) / k,
                exposed_pct=sum(r.exposed_pct for r in same) / k,
                exposed_pct_median=median(r.exposed_pct_median for r in same),
                forward_exposed_us=sum(r.forward_exposed_us for r in same) / k,
                backward_exposed_us=sum(r.backward_exposed_us for r in same) / k,
                wait_us=sum(r.wait_us for r in same) / k,
                wait_pct=sum(r.wait_pct for r in same) / k,
                waited_for=sorted({p for r in same for p in r.waited_for}),
            )
        )
    return out
