"""The ranks aligned (pure): which collectives are the same one on every rank, each rank's clock against the first
rank's, and when the last rank reached each collective (what its peers waited for).

Ranks on different hosts have different clocks, so timestamps are not compared raw. Ranks on one host read one
clock: they share one offset (0 on ``ranks[0]``'s host). Another host's offset is the one the run manifest measured at
train start (ping-pong rounds, within microseconds) while the traces agree with it: no collective that completes
together (:data:`COMPLETES_TOGETHER`) may end on one host, beyond the measurement's uncertainty, before it started on
the other (a clock stepped since the start breaks that). Otherwise, or without a measurement: a collective ends at
(nearly) the same moment on every rank, because nobody finishes before the last rank has contributed, so the offset
is the median, over matched collectives, of the difference of their first ends on each host. On gloo that is the
rough one: a rank whose thread waits for a CPU after a collective closes its span milliseconds later (two hosts
sharing one clock read 6.5 ms apart that way in a trial, where the manifest measured 2 us).
Each trace's times count from its own ``baseTimeNanoseconds``, put on ``ranks[0]``'s first.
"""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.results.across import Alignment
from hf_distprof.analysis.results.rank import Collective, CollectiveKey, RankResult
from hf_distprof.core.files import short_host


COMPLETES_TOGETHER = frozenset({"all_reduce", "all_gather", "reduce_scatter"})
"""Kinds that end on every rank once the last has contributed: a rank that ends later lagged (its thread resuming
late). A broadcast, a gather or an uneven all-to-all may end at different times on different ranks by design."""


def match_collectives(ranks: list[RankResult]) -> dict[CollectiveKey, dict[int, Collective]]:
    """Collectives present on every rank, keyed by (step, kind, k-th of that kind in the step)."""
    per_rank = [{(c.step, c.kind, c.index): c for c in r.collectives} for r in ranks]
    if not per_rank:
        return {}
    common = set(per_rank[0]).intersection(*per_rank[1:])
    return {key: {r.rank: table[key] for r, table in zip(ranks, per_rank)} for key in sorted(common)}


def clock_offsets(
    ranks: list[RankResult], matched: dict[CollectiveKey, dict[int, Collective]],
    measured: dict[int, tuple[float, float, str]] | None = None,
) -> dict[int, float]:
    """Offset (us) to subtract from each rank's timestamps to put it on the first rank's clock.

    Args:
        ranks: The ranks.
        matched: Output of :func:`match_collectives`.
        measured: The run manifest's clocks: rank -> (its clock minus rank 0's, the measurement's uncertainty, in us;
            its host), used for a rank whose trace names the same host (a manifest of another attempt on other nodes
            is not these traces' clocks).

    Returns:
        rank -> offset; all zero when no collective is matched and nothing was measured.
    """
    if not ranks:
        return {}
    ref = ranks[0]
    # Each trace's times count from its own baseTimeNanoseconds: on ranks[0]'s base first.
    shift = {r.rank: (r.base_time_ns - ref.base_time_ns) / 1e3 for r in ranks}
    # One clock per host when every trace names its host (Kineto's traces of other tools may not: then one per rank).
    named = all(r.host for r in ranks)
    group = {r.rank: (r.host if named else r.rank) for r in ranks}
    members: dict[object, list[int]] = {}
    for r in ranks:
        members.setdefault(group[r.rank], []).append(r.rank)
    home = group[ref.rank]

    def first_end(m: dict[int, Collective], ranks_of: list[int]) -> float:
        """The first end among one host's ranks: a rank that resumes late on a shared host does not move it."""
        return min(m[k].end_us + shift[k] for k in ranks_of)

    skew = {g: (median([first_end(m, ranks_of) - first_end(m, members[home]) for m in matched.values()])
                if matched and g != home else 0.0) for g, ranks_of in members.items()}
    for g, ranks_of in members.items():
        both = [*ranks_of, *members[home]]
        if g == home or not named or not measured or any(k not in measured or measured[k][2] != short_host(
                str(group[k])) for k in both):
            continue
        offset = measured[ranks_of[0]][0] - measured[members[home][0]][0]
        slack = measured[ranks_of[0]][1] + measured[members[home][0]][1]
        if _causal(matched, ranks_of, members[home], shift, offset, slack):
            skew[g] = offset
    return {r.rank: skew[group[r.rank]] - shift[r.rank] for r in ranks}


def _causal(matched: dict[CollectiveKey, dict[int, Collective]], theirs: list[int], ours: list[int],
            shift: dict[int, float], offset: float, slack: float) -> bool:
    """Whether ``offset`` (their host's clock minus ours) keeps, within ``slack``, every collective that completes
    together from ending on one host before it started on the other. A collective whose group is smaller than the
    ranks matched is not one collective of them all (HSDP, 2-D parallelism: one key, several groups): not weighed."""
    for same in matched.values():
        first = next(iter(same.values()))
        if first.kind not in COMPLETES_TOGETHER or any(c.group_size is not None and c.group_size < len(same)
                                                       for c in same.values()):
            continue
        a_start = max(same[k].start_us + shift[k] for k in ours)
        a_end = min(same[k].end_us + shift[k] for k in ours)
        b_start = max(same[k].start_us + shift[k] for k in theirs) - offset
        b_end = min(same[k].end_us + shift[k] for k in theirs) - offset
        if b_end < a_start - slack or a_end < b_start - slack:
            return False
    return True


def align(ranks: list[RankResult], measured: dict[int, tuple[float, float, str]] | None = None) -> Alignment:
    """The ranks aligned: computed once per run, handed to every stage that compares the ranks in time (the skew and
    the straggler verdict, the late-peer waits, the bandwidth table, the what-if replay, ``merge``).

    Args:
        ranks: Per-rank results, sorted by rank.
        measured: The run manifest's clock offsets (:func:`clock_offsets`).

    Returns:
        The alignment; with fewer than two ranks nothing is matched and every offset is 0.
    """
    matched = match_collectives(ranks) if len(ranks) > 1 else {}
    offsets = clock_offsets(ranks, matched, measured)
    arrivals = {key: {rank: c.start_us - offsets[rank] for rank, c in same.items()} for key, same in matched.items()}
    return Alignment(matched, offsets, arrivals)


def completion(same: dict[int, Collective], offsets: dict[int, float], last_arrival: float, last: int) -> float | None:
    """When a collective of a kind that completes together (:data:`COMPLETES_TOGETHER`) completed, on the first rank's
    clock: its first rank's end; the last rank's own end where the clocks disagree (the first end before the last
    arrival). None for other kinds."""
    c = same[last]
    if c.kind not in COMPLETES_TOGETHER:
        return None
    first = min(other.end_us - offsets.get(rank, 0.0) for rank, other in same.items())
    return first if first >= last_arrival else last_arrival + c.end_us - c.start_us


def last_to_arrive(arrivals: dict[int, float]) -> int:
    """The rank that reached a collective last (ties: the higher rank): the one its peers wait for, and whose time in
    it is the transfer itself. The one tie-break of every stage that asks (the waits, the what-if replay)."""
    return max(arrivals, key=lambda rank: (arrivals[rank], rank))


def arrival_order(alignment: Alignment) -> dict[CollectiveKey, tuple[list[float], list[int]]]:
    """Each matched collective's arrivals in order, as (times on the first rank's clock, ranks), earliest first: whom a
    rank waited for there are those after it (:func:`hf_distprof.analysis.across.comm.rank_waits`). One list per
    collective, shared by its ranks."""
    out = {}
    for key, arrivals in alignment.arrivals.items():
        order = sorted((t, r) for r, t in arrivals.items())
        out[key] = ([t for t, _ in order], [r for _, r in order])
    return out


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
        done = completion(same, alignment.offsets, arrivals[last], last)
        for rank, c in same.items():
            c.peers_in_us = arrivals[last] + alignment.offsets[rank]
            c.done_in_us = done + alignment.offsets[rank] if done is not None else None
            c.waited_for = last if last != rank and arrivals[last] > arrivals[rank] else None
            c.late_peer_wait_us = min(max(arrivals[last] - arrivals[rank], 0.0), c.duration_us)
