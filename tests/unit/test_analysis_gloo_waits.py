"""How the what-if model binds a CPU (gloo) rank's waits to the collectives it waited for.

Two shapes of real gloo traces that the model used to count as local work (so that a faster peer could not shorten
them, and "rank 1 at its peers' pace" predicted a fraction of the saving):

- the training thread resumes a little *before* the gloo span records its end: the worker wakes the waiting thread,
  then closes its span (0.18 ms in tests/data/slow_rank1, rank 0's first bucket: 26 ms of waiting counted as work);
- a synchronous collective (the Trainer's per-step gather of the token count): its ``c10d::`` op does not return
  until the collective completes, so the wait is inside the op that the model took for enqueue work.

Each test builds the two ranks' traces: rank 1's loading is 20 ms longer, rank 0 waits for it at the all-reduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths
from hf_distprof.analysis.rank.timeline import ARRIVE, END, ISSUE, RELEASE, RESUME_SLACK_US, START

DATA = Path(__file__).resolve().parents[1] / "data"
MAIN, WORKER = 1, 2
OPTS = AnalysisOptions(workers=1)
LOADING_US = (1_000, 21_000)  # rank 0's, rank 1's, in every step
STEPS = 3


def _span(name: str, ts: float, end: float, tid: int = MAIN, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": end - ts}
    return {**event, "args": args} if args else event


def _events(rank: int, early_us: float, blocking: bool, after: list[tuple[float, float]], lag_us: float,
            lag_steps: range) -> list[dict[str, Any]]:
    """One rank's steps: load, 5 ms forward, issue an all-reduce, wait for it, 1 ms optimizer.

    The all-reduce completes 2 ms after the last arrival (``done``). The training thread resumes ``early_us`` before
    ``done`` (negative: after it). ``blocking``: the ``c10d::allreduce_`` op itself lasts until the thread resumes (a
    synchronous collective), with no gap after it. ``after``: small ops (start, end, from the resume) that the woken
    thread runs with gaps between them, before the optimizer. ``lag_us``: rank 0's span ends that much after the
    completion in the steps ``lag_steps`` (from 0): its thread resumes late (on a shared host, waiting for a CPU).
    """
    events = []
    t0 = 0.0
    for k in range(STEPS):
        own = LOADING_US[rank]
        issue = t0 + own + 5_000
        done = t0 + max(LOADING_US) + 5_020 + 2_000 + (lag_us if rank == 0 and k in lag_steps else 0.0)
        resume = done - early_us
        # Rank 1's optimizer takes rank 0's lag longer: both end the step together (rank 0 not late at the next one).
        end = resume + 1_000 + (lag_us if rank == 1 and k in lag_steps else 0.0)
        op_end = resume if blocking else issue + 10
        events += [
            _span(f"ProfilerStep#{k + 1}", t0, end, cat="user_annotation"),
            _span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, t0 + own,
                  cat="user_annotation"),
            _span("aten::mm", t0 + own, issue),
            _span("c10d::allreduce_", issue, op_end),
            _span("gloo:all_reduce", issue + 20, done, WORKER, cat="user_annotation",
                  **{"Input Dims": [[250_000]], "Input type": ["float"]}),
            *(_span("aten::copy_", resume + a, resume + b) for a, b in after),
            _span("aten::add_", resume + (after[-1][1] if after else 0.0), end),
        ]
        t0 = end
    return events


def _analyze(folder: Path, early_us: float = 0.0, blocking: bool = False,
             after: list[tuple[float, float]] | None = None, lag_us: float = 0.0,
             lag_steps: range = range(STEPS - 1, STEPS)) -> AnalysisResult:
    """Both ranks' traces, on one host (one clock: nothing is aligned away), analysed."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        doc = {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"}, "host_name": "node0",
               "traceEvents": _events(rank, early_us, blocking, after or [], lag_us, lag_steps)}
        (folder / f"rank-{rank}.json").write_bytes(orjson.dumps(doc))
    return analyze_paths([folder], OPTS)


def _points(result: AnalysisResult, rank: int, n: int = 5) -> list[tuple[Any, ...]]:
    tl = result.ranks[rank].timeline
    assert tl is not None
    return [(tl.kind[i], round(tl.t[i], 3), tl.pred[i], round(tl.work[i], 3), round(tl.wake[i], 3),
             tl.dep[i]) for i in range(n)]


def _predicted(result: AnalysisResult) -> dict[str, float]:
    return {s.scenario: round(s.step_ms_predicted, 3) for s in result.what_if}


# The step: rank 1 loads 21 ms, computes 5 ms, arrives 20 us after its issue, the transfer takes 2 ms, the thread
# resumes (on time: 28.02 ms), 1 ms optimizer: 29.02 ms on both ranks. Rank 1 at rank 0's pace loads 1 ms: 9.02 ms.
ON_TIME = {"no_data_loading": 8.02, "slow_rank": 9.02, "hide_communication": 27.02}


def test_a_wait_that_ends_with_its_collective_is_bound_to_it(tmp_path: Path) -> None:
    result = _analyze(tmp_path)
    assert _points(result, 0) == [
        (START, 0.0, -1, 0.0, 0.0, None),
        (ISSUE, 6_000.0, 0, 6_000.0, 0.0, None),
        (ARRIVE, 6_020.0, 1, 20.0, 0.0, None),
        (RELEASE, 28_020.0, 1, 20.0, 0.0, (1, "all_reduce", 0)),  # the enqueue, then the wait from the arrival
        (END, 29_020.0, 3, 1_000.0, 0.0, None),
    ]
    assert _predicted(result) == ON_TIME
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)


def test_a_thread_woken_before_the_span_records_its_end_waited_for_that_collective(tmp_path: Path) -> None:
    # The thread resumes 180 us before the span's end (slow_rank1's rank 0): the wait is still the collective's, with
    # a wake of -180 us, and the replay gives back every step (28.84 ms); the scenarios predict what they do on time,
    # less the 180 us, but with the transfer hidden a thread is not released before its own arrival (26.02 ms).
    result = _analyze(tmp_path, early_us=180.0)
    assert _points(result, 0)[3] == (RELEASE, 27_840.0, 1, 20.0, -180.0, (1, "all_reduce", 0))
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)
    assert _predicted(result) == {**{k: round(v - 0.18, 3) for k, v in ON_TIME.items()}, "hide_communication": 27.02}
    # In every step, not only the median: rank 0, woken 180 us before the span's end, is not released before rank 1
    # arrives when the transfer is hidden (it was, by 180 us, in the first step).
    hidden = {s.scenario: s for s in result.what_if}["hide_communication"]
    assert hidden.saving_pct_per_step == pytest.approx([100 * (28.84 - 27.02) / 28.84] * 3)
    # The critical path runs through the transfer until rank 0 left it, 180 us before the span's end: its links add
    # up to the step (they overlapped by 180 us, 29.02 ms for a 28.84 ms step).
    path = [(c.rank, c.name, round(c.ms, 3)) for c in result.critical_path]
    assert path == [(1, "data_loading", 21.0), (1, "compute", 5.0), (1, "all_reduce#0 start", 0.02),
                    (1, "all_reduce#0", 1.82), (1, "compute", 1.0)]
    assert sum(c.ms for c in result.critical_path) == pytest.approx(28.84)


def test_only_the_wait_the_collective_ended_is_bound_not_the_gaps_the_woken_thread_leaves(tmp_path: Path) -> None:
    # Woken 100 us early, the thread runs small ops with gaps between them until past the span's end: the gaps are not
    # waits for the collective (it is over), and binding each of them gave the replay residuals. The 50 us gap
    # (20-70 us after the wake) ends 30 us before the span's end and lasts longer than that: only the rule that a
    # collective wakes one wait keeps it out.
    after = [(0.0, 10.0), (11.0, 20.0), (70.0, 95.0), (96.0, 130.0)]
    result = _analyze(tmp_path, early_us=100.0, after=after)
    tl = result.ranks[0].timeline
    assert tl is not None
    releases = [(round(tl.t[i], 3), round(tl.wake[i], 3)) for i in range(len(tl)) if tl.kind[i] == RELEASE
                and tl.step[i] == 1]
    assert releases == [(27_920.0, -100.0)]
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)
    # At rank 0's pace: 6.02 ms to the arrival, the 2 ms transfer, woken 0.1 ms early, then 1 ms to the step's end.
    assert _predicted(result)["slow_rank"] == pytest.approx(8.92)


def test_a_synchronous_collective_that_returns_just_before_its_span_ends_waits_inside_its_op(tmp_path: Path) -> None:
    # gloo wakes the caller before it closes the span here too (cpu_clean_memory's rank 1, step 10: 79 us before the
    # end of a 26.6 ms all-reduce): bound, with a wake of -80 us.
    result = _analyze(tmp_path, early_us=80.0, blocking=True)
    assert _points(result, 0)[3] == (RELEASE, 27_940.0, 1, 20.0, -80.0, (1, "all_reduce", 0))
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)
    assert _predicted(result)["slow_rank"] == pytest.approx(9.02 - 0.08)


def test_an_op_that_returns_before_its_collective_started_only_enqueued_it() -> None:
    # FSDP2's all-gather enqueue returns before the gloo worker starts the collective (tests/data/fsdp2): no wait in
    # the op, whatever the collective's length.
    from hf_distprof.analysis import analyze_paths as analyze

    result = analyze([DATA / "fsdp2"], OPTS)
    for rank in result.ranks:
        tl = rank.timeline
        assert tl is not None
        for i in range(len(tl)):
            if tl.kind[i] == RELEASE and tl.dep[i] is not None:
                c = next(c for c in rank.collectives if (c.step, c.kind, c.index) == tl.dep[i])
                assert tl.t[i] > c.start_us, (rank.rank, i, tl.t[i], c)


def test_a_gap_that_ends_long_before_the_collective_is_local_work(tmp_path: Path) -> None:
    # Resumed more than RESUME_SLACK_US before the span's end: not told from a gap while the collective runs in the
    # background, so it stays local work (the model's old reading, and a faster peer does not shorten it).
    result = _analyze(tmp_path, early_us=RESUME_SLACK_US + 100.0)
    assert RELEASE not in [kind for kind, *_ in _points(result, 0)]
    assert _predicted(result)["slow_rank"] == pytest.approx(29.02 - 0.6, abs=1e-6)  # rank 0 "works" through its wait


def test_a_synchronous_collective_waits_inside_its_op(tmp_path: Path) -> None:
    # The op returns 30 us after the span's end, with no gap: its time from the arrival on is a wait, bound to the
    # collective; before this, the 22 ms inside the op were rank 0's local work and rank 1's pace saved nothing.
    result = _analyze(tmp_path, early_us=-30.0, blocking=True)
    assert _points(result, 0) == [
        (START, 0.0, -1, 0.0, 0.0, None),
        (ISSUE, 6_000.0, 0, 6_000.0, 0.0, None),
        (ARRIVE, 6_020.0, 1, 20.0, 0.0, None),
        (RELEASE, 28_050.0, 1, 20.0, 30.0, (1, "all_reduce", 0)),  # the op until the arrival is its enqueue
        (END, 29_050.0, 3, 1_000.0, 0.0, None),
    ]
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)
    assert _predicted(result) == {k: round(v + 0.03, 3) for k, v in ON_TIME.items()}


def test_communication_hidden_keeps_a_rank_s_time_in_a_collective_after_its_completion(tmp_path: Path) -> None:
    # In step 3 rank 0's span ends 3 ms after rank 1's (the last to arrive), and rank 1's optimizer runs 3 ms longer.
    # The collective completed at rank 1's end (nobody ends before the last has contributed), and rank 0's 3 ms past
    # it are its thread resuming late (on a shared host, waiting for a CPU), which hiding the transfer does not
    # remove: hidden, step 3 saves the 2 ms transfer as the others do (it lasts 32.02 ms on both ranks): by each step's
    # end, 2, 4 and 6 ms saved of 29.02, 58.04 and 90.06 ms.
    result = _analyze(tmp_path, lag_us=3_000.0)
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-9)
    hidden = {s.scenario: s for s in result.what_if}["hide_communication"]
    assert hidden.saving_pct_per_step == pytest.approx(
        [100 * 2 / 29.02, 100 * 4 / 58.04, 100 * 6 / 90.06])
    assert hidden.saving_ms == pytest.approx(2.0)
    # 3 ms in one step of three is no finding.
    assert "slow_resume" not in {f.kind for f in result.findings}


def test_a_rank_that_resumes_late_after_every_collective_is_named_and_its_time_is_not_the_network(
        tmp_path: Path) -> None:
    # Rank 0 stays 14 ms in every all-reduce after rank 1's span ended: 14 of its 43.02 ms step, 32.5% (threshold
    # 30%). Not a transfer (what hiding communication saves stays the 2 ms), not a wait for a late peer, and no
    # communication-bound finding (what is left of the exposed time is the enqueue and the transfer).
    result = _analyze(tmp_path, lag_us=14_000.0, lag_steps=range(STEPS))
    kinds = [f.kind for f in result.findings]
    assert "slow_resume" in kinds and "communication_bound" not in kinds, kinds
    found = next(f for f in result.findings if f.kind == "slow_resume")
    assert found.ranks == [0] and found.numbers["resume_pct"] == pytest.approx(100 * 14 / 43.02)
    assert found.title == "Slow to resume after collectives"
    # Without the step timer's records the cause is not claimed: what to look at, not "it waits for a CPU".
    assert found.evidence == (
        f"ranks stay in their collectives after these completed on a peer: rank 0 {100 * 14 / 43.02:.1f}% of the "
        f"step (median {100 * 14 / 43.02:.1f}%) (threshold 30%): the thread had not run again yet; this is neither "
        "the transfer nor a wait for a late peer")
    assert found.recommendation.startswith("Look for what else runs on its host") and "CPU" not in found.evidence
    hidden = {s.scenario: s for s in result.what_if}["hide_communication"]
    assert hidden.saving_ms == pytest.approx(2.0)


def test_ranks_that_resume_within_microseconds_raise_no_such_finding(tmp_path: Path) -> None:
    # Rank 0's all-reduce ends 3 us after rank 1's in every step (NCCL kernels end microseconds apart): a lag of 3 us,
    # no finding, and no "wake-up" link of its own on the critical path (it stays in the collective's link).
    result = _analyze(tmp_path, lag_us=3.0, lag_steps=range(STEPS))
    assert "slow_resume" not in {f.kind for f in result.findings}
    lags = [c.end_us - c.done_in_us for c in result.ranks[0].collectives if c.done_in_us is not None]
    assert lags == pytest.approx([3.0] * STEPS)
    assert not [c for c in result.critical_path if c.name.endswith("wake-up")], result.critical_path
    assert sum(c.ms for c in result.critical_path) == pytest.approx(29.023)


def test_the_demo_shaped_run_s_rank_1_resumes_late_because_it_waits_for_a_cpu() -> None:
    # tests/data/golden/cpu_clean_memory: rank 1's gloo spans end 2-26 ms after rank 0's, and the step timer's records
    # beside the traces say its thread waited for a CPU 10-34 ms in those steps. That is the finding, with the
    # records' figure; before, the lag was read as a 2.4 ms clock offset (both ranks share one host's clock) and as
    # communication: "What to fix first: exposed communication hidden", 46.0%, "larger DDP buckets".
    import json

    folder = DATA / "golden" / "cpu_clean_memory"
    result = analyze_paths([folder], OPTS)
    assert [f.kind for f in result.findings] == ["slow_resume"]
    found = result.findings[0]
    lines = (folder / "timing_rank1.jsonl").read_text().splitlines()
    rows = {json.loads(line)["step"]: json.loads(line) for line in lines}
    waits = sorted(1e3 * rows[s]["cpu_wait_s"] for s in (8, 9, 10))
    assert found.ranks == [1] and f"wait for a CPU {waits[1]:.1f} ms per traced step" in found.evidence
    assert "rank 1 waited for a CPU: its host runs more threads than cores" in found.evidence
    assert found.recommendation.startswith("Keep ranks x intra-op threads at or under the host's cores")
    assert result.cross_rank is not None
    assert {p.rank: p.clock_offset_us for p in result.cross_rank.per_rank} == {0: 0.0, 1: 0.0}
    hidden = {s.scenario: s for s in result.what_if}["hide_communication"]
    assert hidden.saving_pct < 10 and not hidden.beyond_noise


def test_slow_rank1_rank_1_at_its_peer_s_pace_saves_what_rank_0_waits() -> None:
    # The committed trace: rank 1 computes 29.6 ms more per step, rank 0 waits 46.7% of its step for it. At rank 0's
    # pace the step is rank 0's own work: about half (the six steps end 47.7% sooner). Rank 0's first bucket's wait
    # (26 ms a step, its thread woken 0.18 ms before the span's end) used to count as its local work: 11.9% was
    # predicted.
    result = analyze_paths([DATA / "slow_rank1"], OPTS)
    scenario = {s.scenario: s for s in result.what_if}["slow_rank"]
    assert scenario.saving_pct == pytest.approx(47.7, abs=0.05)
    assert result.what_if_model is not None and result.what_if_model.error_ms == pytest.approx(0.0, abs=1e-3)
    # The critical path lists a stretch's phases in the order they began: the forward (its 30 ms sleep, "compute" in
    # a trace without the step timer's phases) before the backward, as DistributedDataParallel.forward (0.25-43.8 ms)
    # and the backward ops (from 44 ms) ran; by layer it read "backward 13.99 ms, compute 43.77 ms".
    first = [(c.rank, c.name) for c in result.critical_path[:3]]
    assert first == [(1, "data_loading"), (1, "compute"), (1, "backward")], result.critical_path


def test_the_table_says_why_a_saving_does_not_count() -> None:
    from hf_distprof.analysis import format_summary

    # slow_data: rank 1's pace saves 5.9 ms, twice the noise, but no slow-rank verdict calls its excess real;
    # fsdp2: rank 0 at its peers' median pace is given more work in some stretches than it did: a slower step.
    slow = {s.scenario: s for s in analyze_paths([DATA / "slow_data"], OPTS).what_if}
    assert slow["slow_rank"].saving_ms > 2 * (slow["slow_rank"].noise_ms or 0.0)
    assert (slow["slow_rank"].beyond_noise, slow["slow_rank"].not_counted) == (False, "verdict")
    assert (slow["no_data_loading"].beyond_noise, slow["no_data_loading"].not_counted) == (True, None)
    fsdp = analyze_paths([DATA / "fsdp2"], OPTS)
    pace = {s.scenario: s for s in fsdp.what_if}["slow_rank"]
    assert pace.saving_ms < 0 and pace.not_counted == "slower"
    rows = [line for line in format_summary(fsdp).splitlines() if line.startswith("rank 0 at its peers' median pace")]
    assert rows and rows[0].endswith("no: slower")
    demo = analyze_paths([DATA / "golden" / "cpu_clean_memory"], OPTS)
    hidden = {s.scenario: s for s in demo.what_if}["hide_communication"]
    assert hidden.not_counted == "noise" and hidden.saving_ms < (hidden.noise_ms or 0.0)


def test_the_box_says_why_the_largest_saving_is_no_finding_as_the_table_does() -> None:
    from hf_distprof.analysis import format_box

    # slow_data with its findings taken away: the box's all-clear names the largest saving that counts, else the
    # first; rank 1's pace (8.24 ms, three times the noise) is not counted because no verdict calls it real, and
    # the box said "within the run's noise" beside the table's "no: verdict".
    result = analyze_paths([DATA / "slow_data"], AnalysisOptions(workers=1, what_if_pct=100))
    result.findings = []
    result.what_if = [s for s in result.what_if if s.scenario == "slow_rank"]
    flat = " ".join(line.strip("|").strip() for line in format_box(result).splitlines())
    assert "is not one the slow-rank verdict calls real" in flat and "within the run's noise" not in flat, flat


def test_the_bandwidth_table_s_transfer_leaves_out_the_time_past_completion(tmp_path: Path) -> None:
    # Rank 0 stays 14 ms in each all-reduce after rank 1's end: of its 36 ms in it, 20 ms waited for rank 1 and 14 ms
    # came after the completion; its transfer is the 2 ms rank 1 took, as on rank 1. Three steps, two ranks: 6 ms of
    # transfer per rank over the traced steps (it counted 48 ms on rank 0 before).
    result = _analyze(tmp_path, lag_us=14_000.0, lag_steps=range(STEPS))
    (row,) = result.bandwidth
    assert (row.kind, row.count) == ("all_reduce", 6)
    assert row.wait_us == pytest.approx(3 * 20_000 / 2) and row.transfer_us == pytest.approx(3 * (2_000 + 2_000) / 2)
