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

    Args:
        steps: The rank's steps.
        collectives: The rank's collectives, with ``exposed_us`` and ``phase`` set.
        gpu: Whether the rank's trace holds GPU events.

    Returns:
        One row per kind present, in that order; empty when the rank ran no collective.
    """
    if not steps:
        return []
    index = {s.step: i for i, s in enumerate(steps)}
    bases = [_step_basis(s, gpu) for s in steps]
    rows: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, set[str]] = {}
    n = len(steps)
    for c in collectives:
        i = index.get(c.step)
        if i is None:
            continue
        bucket = kind_bucket(c.kind)
        kinds.setdefault(bucket, set()).add(c.kind)
        row = rows.setdefault(bucket, {k: [0.0] * n for k in ("count", "time", "exposed", "fwd", "bwd")})
        row["count"][i] += 1
        row["time"][i] += c.duration_us
        row["exposed"][i] += c.exposed_us
        if c.phase == "forward":
            row["fwd"][i] += c.exposed_us
        elif c.phase == "backward":
            row["bwd"][i] += c.exposed_us
    mean_basis = sum(bases) / n
    out = []
    for bucket in [*MAIN_KINDS, OTHER_KIND]:
        row = rows.get(bucket)
        if row is None:
            continue
        exposed = sum(row["exposed"]) / n
        out.append(
            CommKindStat(
                kind=bucket,
                kinds=sorted(kinds[bucket]),
                count_per_step=sum(row["count"]) / n,
                time_us=sum(row["time"]) / n,
                exposed_us=exposed,
                exposed_pct=100.0 * exposed / mean_basis if mean_basis > 0 else 0.0,
                exposed_pct_median=median(
                    100.0 * e / b if b > 0 else 0.0 for e, b in zip(row["exposed"], bases)
                ),
                forward_exposed_us=sum(row["fwd"]) / n,
                backward_exposed_us=sum(row["bwd"]) / n,
            )
        )
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
            acc[1] += c.duration_us / n
            acc[2] += c.exposed_us / n
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
            )
        )
    return out
