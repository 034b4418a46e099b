"""Collective bandwidth (pure): per kind, group size and message size, how fast the data moved.

Definitions are nccl-tests' (``PERFORMANCE.md`` of NVIDIA/nccl-tests), so the numbers compare with what
``all_reduce_perf`` and friends print for the same fabric:

- size S: the buffer of an all_reduce, broadcast, reduce, all_to_all, send or recv; the gathered output of
  an all_gather; the input of a reduce_scatter (:func:`hf_distprof.analysis.read.message_sizes.message_bytes`).
- algbw = S / t, in GB/s (1e9 bytes per second).
- busbw = algbw x a factor of the kind and the group size n: 2(n-1)/n for all_reduce, (n-1)/n for
  all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce, send and recv
  (:data:`BUS_FACTORS`). It is what each rank's link carries, so it compares with the link's speed
  whatever n is.

A collective's time in a trace starts when this rank arrives, not when the last rank does, so a rank
that arrives early waits inside it and its algbw understates the fabric. With two or more ranks each
collective found on every rank is split, on the aligned clocks (:mod:`hf_distprof.analysis.across.align`), into
*waiting*: the last rank's arrival minus this rank's, clipped to [0, duration]
(:attr:`~hf_distprof.analysis.results.rank.Collective.late_peer_wait_us`); and *transfer*: the rest. Bandwidth over
the transfer time is the honest one: what the fabric delivered once everybody was there.
"""

from __future__ import annotations

from collections.abc import Callable

from hf_distprof.analysis.results.across import BandwidthStat
from hf_distprof.analysis.results.rank import Collective, RankResult

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


def _gbps(size: float, time_us: float) -> float | None:
    # bytes per microsecond is MB/s; / 1e3 gives GB/s.
    return size / time_us / 1e3 if time_us > 0 else None


def _scaled(value: float | None, factor: float | None) -> float | None:
    return value * factor if value is not None and factor is not None else None


def collective_bandwidth(ranks: list[RankResult]) -> list[BandwidthStat]:
    """Bandwidth table: one row per collective kind, group size and size bucket, over all ranks.

    Args:
        ranks: Per-rank results, sorted by rank, their late-peer waits set
            (:func:`hf_distprof.analysis.across.align.set_waits`).

    Returns:
        Rows sorted by kind, group size and size; empty when no collective has a size.
    """
    rows: dict[tuple[str, int, int], list[tuple[int, Collective, float | None]]] = {}
    for r in ranks:
        for c in r.collectives:
            if c.bytes is None:
                continue
            wait = c.late_peer_wait_us  # set by hf_distprof.analysis.across.align.set_waits
            rows.setdefault((c.kind, c.group_size or 0, size_bucket(c.bytes)[0]), []).append((r.rank, c, wait))
    return [_row(kind, group or None, same) for (kind, group, _), same in sorted(rows.items())]


def _row(kind: str, group: int | None, same: list[tuple[int, Collective, float | None]]) -> BandwidthStat:
    """One row of the table from its (rank, collective, wait or None when unmatched)."""
    k = len({rank for rank, _, _ in same})
    size = time = moved = matched_time = wait = lag = 0.0
    matched = 0
    for _, c, w in same:
        size += c.bytes or 0
        time += c.duration_us
        if w is not None:
            matched += 1
            moved += c.bytes or 0
            matched_time += c.duration_us
            wait += w
            if c.done_in_us is not None:  # its time past the completion (the thread resuming late) moves no bytes
                lag += min(max(0.0, c.end_us - max(c.done_in_us, c.start_us)), c.duration_us - w)
    factor = bus_factor(kind, group)
    algbw = _gbps(size, time)
    transfer_algbw = _gbps(moved, matched_time - wait - lag) if matched else None
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
        transfer_us=(matched_time - wait - lag) / k,
        transfer_algbw_gbps=transfer_algbw,
        transfer_busbw_gbps=_scaled(transfer_algbw, factor),
    )


def unsized(ranks: list[RankResult]) -> int:
    """How many collectives, over all ranks, have no recorded size."""
    return sum(1 for r in ranks for c in r.collectives if c.bytes is None)
