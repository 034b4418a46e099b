"""Collective bandwidth (pure): per kind, group size and message size, how fast the data moved.

Definitions are nccl-tests' (``PERFORMANCE.md`` of NVIDIA/nccl-tests), so the numbers compare with what
``all_reduce_perf`` and friends print for the same fabric:

- size S: the buffer of an all_reduce, broadcast, reduce, all_to_all, send or recv; the gathered output of
  an all_gather; the input of a reduce_scatter (:func:`message_bytes`).
- algbw = S / t, in GB/s (1e9 bytes per second).
- busbw = algbw x a factor of the kind and the group size n: 2(n-1)/n for all_reduce, (n-1)/n for
  all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce, send and recv
  (:data:`BUS_FACTORS`). It is what each rank's link carries, so it compares with the link's speed
  whatever n is.

A collective's time in a trace starts when this rank arrives, not when the last rank does, so a rank
that arrives early waits inside it and its algbw understates the fabric. With two or more ranks each
collective found on every rank (:func:`hf_distprof.analysis.cross_rank.match_collectives`) is split, on
clocks aligned by :func:`hf_distprof.analysis.cross_rank.clock_offsets`, into *waiting*: the last rank's
arrival minus this rank's, clipped to [0, duration]; and *transfer*: the rest. Bandwidth over the transfer
time is the honest one: what the fabric delivered once everybody was there.
"""

from __future__ import annotations

from collections.abc import Callable

from hf_distprof.analysis.cross_rank import CollectiveKey, clock_offsets, match_collectives
from hf_distprof.analysis.model import BandwidthStat, Collective, RankResult

# nccl-tests' busbw / algbw, as a function of the group size n.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
# Message-size buckets are powers of this: [4^k, 4^(k+1)) bytes.
BUCKET_BASE = 4
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def message_bytes(kind: str, in_bytes: int | None, out_bytes: int | None, group_size: int | None) -> int | None:
    """A collective's size S as nccl-tests define it, from what the trace recorded.

    Args:
        kind: The collective's kind (``all_gather`` ...).
        in_bytes: Bytes of its input on this rank, if recorded.
        out_bytes: Bytes of its output on this rank, if recorded.
        group_size: Ranks in its group; derives an all_gather's output from its input, or a
            reduce_scatter's input from its output, when only one side is recorded.

    Returns:
        S in bytes, or None when the recorded side cannot give it.
    """
    if kind == "all_gather":
        if out_bytes is not None:
            return out_bytes
        return in_bytes * group_size if in_bytes is not None and group_size else None
    if kind == "reduce_scatter":
        if in_bytes is not None:
            return in_bytes
        return out_bytes * group_size if out_bytes is not None and group_size else None
    return in_bytes if in_bytes is not None else out_bytes


def bus_factor(kind: str, group_size: int | None) -> float | None:
    """nccl-tests' busbw / algbw for ``kind`` in a group of ``group_size``; None when either is unknown."""
    factor = BUS_FACTORS.get(kind)
    if factor is None or not group_size or group_size < 1:
        return None
    return factor(group_size)


def size_bucket(size: int) -> tuple[int, int, str]:
    """The bucket of a message size: (low, high, label), low <= size < high, like (1 MiB, 4 MiB, "1-4 MiB").

    Sizes below one byte (0) go to [0, 1).
    """
    if size < 1:
        return 0, 1, "0 B"
    k = 0
    while BUCKET_BASE ** (k + 1) <= size:
        k += 1
    low, high = BUCKET_BASE**k, BUCKET_BASE ** (k + 1)
    low_num, low_unit = _human(low)
    high_num, high_unit = _human(high)
    if low_unit == high_unit:
        return low, high, f"{low_num}-{high_num} {high_unit}"
    return low, high, f"{low_num} {low_unit}-{high_num} {high_unit}"


def _human(size: int) -> tuple[int, str]:
    """A power of 4 in the largest binary unit that keeps it an integer of at least 1."""
    unit = 0
    while unit + 1 < len(_UNITS) and size >= 1024 ** (unit + 1):
        unit += 1
    return size // 1024**unit, _UNITS[unit]


def wait_split(ranks: list[RankResult]) -> dict[tuple[int, CollectiveKey], float]:
    """Waiting time of every collective found on every rank: (rank, key) -> microseconds.

    The wait is the last rank's arrival (its start, on the first rank's clock) minus this rank's, clipped
    to [0, the collective's duration on this rank]; the rest of the duration is transfer.

    Args:
        ranks: Per-rank results, sorted by rank.

    Returns:
        The waits; empty with fewer than two ranks, where nobody can be waited for.
    """
    if len(ranks) < 2:
        return {}
    matched = match_collectives(ranks)
    offsets = clock_offsets(ranks, matched)
    out: dict[tuple[int, CollectiveKey], float] = {}
    for key, same in matched.items():
        arrivals = {rank: c.start_us - offsets[rank] for rank, c in same.items()}
        last = max(arrivals.values())
        for rank, c in same.items():
            out[(rank, key)] = min(max(last - arrivals[rank], 0.0), c.duration_us)
    return out


def _gbps(size: float, time_us: float) -> float | None:
    # bytes per microsecond is MB/s; / 1e3 gives GB/s.
    return size / time_us / 1e3 if time_us > 0 else None


def _scaled(value: float | None, factor: float | None) -> float | None:
    return value * factor if value is not None and factor is not None else None


def collective_bandwidth(ranks: list[RankResult]) -> list[BandwidthStat]:
    """Bandwidth table: one row per collective kind, group size and size bucket, over all ranks.

    Args:
        ranks: Per-rank results, sorted by rank.

    Returns:
        Rows sorted by kind, group size and size; empty when no collective has a size.
    """
    waits = wait_split(ranks)
    rows: dict[tuple[str, int, int], list[tuple[int, Collective, float | None]]] = {}
    for r in ranks:
        for c in r.collectives:
            if c.bytes is None:
                continue
            wait = waits.get((r.rank, (c.step, c.kind, c.index)))
            rows.setdefault((c.kind, c.group_size or 0, size_bucket(c.bytes)[0]), []).append((r.rank, c, wait))
    return [_row(kind, group or None, same) for (kind, group, _), same in sorted(rows.items())]


def _row(kind: str, group: int | None, same: list[tuple[int, Collective, float | None]]) -> BandwidthStat:
    """One row of the table from its (rank, collective, wait or None when unmatched)."""
    k = len({rank for rank, _, _ in same})
    size = time = moved = matched_time = wait = 0.0
    matched = 0
    for _, c, w in same:
        size += c.bytes or 0
        time += c.duration_us
        if w is not None:
            matched += 1
            moved += c.bytes or 0
            matched_time += c.duration_us
            wait += w
    factor = bus_factor(kind, group)
    algbw = _gbps(size, time)
    transfer_algbw = _gbps(moved, matched_time - wait) if matched else None
    low, high, label = size_bucket(same[0][1].bytes or 0)
    return BandwidthStat(
        kind=kind,
        group_size=group,
        bucket=label,
        bucket_low_bytes=low,
        bucket_high_bytes=high,
        ranks=k,
        count=len(same),
        count_per_rank=len(same) / k,
        mean_bytes=size / len(same),
        time_us=time / k,
        algbw_gbps=algbw,
        busbw_gbps=_scaled(algbw, factor),
        matched=matched,
        wait_us=wait / k,
        transfer_us=(matched_time - wait) / k,
        transfer_algbw_gbps=transfer_algbw,
        transfer_busbw_gbps=_scaled(transfer_algbw, factor),
    )


def unsized(ranks: list[RankResult]) -> int:
    """How many collectives, over all ranks, have no recorded size."""
    return sum(1 for r in ranks for c in r.collectives if c.bytes is None)
