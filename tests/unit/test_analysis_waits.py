"""Exposed communication counted once and split into waiting for a late peer and the collective itself; a waiting
rank is not communication-bound; the slow rank's phase, lateness and its peers' waits as one finding, first.

Hand-written 2-rank gloo traces give exact numbers: rank 1's data loading takes 50 ms longer in every step, so it
reaches the step's first collective (the Trainer's all-gather of the token count) 50 ms after rank 0, which waits
there; the gradient all-reduce then runs on two gloo worker threads whose spans overlap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_summary
from hf_distprof.analysis.rank.exposure import share_exposure
from hf_distprof.analysis.results.rank import Collective

MAIN, GLOO_A, GLOO_B = 1, 2, 3
STEP_US = 200_000.0
STEPS = 3
LATE_US = 50_000.0


def _span(name: str, ts: float, end: float, tid: int = MAIN, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": end - ts}


def rank_trace(path: Path, rank: int) -> Path:
    """Steps 8-10 of 200 ms. Rank 0 loads for 10 ms, rank 1 for 60 ms; both then enqueue an all-gather (rank 0 waits
    in it until rank 1 arrives, 50 ms, plus 1.9 ms of transfer), compute 80 ms, and all-reduce in two gloo spans on
    two worker threads, [t, t+30] and [t+10, t+40] ms after the compute, which the main thread waits for (40 ms of
    wall time, 60 ms of spans)."""
    events = []
    for k in range(STEPS):
        t0 = k * STEP_US
        load = 10_000.0 + (LATE_US if rank == 1 else 0.0)
        arrive = t0 + load  # rank 0: t0 + 10 ms; rank 1: t0 + 60 ms
        gathered = t0 + 10_000.0 + LATE_US + 2_000.0  # both leave the all-gather when rank 1 is in and 2 ms pass
        compute_end = gathered + 80_000.0
        events += [
            _span(f"ProfilerStep#{k + 8}", t0, t0 + STEP_US),
            _span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, arrive),
            _span("c10d::_allgather_base_", arrive, arrive + 100.0, cat="cpu_op"),
            _span("gloo:all_gather", arrive + 100.0, gathered, GLOO_A),
            _span("aten::mm", gathered, compute_end, cat="cpu_op"),
            _span("c10d::allreduce_", compute_end, compute_end + 100.0, cat="cpu_op"),
            _span("c10d::allreduce_", compute_end + 200.0, compute_end + 300.0, cat="cpu_op"),
            _span("gloo:all_reduce", compute_end + 100.0, compute_end + 30_000.0, GLOO_A),
            _span("gloo:all_reduce", compute_end + 10_000.0, compute_end + 40_000.0, GLOO_B),
            _span("aten::add_", compute_end + 40_000.0, t0 + STEP_US - 1_000.0, cat="cpu_op"),
        ]
    info = {"rank": rank, "world_size": 2, "backend": "gloo"}
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": info}))
    return path


def two_ranks(tmp_path: Path) -> list[Path]:
    return [rank_trace(tmp_path / f"rank-{r}.json", r) for r in (0, 1)]


def test_overlapping_collectives_are_counted_once_and_the_kinds_add_up_to_the_headline(tmp_path: Path) -> None:
    result = analyze_paths(two_ranks(tmp_path), AnalysisOptions(workers=1))
    rank0 = result.ranks[0]
    rows = {row.kind: row for row in rank0.comm_by_kind}
    # The two all-reduce spans (29.9 + 30 ms) cover 39.9 ms of wall time: busy and exposed count that once; the
    # enqueues (0.1 + 0.1 ms, and the 0.1 ms gap between them while the first is in flight) belong to their kind.
    assert rows["all_reduce"].time_us == pytest.approx(40_000.0)
    assert rows["all_reduce"].exposed_us == pytest.approx(40_000.0)
    assert rows["all_gather"].exposed_us == pytest.approx(52_000.0)  # 0.1 enqueue + 51.9 in flight
    steps = {s.step: s.cpu for s in rank0.steps}
    assert all(c.communication_us == pytest.approx(92_000.0) for c in steps.values())
    assert sum(row.exposed_pct for row in rank0.comm_by_kind) == pytest.approx(rank0.exposed_comm_pct) == 46.0
    for rank in result.ranks:
        assert sum(row.exposed_pct for row in rank.comm_by_kind) == pytest.approx(rank.exposed_comm_pct)
    assert sum(row.exposed_pct for row in result.comm_by_kind) == pytest.approx(result.exposed_comm_pct)


def test_the_wait_for_a_late_peer_is_split_from_the_transfer(tmp_path: Path) -> None:
    result = analyze_paths(two_ranks(tmp_path), AnalysisOptions(workers=1))
    gather0 = next(row for row in result.ranks[0].comm_by_kind if row.kind == "all_gather")
    # Rank 0 reaches the all-gather at 10.1 ms, rank 1 at 60.1 ms: 50 ms of waiting, then 1.9 ms of transfer (and the
    # 0.1 ms enqueue before its span).
    assert gather0.wait_us == pytest.approx(LATE_US) and gather0.waited_for == [1]
    assert gather0.wait_pct == pytest.approx(25.0) and gather0.transfer_us == pytest.approx(2_000.0)
    gather1 = next(row for row in result.ranks[1].comm_by_kind if row.kind == "all_gather")
    assert gather1.wait_us == 0.0 and gather1.waited_for == []  # the late rank waits for nobody
    text = format_summary(result)
    assert "rank 0's late-peer wait: 25.0% of its step (for rank 1 25.0%)" in text
    assert "exposed %step per rank (its rows added up; the headline's figure): rank 0 46.0%, rank 1 21.0%" in text


def test_a_waiting_rank_is_not_communication_bound_and_the_chain_comes_first(tmp_path: Path) -> None:
    files = two_ranks(tmp_path)
    # Rank 0's exposed communication is 46% of its step, above 30%, but 25% of it waits for rank 1: the transfers
    # (21%) are not communication-bound. At a 20% threshold the transfers are, and the evidence leaves the wait out.
    result = analyze_paths(files, AnalysisOptions(workers=1))
    kinds = [f.kind for f in result.findings]
    assert "communication_bound" not in kinds
    strict = analyze_paths(files, AnalysisOptions(workers=1, comm_bound_pct=20.0))
    bound = next(f for f in strict.findings if f.kind == "communication_bound")
    assert bound.ranks == [0, 1] and bound.numbers["worst_rank_transfer_pct"] == pytest.approx(21.0)
    assert "of rank 0's 46.0% exposed, 25.0% is a wait for a late peer (rank 1), left out" in bound.evidence


def test_the_chain_names_the_timers_phase_over_the_run(tmp_path: Path) -> None:
    files = two_ranks(tmp_path)
    # The step timer's records beside the traces: 16 untraced steps, rank 1's data loading 50 ms longer in each.
    for rank in (0, 1):
        rows = []
        for step in range(1, 22):
            data = 0.010 + (0.05 if rank == 1 else 0.0) + 0.0001 * (step % 3)
            rows.append({"step": step, "step_s": 0.2, "data_s": data, "data_load_s": data, "forward_s": 0.04,
                         "backward_compute_s": 0.06, "optimizer_s": 0.001, "cpu_wait_s": 0.0,
                         "own_work_s": data + 0.1, "warmup": step == 1, "traced": 6 <= step <= 10})
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = analyze_paths(files, AnalysisOptions(workers=1))
    chain = next(f for f in result.findings if f.kind == "slow_rank")
    # First among the diagnosis's findings (the what-if replay's "what to fix first", when there is one, opens them).
    assert [f.kind for f in result.findings if f.kind != "what_to_fix_first"][0] == "slow_rank"
    assert (chain.kind, chain.ranks) == ("slow_rank", [1])
    assert chain.title == "Rank 1 holds the others back: its data loading"
    assert chain.numbers["phase_excess_ms"] == pytest.approx(50.0)
    assert chain.evidence.startswith(
        "data loading takes 50.0 ms more per step than on its peers, who wait 25.0% of their step for it at the "
        "collectives in the traced steps: rank 1's data loading exceeds its peers' by 50.00 ms per step (the step "
        "timer, the middle half of 15 "
        "untraced steps), so it reaches each step's collectives 50.00 ms (25.0% of its 200.00 ms step) after the "
        "earliest rank, "
        "and the others wait for it there (from their arrival at the same collective to its, clocks aligned): rank 0 "
        "waits 25.0% of its step at all_gather for rank 1; data loading is 30.0% of rank 1's step (median over the "
        "traced steps). straggler verdict: ")
    assert "over the run's 15 untraced steps the step timer says" in chain.evidence  # 3 traced steps decide with it
    assert chain.recommendation.startswith("Rank 1: its input pipeline is the bottleneck")
    # Its straggler, imbalance and data-loading findings are this one finding.
    assert {"straggler", "imbalance", "data_loading_bound", "communication_bound"}.isdisjoint(
        f.kind for f in result.findings)


def test_share_exposure_gives_each_moment_to_the_earliest_collective_in_flight() -> None:
    a = Collective(step=1, kind="all_reduce", index=0, start_us=0.0, end_us=30.0, issued_us=0.0)
    b = Collective(step=1, kind="all_reduce", index=1, start_us=10.0, end_us=40.0, issued_us=10.0)
    c = Collective(step=1, kind="all_gather", index=0, start_us=60.0, end_us=70.0, issued_us=55.0)
    # Exposed: [5, 35] (both in flight from 10 to 30), [50, 58] (c's enqueue, nothing in flight), [65, 80].
    share_exposure([b, c, a], [(1, [(5.0, 35.0), (50.0, 58.0), (65.0, 80.0)])])
    assert a.exposed_share == [(5.0, 30.0, 1)]
    assert b.exposed_share == [(30.0, 35.0, 1)]
    assert c.exposed_share == [(50.0, 58.0, 1), (65.0, 70.0, 1), (70.0, 80.0, 1)]  # nearest issued after its end
    assert sum(x.exposed_share_us for x in (a, b, c)) == 30.0 + 8.0 + 15.0


def test_a_wait_for_several_late_peers_is_split_among_those_not_arrived_yet() -> None:
    # The wait's Shapley value (the airport game): each moment in equal parts to the peers still missing. A trial on the
    # shared 8-GPU traces: ranks 2 and 6 arrive 0.5 ms before rank 7, 7 ms after the waiting rank; all 7.6 ms went to
    # rank 7, whose arriving on time would have saved 0.5 ms.
    from hf_distprof.analysis.across.comm import split_wait

    got = dict(split_wait(0.0, 7.6, [7.1, 7.1, 7.6], [2, 6, 7]))
    assert got == pytest.approx({2: 7.1 / 3, 6: 7.1 / 3, 7: 7.1 / 3 + 0.5})
    assert sum(got.values()) == pytest.approx(7.6)
    # One late peer: all of it. A piece of the wait after a peer arrived: not that peer's.
    assert split_wait(1.0, 3.0, [3.0], [4]) == [(4, 2.0)]
    assert dict(split_wait(2.0, 4.0, [1.5, 3.0, 4.0], [1, 2, 3])) == pytest.approx({2: 0.5, 3: 1.5})
    # A piece that ends before the last arrival (the rank's own exposed part ends there): the missing peers share it.
    assert dict(split_wait(0.0, 2.0, [1.0, 5.0], [1, 2])) == pytest.approx({1: 0.5, 2: 1.5})
