"""The ranks aligned (pure): which collectives are the same one on every rank, each rank's clock against the first
rank's, and when the last rank reached each collective (what its peers waited for).

Ranks on different hosts have different clocks, so timestamps are not compared raw. A collective ends at
(nearly) the same moment on every rank, because nobody finishes before the last rank has contributed;
the offset of each rank's clock to rank ``ranks[0]`` is the median, over matched collectives, of the
difference of their end times. Ranks on one host read one clock: they share one offset (the median over all of
them), 0 on ``ranks[0]``'s host. Their ends are not always as close as that rule assumes: a gloo rank whose thread
waits for a CPU after a collective closes its span milliseconds later, which read as a clock offset once.
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.results.across import Alignment
from hf_distprof.analysis.results.rank import Collective, CollectiveKey, RankResult


def match_collectives(ranks: list[RankResult]) -> dict[CollectiveKey, dict[int, Collective]]:
    """Collectives present on every rank, keyed by (step, kind, k-th of that kind in the step)."""
    per_rank = [{(c.step, c.kind, c.index): c for c in r.collectives} for r in ranks]
    if not per_rank:
        return {}
    common = set(per_rank[0]).intersection(*per_rank[1:])
    return {key: {r.rank: table[key] for r, table in zip(ranks, per_rank)} for key in sorted(common)}


def clock_offsets(
    ranks: list[RankResult], matched: dict[CollectiveKey, dict[int, Collective]]
) -> dict[int, float]:
    """Offset (us) to subtract from each rank's timestamps to put it on the first rank's clock.

    Args:
        ranks: The ranks.
        matched: Output of :func:`match_collectives`.

    Returns:
        rank -> offset; all zero when no collective is matched.
    """
    if not ranks:
        return {}
    ref = ranks[0].rank
    # One clock per host when every trace names its host (Kineto's traces of other tools may not: then one per rank).
    named = all(r.host for r in ranks)
    group = {r.rank: (r.host if named else r.rank) for r in ranks}
    diffs: dict[object, list[float]] = {}
    for r in ranks:
        diffs.setdefault(group[r.rank], []).extend(m[r.rank].end_us - m[ref].end_us for m in matched.values())
    offset = {g: (median(d) if d and g != group[ref] else 0.0) for g, d in diffs.items()}
    return {r.rank: offset[group[r.rank]] for r in ranks}


def align(ranks: list[RankResult]) -> Alignment:
    """The ranks aligned: computed once per run, handed to every stage that compares the ranks in time (the skew and
    the straggler verdict, the late-peer waits, the bandwidth table, the what-if replay, ``merge``).

    Args:
        ranks: Per-rank results, sorted by rank.

    Returns:
        The alignment; with fewer than two ranks nothing is matched and every offset is 0.
    """
    matched = match_collectives(ranks) if len(ranks) > 1 else {}
    offsets = clock_offsets(ranks, matched)
    arrivals = {key: {rank: c.start_us - offsets[rank] for rank, c in same.items()} for key, same in matched.items()}
    return Alignment(matched, offsets, arrivals)


def last_to_arrive(arrivals: dict[int, float]) -> int:
    """The rank that reached a collective last (ties: the higher rank): the one its peers wait for, and whose time in
    it is the transfer itself. The one tie-break of every stage that asks (the waits, the what-if replay)."""
    return max(arrivals, key=lambda rank: (arrivals[rank], rank))


def set_waits(ranks: list[RankResult], alignment: Alignment) -> None:
    """Set each matched collective's ``peers_in_us``, ``waited_for`` and ``late_peer_wait_us``: the one
    account of waiting for a late peer, which the per-kind tables, the findings and the bandwidth table read.

    A collective cannot complete before the last rank taking part reaches it, so on the ranks that reached it
    earlier the time from their arrival to that moment is a wait for a late peer, whatever the network; the rest
    is the collective itself. Arrivals are the collectives' starts, on the aligned clocks.

    Args:
        ranks: The ranks (their collectives are updated).
        alignment: :func:`align` of the same ranks.
    """
    for r in ranks:
        for c in r.collectives:
            c.peers_in_us, c.waited_for, c.late_peer_wait_us, c.done_in_us = None, None, None, None
    for key, same in alignment.matched.items():
        arrivals = alignment.arrivals[key]
        last = last_to_arrive(arrivals)
        done = max(arrivals[last], min(c.end_us - alignment.offsets[rank] for rank, c in same.items()))
        for rank, c in same.items():
            c.peers_in_us = arrivals[last] + alignment.offsets[rank]
            c.done_in_us = done + alignment.offsets[rank]
            c.waited_for = last if last != rank and arrivals[last] > arrivals[rank] else None
            c.late_peer_wait_us = min(max(arrivals[last] - arrivals[rank], 0.0), c.duration_us)
