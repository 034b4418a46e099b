"""Each collective's exposure on one rank (pure; runs in the worker): who issued it, and which of the rank's exposed
moments are its.

A collective is *exposed* for the part of its own time that no computation hides: on GPU, the part of its
NCCL kernel during which no computation kernel runs (HTA's definition of overlap, per collective); on CPU
backends, the part of its gloo span during which the training thread waits for communication (see
:mod:`hf_distprof.analysis.rank.cpu`). FSDP2 annotates what it issues: ``FSDP::all_gather (<unit>)`` and
``FSDP::post_backward_reduce (<unit>)`` name the unit, and ``FSDP::pre_forward`` / ``FSDP::pre_backward``
(and the other hooks around them) tell forward from backward. A collective is attributed to the innermost
such annotation that contains the moment it was issued.

The per-kind and per-unit tables are built from these across ranks, once the late-peer waits are known
(:mod:`hf_distprof.analysis.across.comm`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.read.events import Span
from hf_distprof.analysis.results.rank import Collective

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
