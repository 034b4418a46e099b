"""Whether the traces hold the waits that matter (pure): with ``--profile-ranks`` some ranks take no window, and the
ranks traced wait for them inside their collectives, which no trace measures; that wait would read as the transfer.

The step timer's verdict over the run (every rank's records) says whether it matters. Quiet (no rank holds the others
back beyond the threshold): the traces' collectives are the run's. Raised, naming a rank traced in every window: the
others reach each collective before it, so the waits that matter are in the traces. Otherwise (the rank it names took
no window, or not that one; no verdict at all) the findings that weigh the ranks' traces against each other, and the
what-if replay, are withheld (:func:`hf_distprof.analysis.judge.slowdown.withhold_without_every_rank`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_distprof.analysis.results.facts import Coverage
from hf_distprof.analysis.results.run import WindowInfo
from hf_distprof.core.run_verdict import decided
from hf_distprof.core.verdicts import SlowRankVerdict


def unmeasured(world: Sequence[int] | None, read: set[int], missing: Sequence[int], run: SlowRankVerdict | None,
               windows: Sequence[WindowInfo] = ()) -> Coverage | None:
    """Why the traces may miss waits that matter; None when they hold them.

    Args:
        world: Every rank of the run (None when unknown: nothing is said).
        read: The ranks whose traces were read.
        missing: The ranks whose traces were expected and not read (lost files: said apart).
        run: The step timer's verdict over the run (None without its records).
        windows: The manifest's windows, each with the ranks it traced.
    """
    if not read:
        return None
    absent = [r for r in world or [] if r not in read and r not in missing]
    if decided(run) and run is not None and not run.raised:
        return None  # no rank holds the others back over the run
    slow = run.rank if decided(run) and run is not None else None
    if slow is None:
        return Coverage(absent, None, []) if absent else None
    if slow in missing:
        return None  # its trace was lost, not left out: the lost file is the reason said
    if slow not in read:
        return Coverage(absent, slow, [])
    size = len(world) if world else len(read)
    without = [(w.first, w.last) for w in windows if slow not in w.ranks and len(w.ranks) < size]
    return Coverage([], slow, without) if without else None
