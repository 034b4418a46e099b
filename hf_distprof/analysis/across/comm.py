"""Communication by collective kind and FSDP unit (pure; across ranks, after alignment): the per-kind and per-unit
tables, and who waits for whom.

Each collective's exposed share comes from its rank (:mod:`hf_distprof.analysis.rank.exposure`); the part of it
that is a wait for a late peer is known only once the ranks are aligned (:mod:`hf_distprof.analysis.across.align`),
so the tables are built here, once, after that.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.kernels import MAIN_KINDS, OTHER_KIND, kind_bucket
from hf_distprof.analysis.results.across import LatePeer
from hf_distprof.analysis.results.rank import (
    Collective,
    CollectiveKey,
    CommKindStat,
    ModuleCommStat,
    PeerWait,
    RankResult,
    StepResult,
)


def wait_share(c: Collective) -> list[tuple[float, float, int]]:
    """The pieces of ``c``'s exposed share that are a wait for a late peer: from its own arrival (its start; the
    enqueue before it is not a wait) to :attr:`~Collective.peers_in_us`."""
    if c.peers_in_us is None or c.waited_for is None:
        return []
    until = c.peers_in_us
    return [(max(s, c.start_us), min(e, until), step) for s, e, step in c.exposed_share
            if max(s, c.start_us) < min(e, until)]


def lag_share(c: Collective) -> list[tuple[float, float, int]]:
    """The pieces of ``c``'s exposed share after it completed (:attr:`~Collective.done_in_us`): the rank still in it
    once a peer was done, its thread not yet running again (on a shared host, a wait for a CPU): not the transfer."""
    if c.done_in_us is None:
        return []
    since = max(c.done_in_us, c.start_us)
    return [(max(s, since), e, step) for s, e, step in c.exposed_share if max(s, since) < e]


def step_basis(step: StepResult, gpu: bool) -> float:
    """What a step's shares are of: its GPU span on GPU traces (as HTA's), its wall time on CPU. The one basis of
    every per-step share of communication (the per-kind tables, the waits, the findings' thresholds)."""
    if gpu and step.gpu is not None:
        return step.gpu.kernel_time_us
    return step.duration_us


Pieces = list[tuple[float, float, int]]
"""A collective's wait for a late peer, as exposed pieces (:func:`wait_share`)."""


def by_kind(steps: list[StepResult], collectives: list[Collective], gpu: bool, waits: list[Pieces] | None = None,
            late: list[LatePeer] | None = None) -> tuple[list[CommKindStat], dict[str, list[float]]]:
    """Per-kind table of one rank: all_gather, reduce_scatter, all_reduce, then the other kinds summed.

    Time is the union of a kind's spans per step (not their sum; with the enqueueing ops, on CPU, that its exposed
    share holds); exposed time is the kind's share of the step's exposed communication
    (:func:`hf_distprof.analysis.rank.exposure.share_exposure`), split into the wait for a late peer and the rest
    (:func:`hf_distprof.analysis.across.align.set_waits`). Percentages are of the step (its GPU span on GPU traces, as
    HTA's; its wall time on CPU), averaged over steps, so that a rank's rows add up to its exposed communication in
    the headline.

    Args:
        steps: The rank's steps.
        collectives: The rank's collectives, with ``exposed_share`` and ``phase`` set (and waits, when known).
        gpu: Whether the rank's trace holds GPU events.
        waits: Each collective's wait for a late peer (:func:`wait_share`), when already cut.
        late: The rank's late peers (:func:`rank_waits`, the one account of the wait per late peer): each row's
            ``waited_for`` lists those it waits for at that row's kind, longest wait first (ties: the lower rank).

    Returns:
        One row per kind present, in that order (empty when the rank ran no collective), and per row's kind its
        exposed share of each step (%, what its median is of).
    """
    if not steps:
        return [], {}
    index = {s.step: i for i, s in enumerate(steps)}
    bases = [step_basis(s, gpu) for s in steps]
    n = len(steps)
    spans: dict[str, list[list[iv.Interval]]] = {}
    rows: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, set[str]] = {}
    if waits is None:
        waits = [wait_share(c) for c in collectives]
    for c, pieces in zip(collectives, waits):
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
        for s, e, step in pieces:
            j = index.get(step)
            if j is not None and c.waited_for is not None:
                row["wait"][j] += e - s
    waited: dict[str, list[tuple[float, int]]] = {}
    for p in late or []:
        for bucket, pct in p.kinds:
            waited.setdefault(bucket, []).append((-pct, p.peer))
    out = []
    series: dict[str, list[float]] = {}
    for bucket in [*MAIN_KINDS, OTHER_KIND]:
        row = rows.get(bucket)
        if row is None or not kinds[bucket]:
            continue
        pct = series[bucket] = [100.0 * e / b if b > 0 else 0.0 for e, b in zip(row["exposed"], bases)]
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
                waited_for=[peer for _, peer in sorted(waited.get(bucket, []))],
            )
        )
    return out, series


def split_wait(start: float, end: float, times: Sequence[float], ranks: Sequence[int]) -> list[tuple[int, float]]:
    """A wait from ``start`` to ``end`` for the late peers ``ranks``, arriving at ``times`` (sorted, on the same clock),
    split among them: each moment goes in equal parts to the peers not arrived yet (the Shapley value of the wait, the
    last arrival's time: a peer that arrives just before the last one is waited for nearly as long). A rank 0.5 ms after
    two others that were 7 ms late holds its peers back by its 0.5 ms and a third of the 7 ms, not by all of it."""
    m = len(times)
    if m == 1 or times[0] >= end:  # one peer, or none arrived before the piece ends: they share it alike
        return [(ranks[0], end - start)] if m == 1 else [(r, (end - start) / m) for r in ranks]
    out: dict[int, float] = {}
    share, prev = 0.0, start
    for k in range(m):
        hi = min(end, times[k])
        if hi > prev:
            share += (hi - prev) / (m - k)  # each peer not arrived yet, from the k-th on, waited for alike
            prev = hi
        if share > 0.0:
            out[ranks[k]] = out.get(ranks[k], 0.0) + share
    return list(out.items())


@dataclass
class RankWaits:
    """One rank's waits for late peers at its collectives, every figure of them from one pass."""

    per_step_us: dict[int, float]
    """step -> microseconds of its exposed communication that are such a wait."""
    peer_waits: list[PeerWait]
    """Per peer and kind, the % of the step it waits there, mean over the rank's steps, in the order first met (what
    ``--json`` shows per rank); a wait for several late peers is split among them (:func:`split_wait`)."""
    late_peers: list[LatePeer]
    """The same per peer, longest wait first (ties: the lower rank), with microseconds per step."""


def rank_waits(rank: RankResult, waits: list[Pieces] | None = None,
               order: Mapping[CollectiveKey, tuple[list[float], list[int]]] | None = None,
               offset_us: float = 0.0) -> RankWaits:
    """Who ``rank`` waits for at its collectives, and how long, per step and per peer: the one account of the wait per
    late peer (each exposed moment once, :func:`wait_share`), on the per-kind table's base. ``order``: each
    collective's arrivals in order (:func:`~hf_distprof.analysis.across.align.arrival_order`, on the first rank's clock,
    ``offset_us`` behind this rank's): a wait is split among the peers that arrived after this rank; without it (or
    for a collective it lacks) the wait is the last arrival's."""
    gpu = rank.device == "gpu"
    index = {s.step: i for i, s in enumerate(rank.steps)}
    bases = [step_basis(s, gpu) for s in rank.steps]
    n = len(rank.steps)
    per_step = {s.step: 0.0 for s in rank.steps}
    pct: dict[int, dict[str, float]] = {}
    us: dict[int, float] = {}
    if waits is None:
        waits = [wait_share(c) for c in rank.collectives]
    for c, pieces in zip(rank.collectives, waits):
        if not pieces:
            continue
        late: tuple[Sequence[float], Sequence[int]] | None = None  # the peers after it, once per collective
        if c.waited_for is not None:
            arrived = order.get((c.step, c.kind, c.index)) if order is not None else None
            if arrived is None:
                late = ([math.inf], [c.waited_for])
            else:
                times, ranks = arrived
                after = bisect_right(times, times[ranks.index(rank.rank)])
                late = (times[after:], ranks[after:])
        bucket = kind_bucket(c.kind)
        for s, e, step in pieces:
            if step in per_step:
                per_step[step] += e - s
            j = index.get(step)
            if j is None or late is None or bases[j] <= 0:
                continue
            for peer, wait in split_wait(s - offset_us, e - offset_us, *late):
                kinds = pct.setdefault(peer, {})
                kinds[bucket] = kinds.get(bucket, 0.0) + 100.0 * wait / bases[j] / n
                us[peer] = us.get(peer, 0.0) + wait / n
    peer_waits = [PeerWait(peer, kind, share) for peer, kinds in pct.items() for kind, share in kinds.items()]
    late = [LatePeer(peer, sum(kinds.values()), us[peer], sorted(kinds.items(), key=lambda kv: -kv[1]))
            for peer, kinds in pct.items()]
    late.sort(key=lambda p: (-p.pct, p.peer))
    return RankWaits(per_step, peer_waits, late)


def wait_pct_per_step(rank: RankResult, waits: RankWaits) -> list[float]:
    """Per step, the exposed communication that is a wait for a late peer, % of the step (GPU: its GPU span)."""
    bases = [step_basis(s, rank.device == "gpu") for s in rank.steps]
    return [100.0 * waits.per_step_us[s.step] / b if b > 0 else 0.0 for s, b in zip(rank.steps, bases)]


def lag_us_per_step(rank: RankResult) -> dict[int, float]:
    """step -> microseconds of the rank's exposed communication after its collectives completed (:func:`lag_share`)."""
    out = {s.step: 0.0 for s in rank.steps}
    for c in rank.collectives:
        for s, e, step in lag_share(c):
            if step in out:
                out[step] += e - s
    return out


def lag_pct_per_step(rank: RankResult, lags: dict[int, float]) -> list[float]:
    """Per step, the exposed communication after completion (``lags``: :func:`lag_us_per_step`), % of the step (GPU:
    its GPU span; GPU steps without GPU events left out), as :func:`transfer_pct_per_step`."""
    if rank.device == "gpu":
        return [100.0 * lags[s.step] / s.gpu.kernel_time_us if s.gpu.kernel_time_us > 0 else 0.0
                for s in rank.steps if s.gpu is not None]
    return [s.cpu.pct(lags[s.step]) for s in rank.steps]


def transfer_pct_per_step(rank: RankResult, waits: RankWaits, lags: dict[int, float]) -> list[float]:
    """Per step, the exposed communication that is neither a wait for a late peer nor the rank's lag after the
    completion (``lags``: :func:`lag_us_per_step`), % of the step (GPU: its GPU span; GPU steps without GPU events left
    out)."""
    if rank.device == "gpu":
        return [100.0 * max(0.0, s.gpu.exposed_comm_us - waits.per_step_us[s.step] - lags[s.step])
                / s.gpu.kernel_time_us if s.gpu.kernel_time_us > 0 else 0.0 for s in rank.steps if s.gpu is not None]
    return [s.cpu.pct(max(0.0, s.cpu.communication_us - waits.per_step_us[s.step] - lags[s.step]))
            for s in rank.steps]


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
