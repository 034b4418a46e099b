"""The across stage's front (pure): every figure that needs the ranks together, computed once, in order.

1. the ranks on one clock (:mod:`~hf_distprof.analysis.across.align`) and each matched collective's wait for a late
   peer;
2. per rank, the per-kind table and who it waits for (:mod:`~hf_distprof.analysis.across.comm`);
3. the step timer's records as figures, and the run's evidence beyond the window
   (:mod:`~hf_distprof.analysis.across.evidence`);
4. the skew the slow-rank verdicts judge (:mod:`~hf_distprof.analysis.across.skew`), the phase of each rank's step
   that exceeds its peers';
5. the tables over the ranks: per kind, per FSDP unit, bandwidth, and against a reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_distprof.analysis.across import bandwidth, comm, evidence
from hf_distprof.analysis.across.align import align, arrival_order, set_waits
from hf_distprof.analysis.across.reference import compare_to_reference, totals
from hf_distprof.analysis.across.skew import skew
from hf_distprof.analysis.results.across import Across, ReferencePoint, RunEvidence, Skew
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.run import RunInput
from hf_distprof.core.verdicts import candidate


def compare(ranks: list[RankResult], run: RunInput, reference: Sequence[ReferencePoint] | None = None) -> Across:
    """Every cross-rank figure of the run.

    Args:
        ranks: One result per rank, sorted by rank; their collectives' waits, per-kind tables and peer waits are set
            here.
        run: What was read beside the traces (the step timer's records).
        reference: Bandwidths measured by ``hf-distprof bench-collectives``; the bandwidth rows are set against them.

    Returns:
        The figures.
    """
    clocks = run.run.clocks if run.run is not None else []
    alignment = align(ranks, {c.rank: (c.offset_us, c.uncertainty_us or 0.0, c.host) for c in clocks
                              if c.offset_us is not None})
    set_waits(ranks, alignment)
    traced = {s.step for r in ranks for s in r.steps}
    common = sorted(set.intersection(*({s.step for s in r.steps} for r in ranks))) if ranks else []
    exposed: dict[int, dict[str, list[float]]] = {}
    waits: dict[int, comm.RankWaits] = {}
    order = arrival_order(alignment)
    for r in ranks:
        pieces = [comm.wait_share(c) for c in r.collectives]  # each collective's wait for a late peer, once
        waits[r.rank] = comm.rank_waits(r, pieces, order, alignment.offsets.get(r.rank, 0.0))
        r.comm_by_kind, exposed[r.rank] = comm.by_kind(r.steps, r.collectives, r.device == "gpu", pieces,
                                                       waits[r.rank].late_peers)
        r.peer_waits = waits[r.rank].peer_waits
    lags = {r.rank: comm.lag_us_per_step(r) for r in ranks}  # each rank's time in its collectives past completion
    timer = evidence.timer_figures(run.records, traced)
    several = len(ranks) > 1
    # The step timer's records of 2+ ranks are the run's evidence, also beside one rank's trace (--profile-ranks).
    timed = len(timer.own_work) > 1
    run_evidence = evidence.run_evidence(timer) if several or timed else None
    skewed = skew(ranks, alignment, timer) if several else None
    rows = bandwidth.collective_bandwidth(ranks)
    against = compare_to_reference(rows, list(reference)) if reference else []
    return Across(
        alignment=alignment,
        traced=traced,
        common_steps=common,
        timer=timer,
        evidence=run_evidence,
        skew=skewed,
        comm_by_kind=comm.mean_by_kind(ranks),
        comm_by_module=comm.by_module(ranks),
        wait_pct_per_step={r.rank: comm.wait_pct_per_step(r, waits[r.rank]) for r in ranks},
        transfer_pct_per_step={r.rank: comm.transfer_pct_per_step(r, waits[r.rank], lags[r.rank]) for r in ranks},
        lag_pct_per_step={r.rank: comm.lag_pct_per_step(r, lags[r.rank]) for r in ranks},
        exposed_pct_per_step=exposed,
        late_peers={rank: w.late_peers for rank, w in waits.items()},
        phase_excess=evidence.phase_excess(ranks, timer, common) if several or timed else {},
        pace=_pace(run_evidence, skewed),
        bandwidth=rows,
        unsized_collectives=bandwidth.unsized(ranks),
        bandwidth_reference=against,
        reference_totals=totals(against) if against else None,
    )


def _pace(run: RunEvidence | None, skewed: Skew | None) -> tuple[int | None, int | None]:
    """The slowest and fastest rank for the what-if's rank-pace scenarios: the run's (the step timer's own work over
    its judged steps), else the rank latest at the traced steps' collectives (the straggler verdict's candidate)."""
    if run is not None:
        return run.slowest_rank, run.fastest_rank
    late = candidate(skewed.lateness, skewed.lateness_scale) if skewed is not None else None
    return (late.rank if late is not None else None), None
