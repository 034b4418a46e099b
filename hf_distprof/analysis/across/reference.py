"""Collective bandwidth against a reference (pure): time lost to a slow network versus to a late peer.

``hf-distprof bench-collectives`` measures what the fabric delivers, per collective kind and size, with
nobody late; ``analyze --bandwidth-ref FILE`` reads that CSV (the CLI does the reading) into
:class:`ReferencePoint` s. Each row of the trace's bandwidth table
(:func:`hf_distprof.analysis.across.bandwidth.collective_bandwidth`) already splits its time into waiting for the
last rank (a late peer) and transfer; here the transfer time is set against the time the same bytes would
have taken at the reference busbw of the nearest size of the same kind. What is left over is time lost to a
network slower than the benchmark's. busbw, not algbw, is compared, so a reference measured on another
number of ranks still applies (busbw is what one rank's link carries, whatever n).
"""

from __future__ import annotations

import math

from hf_distprof.analysis.results.across import BandwidthStat, BandwidthVsReference, ReferencePoint, ReferenceTotals


def nearest_reference(points: list[ReferencePoint], kind: str, size: float,
                      group_size: int | None = None) -> ReferencePoint | None:
    """The point of ``kind`` whose size is nearest to ``size`` in ratio (on a log scale).

    Points measured on ``group_size`` ranks are preferred when there are any. Points without a positive
    busbw are ignored (a world of one has a busbw of 0 for everything but broadcast).

    Returns:
        The point, or None when no usable point has that kind (or the size is not positive).
    """
    usable = [p for p in points if p.kind == kind and p.busbw_gbps > 0 and p.bytes > 0]
    same_n = [p for p in usable if p.world_size == group_size]
    usable = same_n or usable
    if not usable or size <= 0:
        return None
    return min(usable, key=lambda p: (abs(math.log(p.bytes / size)), p.bytes))


def compare_row(row: BandwidthStat, ref: ReferencePoint) -> BandwidthVsReference | None:
    """One bandwidth row against its reference point.

    The transfer part of the matched collectives is compared when the wait could be measured (two or more
    ranks); otherwise the whole time, waits included.

    Returns:
        The comparison, or None when the row has no busbw (a kind without an nccl-tests factor, no time).
    """
    if row.matched and row.transfer_busbw_gbps:
        basis, busbw, time_us, late = "transfer", row.transfer_busbw_gbps, row.transfer_us, row.wait_us
    elif not row.matched and row.busbw_gbps:
        basis, busbw, time_us, late = "whole", row.busbw_gbps, row.time_us, None
    else:
        return None
    at_ref = time_us * busbw / ref.busbw_gbps
    return BandwidthVsReference(
        kind=row.kind,
        group_size=row.group_size,
        bucket=row.bucket,
        mean_bytes=row.mean_bytes,
        ref_bytes=ref.bytes,
        ref_world_size=ref.world_size,
        ref_busbw_gbps=ref.busbw_gbps,
        basis=basis,
        busbw_gbps=busbw,
        time_us=time_us,
        at_ref_us=at_ref,
        slow_network_us=max(time_us - at_ref, 0.0),
        late_peer_us=late,
    )


def compare_to_reference(rows: list[BandwidthStat], points: list[ReferencePoint]) -> list[BandwidthVsReference]:
    """Every bandwidth row that has a reference of its kind, compared with it (in the rows' order)."""
    out = []
    for row in rows:
        ref = nearest_reference(points, row.kind, row.mean_bytes, row.group_size)
        compared = compare_row(row, ref) if ref is not None else None
        if compared is not None:
            out.append(compared)
    return out


def totals(rows: list[BandwidthVsReference]) -> ReferenceTotals:
    """Per rank, over the rows: the compared time, the same at reference speed, lost to a slow network, waited for a
    late peer (us)."""
    return ReferenceTotals(sum(r.time_us for r in rows), sum(r.at_ref_us for r in rows),
                           sum(r.slow_network_us for r in rows), sum(r.late_peer_us or 0.0 for r in rows),
                           waits_separated=any(r.late_peer_us is not None for r in rows))
