"""Clock synchronisation: one clock's offset from another's, from NTP-style ping-pongs (pure, torch-free).

Both measurements of the package use it: ``hf-distprof doctor``'s clock-skew check (seconds, one reading on the
peer) and the run manifest's per-host offsets (nanoseconds, the peer's receive and reply times).
"""

from __future__ import annotations

from collections.abc import Sequence


def ntp_offset(samples: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """The offset of a peer's clock from the reference's, from ping-pong rounds ``(t0, t1, t2, t3)``.

    ``t0``: the reference sends, ``t1``: the peer receives, ``t2``: the peer replies, ``t3``: the reference
    receives (``t0``/``t3`` on the reference's clock, ``t1``/``t2`` on the peer's; a peer that reads its clock
    once passes that reading as both). The round with the shortest trip is the least disturbed by queueing; with
    it, the peer's clock minus the reference's is ``((t1 - t0) + (t2 - t3)) / 2``, exact when both legs took the
    same time and off by at most half the trip otherwise. Any unit, as long as all four share it.

    Args:
        samples: The rounds, in any order.

    Returns:
        ``(offset, round_trip)``: the offset is positive when the peer's clock is ahead; the round trip (the
        time on the wire, the peer's own time left out) bounds its error at half.

    Raises:
        ValueError: No sample.
    """
    if not samples:
        raise ValueError("no ping-pong round to estimate a clock offset from")
    t0, t1, t2, t3 = min(samples, key=lambda s: (s[3] - s[0]) - (s[2] - s[1]))
    return ((t1 - t0) + (t2 - t3)) / 2, (t3 - t0) - (t2 - t1)
