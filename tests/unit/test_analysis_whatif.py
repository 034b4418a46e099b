"""What if: the traced steps replayed across ranks, the critical path, and each scenario's predicted step time.

Most numbers here are worked out by hand on a 2-rank gloo run written below (``two_ranks``), then checked through
the whole pipeline: parse, per-rank timeline, replay, scenarios, findings, JSON, text and report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_summary
from hf_distprof.analysis.results.across import ReferencePoint
from hf_distprof.analysis.read.compact import write_compact
from hf_distprof.analysis.tell.report import REPORT_MD, write_report
from hf_distprof.analysis.tell.whatif import CRITICAL_PATH_PNG
from hf_distprof.analysis.rank.timeline import ARRIVE, END, ISSUE, RELEASE, START

from ..conftest import SHARED_DIR, require

DATA = Path(__file__).resolve().parents[1] / "data"
DLRM = SHARED_DIR / "traces" / "dlrm_8gpu_v100"
MAIN, WORKER = 1, 2
OPTS = AnalysisOptions(workers=1)
# Rank 1's data loading in each of the three steps (rank 0's is 1 ms): a slow loader on rank 1.
SLOW_LOADING_US = (21_000, 22_000, 20_000)


def _span(name: str, ts: int, end: int, tid: int = MAIN, cat: str = "user_annotation", **args: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": end - ts}
    return {**event, "args": args} if args else event


def _rank_events(rank: int, loading: list[int]) -> list[dict[str, Any]]:
    """Steps of one rank: load, 5 ms forward, issue an all-reduce (1 MB), wait for it, 1 ms optimizer.

    Both ranks start step 1 at 0. Rank r arrives (gloo span start) 20 us after its issue, at
    ``t0 + loading + 5,020``; the all-reduce completes 2 ms after the last arrival; each rank's thread resumes 30 us
    after that and runs its optimizer for 1 ms; the next step starts at once. Its wait (communication on the training
    thread) runs from the arrival to the completion: gaps with nothing in flight are "other".
    """
    events = []
    t0 = 0
    for k, own in enumerate(loading):
        peers = SLOW_LOADING_US[k] if rank == 0 else 1_000  # the other rank's loading
        issue = t0 + own + 5_000
        done = t0 + max(own, peers) + 5_020 + 2_000
        end = done + 30 + 1_000
        events += [
            _span(f"ProfilerStep#{k + 1}", t0, end),
            _span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, t0 + own),
            _span("aten::mm", t0 + own, issue, cat="cpu_op"),
            _span("c10d::allreduce_", issue, issue + 10, cat="cpu_op"),
            _span("gloo:all_reduce", issue + 20, done, WORKER, **{"Input Dims": [[250_000]], "Input type": ["float"]}),
            _span("aten::add_", done + 30, end, cat="cpu_op"),
        ]
        t0 = end
    return events


def two_ranks(folder: Path, steps: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, loading in ((0, [1_000] * steps), (1, list(SLOW_LOADING_US[:steps]))):
        doc = {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
               "traceEvents": _rank_events(rank, loading)}
        (folder / f"rank-{rank}.json").write_bytes(orjson.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def slow_loader(tmp_path_factory: pytest.TempPathFactory) -> AnalysisResult:
    return analyze_paths([two_ranks(tmp_path_factory.mktemp("slow_loader"))], OPTS)


def test_each_rank_s_points_are_its_steps_issues_arrivals_and_waits(slow_loader: AnalysisResult) -> None:
    tl = slow_loader.ranks[0].timeline
    assert tl is not None
    first = [(tl.kind[i], tl.t[i], tl.pred[i], tl.work[i], tl.wake[i], tl.loading[i]) for i in range(5)]
    assert first == [
        (START, 0, -1, 0.0, 0.0, 0.0),
        (ISSUE, 6_000, 0, 6_000, 0.0, 1_000),  # 1 ms of loading, then 5 ms forward
        (ARRIVE, 6_020, 1, 20, 0.0, 0.0),  # the gloo worker picks it up 20 us later
        (RELEASE, 28_020, 1, 20, 0.0, 0.0),  # the enqueue and a gap, then waits from the arrival to the completion
        (END, 29_050, 3, 1_030, 0.0, 0.0),  # 30 us before the thread resumes, then the 1 ms optimizer
    ]
    assert tl.phases[1] == (("data_loading", 1_000), ("compute", 5_000))
    assert tl.dep[3] == (1, "all_reduce", 0) and tl.key[2] == (1, "all_reduce", 0)
    assert (tl.kind[5], tl.pred[5], tl.work[5]) == (START, 4, 0.0)  # step 2 starts where step 1 ends


def test_the_replay_gives_back_every_measured_step(slow_loader: AnalysisResult) -> None:
    model = slow_loader.what_if_model
    assert model is not None
    # Step times 29.05, 30.05 and 28.05 ms on both ranks (22 ms + loading + 7.05 ms): median 29.05.
    assert (model.steps, model.median_step, model.sync_points) == ([1, 2, 3], 1, 1)
    assert model.step_ms_measured == pytest.approx(29.05) and model.step_ms_replayed == pytest.approx(29.05)
    assert model.error_ms == pytest.approx(0.0, abs=1e-9)
    assert model.noise_ms == pytest.approx(1.4826)  # scaled MAD of 29.05, 30.05, 28.05
    assert (model.slowest_rank, model.fastest_rank) == (1, 0)
    assert [(r.rank, r.step_ms_measured, r.step_ms_replayed) for r in model.ranks] == [
        (0, pytest.approx(29.05), pytest.approx(29.05)), (1, pytest.approx(29.05), pytest.approx(29.05))]


def test_each_scenario_replays_the_steps_with_one_change(slow_loader: AnalysisResult) -> None:
    got = [(s.scenario, s.ranks, s.step_ms_now, s.step_ms_predicted, s.saving_ms, s.beyond_noise)
           for s in slow_loader.what_if]
    assert got == [
        # Both loaders at 0: both arrive at 5.02 ms, complete at 7.02, resume at 7.05, end at 8.05.
        ("no_data_loading", [0, 1], pytest.approx(29.05), pytest.approx(8.05), pytest.approx(21.0), True),
        # Rank 1 does rank 0's 6 ms before its all-reduce: 6.02 + 2 + 0.03 + 1 = 9.05. Not counted: 3 traced steps
        # and no step timer's records, the slow-rank verdict is "not enough evidence", and a saving on a rank's pace
        # counts only where the verdict engine calls that rank's excess real (issue 30).
        # (With two ranks, "every rank at the fastest's pace" is the same replay on the same rank: no second row.)
        ("slow_rank", [1], pytest.approx(29.05), pytest.approx(9.05), pytest.approx(20.0), False),
        # The 2 ms transfer hidden: 2 ms less, beyond the 1.48 ms noise.
        ("hide_communication", [0, 1], pytest.approx(29.05), pytest.approx(27.05), pytest.approx(2.0), True),
    ]
    first = slow_loader.what_if[0]
    assert first.saving_pct == pytest.approx(100 * 21 / 29.05)
    assert first.hours_per_1000_steps == pytest.approx(21.0 / 3600)  # 21 ms x 1,000 steps = 21 s
    assert first.error_ms == pytest.approx(0.0, abs=1e-9)
    # By each step's end, the saving so far of the time since the window began: 21 of 29.05, 43 of 59.1, 63 of 87.15 ms.
    assert first.saving_pct_per_step == pytest.approx([100 * 21 / 29.05, 100 * 43 / 59.1, 100 * 63 / 87.15])
    # Judged against the smaller of the measured steps' noise (1.4826 ms) and the predicted steps': without loading
    # every step is 8.05 ms (no noise); with the transfers hidden the steps still vary as measured (27.05, 28.05,
    # 26.05: 1.4826 ms).
    assert {s.scenario: s.noise_ms for s in slow_loader.what_if} == {
        "no_data_loading": pytest.approx(0.0, abs=1e-9), "slow_rank": pytest.approx(0.0, abs=1e-9),
        "hide_communication": pytest.approx(1.4826)}


def test_the_critical_path_runs_through_the_late_rank(slow_loader: AnalysisResult) -> None:
    path = [(s.rank, s.kind, s.name, s.ms, s.start_ms) for s in slow_loader.critical_path]
    assert path == [
        (1, "phase", "data_loading", pytest.approx(21.0), pytest.approx(0.0)),
        (1, "phase", "compute", pytest.approx(5.0), pytest.approx(21.0)),
        (1, "collective", "all_reduce#0 start", pytest.approx(0.02), pytest.approx(26.0)),
        (1, "collective", "all_reduce#0", pytest.approx(2.0), pytest.approx(26.02)),
        (1, "phase", "compute", pytest.approx(1.0), pytest.approx(28.02)),  # a stretch's phases: each once, summed
        (1, "phase", "other", pytest.approx(0.03), pytest.approx(29.02)),
    ]
    assert sum(s.ms for s in slow_loader.critical_path) == pytest.approx(29.05)  # the median step, start to end


def test_what_to_fix_first_opens_the_findings(slow_loader: AnalysisResult) -> None:
    first = slow_loader.findings[0]
    assert (first.kind, first.title, first.ranks) == (
        "what_to_fix_first", "What to fix first: data loading at zero on every rank", [0, 1])
    assert first.evidence == (
        "replaying the 3 traced step(s) across ranks with data loading at zero on every rank predicts 8.05 ms per "
        "step instead of the measured 29.05 ms: 72.3% faster, 0.006 h saved per 1,000 steps (model error +-0.00 ms; "
        "step-to-step noise 0.00 ms, the smaller of the measured steps' 1.48 ms and the predicted ones'). Above the "
        "10% threshold and the noise, in order: data loading at zero on every rank: 8.05 ms (-72.3%)"
    )
    assert first.recommendation.startswith("Load data ahead of the step: DataLoader num_workers > 0")
    assert first.confidence == 1.0 and first.severity == pytest.approx(100 * 21 / 29.05)
    assert [f.kind for f in slow_loader.findings].count("what_to_fix_first") == 1


def test_the_threshold_is_an_option(tmp_path: Path) -> None:
    # Every scenario saves under 75% of the step: no finding at --what-if-pct 75, the table stays.
    result = analyze_paths([two_ranks(tmp_path)], AnalysisOptions(workers=1, what_if_pct=75))
    assert "what_to_fix_first" not in {f.kind for f in result.findings}
    assert len(result.what_if) == 3


def test_the_json_has_what_if_and_the_critical_path(slow_loader: AnalysisResult) -> None:
    data = orjson.loads(slow_loader.to_json())
    for row in data["what_if"]:
        assert {"scenario", "ranks", "step_ms_now", "step_ms_predicted", "saving_pct", "error_ms"} <= set(row)
    assert [row["scenario"] for row in data["what_if"]] == [
        "no_data_loading", "slow_rank", "hide_communication"]
    assert data["critical_path"][0] == {"rank": 1, "kind": "phase", "name": "data_loading",
                                        "ms": pytest.approx(21.0), "start_ms": pytest.approx(0.0)}
    assert data["what_if_model"]["median_step"] == 1 and "timeline" not in data["ranks"][0]
    lanes = data["what_if_model"]["lanes"]
    assert {"rank": 0, "start_ms": pytest.approx(6.02), "end_ms": pytest.approx(28.02), "name": "waiting",
            "family": "waiting"} in lanes
    assert data["what_if_model"]["rank_saving_real"] is False


def test_compact_files_give_the_same_answer(tmp_path: Path) -> None:
    folder = two_ranks(tmp_path)
    from_json = analyze_paths([folder], OPTS, read_compact=False).to_dict()
    for trace in sorted(folder.glob("rank-*.json")):
        write_compact(trace)
    from_compact = analyze_paths([folder], OPTS).to_dict()
    for key in ("what_if", "critical_path", "what_if_model", "findings"):
        assert from_compact[key] == from_json[key]


def test_one_step_cannot_tell_a_saving_from_noise(tmp_path: Path) -> None:
    result = analyze_paths([two_ranks(tmp_path, steps=1)], OPTS)
    model = result.what_if_model
    assert model is not None and model.noise_ms is None and model.steps == [1]
    assert {s.scenario: s.step_ms_predicted for s in result.what_if}["slow_rank"] == pytest.approx(9.05)
    assert not any(s.beyond_noise for s in result.what_if)
    assert "what_to_fix_first" not in {f.kind for f in result.findings}


def test_transfers_at_the_reference_bandwidth(tmp_path: Path) -> None:
    # 1 MB all-reduces on 2 ranks (bus factor 1) at 1 GB/s take 1 ms instead of the 2 ms measured.
    folder = two_ranks(tmp_path)
    result = analyze_paths([folder], OPTS, reference=[ReferencePoint("all_reduce", 1 << 20, 1.0, 2)],
                           reference_file="ref.csv")
    network = next(s for s in result.what_if if s.scenario == "network_at_reference")
    assert (network.ranks, network.step_ms_predicted) == ([0, 1], pytest.approx(28.05))
    assert network.title == "transfers at the reference bandwidth (--bandwidth-ref)"
    assert result.bandwidth_reference_file == "ref.csv" and result.bandwidth_reference
    slower = analyze_paths([folder], OPTS, reference=[ReferencePoint("all_reduce", 1 << 20, 0.1, 2)])
    assert next(s for s in slower.what_if if s.scenario == "network_at_reference").saving_ms == pytest.approx(0.0)
    assert "network_at_reference" not in {s.scenario for s in analyze_paths([folder], OPTS).what_if}


def test_the_summary_and_the_report_show_it(slow_loader: AnalysisResult, tmp_path: Path) -> None:
    text = format_summary(slow_loader)
    assert ("What if (3 traced step(s) replayed across ranks: measured 29.05 ms per step (mean over steps and ranks; "
            "step-to-step noise 1.48 ms), replayed 29.05 ms; model error +-0.00 ms (the largest "
            "replay residual of a rank's step); a saving counts when it is larger than the error and the noise (the "
            "smaller of the measured steps' and the predicted steps'), and on a rank's pace only when the traced "
            "window's slow-rank verdict names that rank):") in text
    # The title column 58 characters wide at least (wider for a longer title), the figures aligned under their heads.
    assert (f"{'data loading at zero on every rank':<58} {'8.05':>8} {'0.00':>8} {'0.00':>8} {'-21.00':>10} {'72.3':>8}"
            f" {'-':>6} {'0.006':>10} {'yes':>12}") in text
    assert (f"{'exposed communication hidden (transfers fully overlapped)':<58} {'27.05':>8} {'0.00':>8} {'1.48':>8} "
            f"{'-2.00':>10} {'6.9':>8} {'-':>6} {'0.001':>10} {'yes':>12}") in text
    head = next(line for line in text.splitlines() if line.startswith("what if "))
    assert head.index("step ms") == 58 + 2  # the title column, a space, "step ms" right-aligned in 8
    assert "Critical path of step 1 (the median step; 29.05 ms, rank 1):" in text
    assert "       0.00 ms  rank 1    phase      data_loading                         21.00 ms" in text
    write_report(slow_loader, tmp_path / "rep")
    assert (tmp_path / "rep" / CRITICAL_PATH_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "rep" / REPORT_MD).read_text()
    assert "## What if" in md and "| 0.00 | 1 | phase | data_loading | 21.00 |" in md
    assert f"![critical path over the ranks' timelines]({CRITICAL_PATH_PNG})" in md


def test_a_lone_rank_of_two_is_not_replayed(tmp_path: Path) -> None:
    # Rank 1's trace alone (its world is 2): replayed by itself it "arrives at once" and would save 21 ms without its
    # loader, where it would then wait for rank 0's 6 ms of work. Its peer's trace is missing: no replay.
    result = analyze_paths([two_ranks(tmp_path) / "rank-1.json"], OPTS)
    assert result.what_if == [] and result.what_if_model is None and result.unread_ranks == [0]
    assert "what_if" in [u.question for u in result.undecided]


def test_committed_gpu_traces_replay_exactly() -> None:
    result = analyze_paths([DATA / "gpu_float_ts"], OPTS)
    model = result.what_if_model
    assert model is not None and len(model.ranks) == 4
    for rank in model.ranks:
        assert rank.step_ms_replayed == pytest.approx(rank.step_ms_measured, abs=1e-6)
    # From a rank's start of the median step to the last rank's end of it.
    assert sum(s.ms for s in result.critical_path) <= max(lane["end_ms"] for lane in model.lanes) + 1e-9


def test_dlrm_replay_reproduces_every_rank_s_step_time() -> None:
    require(DLRM.is_dir(), f"shared DLRM traces not found at {DLRM}")
    result = analyze_paths([DLRM], OPTS)
    model = result.what_if_model
    assert model is not None and model.steps == [10] and model.sync_points == 8
    for rank in model.ranks:  # the issue's bar is 5%; the replay is within microseconds
        assert math.isclose(rank.step_ms_replayed, rank.step_ms_measured, rel_tol=0.05)
        assert rank.residual_ms < 0.01
    assert {r.rank: round(r.step_ms_measured, 3) for r in model.ranks} == {
        0: 14.455, 1: 19.901, 2: 13.017, 3: 19.313, 4: 17.979, 5: 17.797, 6: 13.091, 7: 12.509}
    # One step: the noise is unknown, so nothing is claimed beyond it.
    assert model.noise_ms is None and "what_to_fix_first" not in {f.kind for f in result.findings}


def test_what_to_fix_first_counts_a_rank_s_pace_as_much_as_the_run_shows() -> None:
    """The replay of the traced steps promises 49% from rank 1's pace, the run's judged steps 13%; data loading at
    zero 24%: the data loading comes first, rank 1's pace counts 13% and says so."""
    from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario

    def scenario(name: str, title: str, pct: float, run: float | None) -> WhatIfScenario:
        return WhatIfScenario(scenario=name, title=title, ranks=[1], step_ms_now=260.0,
                              step_ms_predicted=260.0 * (1 - pct / 100), saving_ms=2.6 * pct, saving_pct=pct,
                              hours_per_1000_steps=0.0, error_ms=0.0, noise_ms=16.0, beyond_noise=True,
                              saving_pct_per_step=[pct] * 3, run_saving_pct=run)

    pace = scenario("slow_rank", "rank 1 at its peers' median pace", 49.0, 13.0)
    data = scenario("no_data_loading", "data loading at zero on every rank", 24.1, None)
    model = WhatIfModel(steps=[8, 9, 10], median_step=9, step_ms_measured=260.0, step_ms_replayed=260.0,
                        error_ms=0.0, noise_ms=8.0, sync_points=1, slowest_rank=1, fastest_rank=0,
                        run_noise_ms=16.0, run_steps=24)
    assert (pace.counted_pct, data.counted_pct) == (13.0, 24.1)

    def what_to_fix_first(answer: WhatIf, threshold_pct: float):  # type: ignore[no-untyped-def]
        from hf_distprof.analysis.judge.whatif import by_saving, what_to_fix_first as judge
        from hf_distprof.analysis.tell.findings import write

        found = judge(WhatIf(by_saving(answer.scenarios), answer.critical_path, answer.model), threshold_pct)
        return write(found) if found is not None else None

    first = what_to_fix_first(WhatIf(scenarios=[pace, data], model=model, critical_path=[]), 10.0)
    assert first is not None and first.title == "What to fix first: data loading at zero on every rank"
    assert first.severity == 24.1 and "run_saving_pct" not in first.numbers
    assert first.evidence.endswith("in order: data loading at zero on every rank: 197.34 ms (-24.1%); rank 1 at its "
                                   "peers' median pace: -13.0% over the run")
    alone = what_to_fix_first(WhatIf(scenarios=[pace], model=model, critical_path=[]), 10.0)
    assert alone is not None and alone.severity == 13.0 and alone.numbers["run_saving_pct"] == 13.0
    assert alone.why.endswith("; over the run's 24 judged steps that pace saves 13.0% of the step (the step timer's "
                              "records), the figure that counts")
    assert what_to_fix_first(WhatIf(scenarios=[pace], model=model, critical_path=[]), 15.0) is None


def test_a_raised_imbalance_verdict_beside_a_quiet_straggler_one_makes_the_rank_s_pace_count() -> None:
    # tests/data/gpu_float_ts: rank 2's GPU busy time is 40% over its peers' in 3 of 3 steps (imbalance raised); it
    # reaches the collectives 0.55 ms late, 18.4% of the step but under --straggler-min-us 1000 (straggler quiet).
    # The rank-pace savings once read only the straggler verdict and were "no" beside the finding naming rank 2.
    result = analyze_paths([DATA / "gpu_float_ts"], OPTS)
    cross = result.cross_rank
    assert cross is not None
    straggler, imbalance = cross.straggler_verdict, cross.imbalance_verdict
    assert (straggler.status, straggler.gate, straggler.rank) == ("quiet", "floor", 2)
    assert "above the 10% threshold but by 547.5 us, not more than the 1000 us" in straggler.reason
    assert (imbalance.status, imbalance.rank) == ("raised", 2)
    model = result.what_if_model
    assert model is not None and model.slowest_rank == 2 and model.rank_saving_real is True
    counted = {s.scenario: s.beyond_noise for s in result.what_if}
    assert counted == {"fastest_pace": True, "slow_rank": True, "hide_communication": True, "no_data_loading": False}
    assert [f.kind for f in result.findings] == ["slow_rank", "what_to_fix_first"]


def _async_graph(windows: tuple[int, ...] = (3,)) -> Any:
    """Two ranks, one all-reduce per step, hand-built as the replay's graph (times in us).

    Rank 0 never waits for the all-reduce: each step it works 13 ms (12 in step 3), arrives, works 2 ms more; steps of
    15, 15 and 14 ms. Rank 1 works 5 ms, arrives, waits for the completion (the last arrival plus the transfer: 4 ms
    in step 1, 0.5 ms after), works 1 ms. Rank 0 arrives last in every step, so rank 1 ends step 1 at 18 ms, step 2 at
    29.5 and step 3 at 43.5: steps of 18, 11.5 and 14 ms. ``windows``: how many steps each traced window holds (a
    window's first step starts at its measured time)."""
    transfer_ms, own = [4.0, 0.5, 0.5], [(13.0, 2.0), (13.0, 2.0), (12.0, 2.0)]
    keys = [(s, "all_reduce", 0) for s in (1, 2, 3)]
    t_rank0, t = [], 0.0
    for before, after in own:
        t_rank0.append((t, t + before, t + before + after))
        t += before + after
    lines: list[list[tuple[int, int, float, int, float, int]]] = [[], []]  # kind, step, t, pred, work, collective
    first = {sum(windows[:k]) + 1 for k in range(len(windows))}
    end1 = 0.0
    for s, ((start0, arrive0, end0), transfer) in enumerate(zip(t_rank0, transfer_ms), start=1):
        for r in (0, 1):
            line = lines[r]
            pred = -1 if s in first else len(line) - 1
            if r == 0:
                line += [(START, s, start0, pred, 0.0, -1), (ARRIVE, s, arrive0, len(line), own[s - 1][0], s - 1),
                         (END, s, end0, len(line) + 1, own[s - 1][1], -1)]
            else:
                start1 = end1
                done = max(start1 + 5.0, arrive0) + transfer
                end1 = done + 1.0
                line += [(START, s, start1, pred, 0.0, -1), (ARRIVE, s, start1 + 5.0, len(line), 5.0, s - 1),
                         (RELEASE, s, done, len(line) + 1, 0.0, s - 1), (END, s, end1, len(line) + 2, 1.0, -1)]
    return _hand_graph(lines, keys, [1e3 * x for x in transfer_ms])


def _hand_graph(lines: list[list[tuple[int, int, float, int, float, int]]], keys: list[Any], transfer_us: list[float]
                ) -> Any:
    """The replay's graph of hand-written timelines: per rank (kind, step, time in ms, predecessor, work in ms,
    collective number); a RELEASE point waits for its collective, an ARRIVE point arrives at it."""
    from hf_distprof.analysis.results.rank import RankTimeline
    from hf_distprof.analysis.whatif.replay import Graph

    tls, work, dep, dep_id, arrive_id, arrive_at, starts, ends = [], [], [], [], [], [], [], []
    for line in lines:
        tl = RankTimeline()
        for kind, s, at, pred, w, c in line:
            gated = kind == RELEASE
            tl.kind.append(kind), tl.step.append(s), tl.t.append(1e3 * at), tl.pred.append(pred)
            tl.work.append(1e3 * w), tl.key.append(keys[c] if kind == ARRIVE else None)
            tl.dep.append(keys[c] if gated else None), tl.wake.append(0.0), tl.loading.append(0.0)
            tl.phases.append(()), tl.end.append(0.0), tl.main.append(True)
        tls.append(tl)
        work.append(list(tl.work))
        dep.append(list(tl.dep))
        dep_id.append([c if kind == RELEASE else -1 for kind, _, _, _, _, c in line])
        arrive_id.append([c if kind == ARRIVE else -1 for kind, _, _, _, _, c in line])
        arrive_at.append({keys[c]: i for i, (kind, _, _, _, _, c) in enumerate(line) if kind == ARRIVE})
        starts.append({s: i for i, (kind, s, _, _, _, _) in enumerate(line) if kind == START})
        ends.append({s: i for i, (kind, s, _, _, _, _) in enumerate(line) if kind == END})
    return Graph(ranks=[0, 1], tl=tls, t0=[list(tl.t) for tl in tls], work=work, dep=dep,
                 wake=[[0.0] * len(tl) for tl in tls], arrive_at=arrive_at, keys=keys, dep_id=dep_id,
                 arrive_id=arrive_id, transfer=dict(zip(keys, transfer_us)),
                 steps=sorted(set.intersection(*(set(s) for s in starts))),
                 start_at=starts, end_at=ends, segment=[[None] * len(tl) for tl in tls], bytes_of={})


def test_crossed_waits_end_the_replay() -> None:
    """Two collectives whose measured order disagrees between the ranks (clock skew: rank 1 left its wait for Y at
    3.5 ms, before rank 0's arrival at Y at 5.0 ms on its clock): replayed as measured each rank waits for the other.
    The wait that ended first is released at its collective's completion with the arrivals it had (rank 1's at 1.2 ms
    plus Y's 0.6 ms transfer), the one exception to "never before the last rank arrived" (the guide says so); the
    replay then goes on in order."""
    from hf_distprof.analysis.whatif import replay as wr

    keys = [(1, "all_reduce", 0), (1, "broadcast", 0)]  # X, Y
    lines = [
        [(START, 1, 0.0, -1, 0.0, -1), (ARRIVE, 1, 1.0, 0, 1.0, 0), (RELEASE, 1, 4.7, 1, 0.0, 0),
         (ARRIVE, 1, 5.0, 2, 0.3, 1), (RELEASE, 1, 5.6, 3, 0.0, 1), (END, 1, 7.0, 4, 1.4, -1)],
        [(START, 1, 0.0, -1, 0.0, -1), (ARRIVE, 1, 1.2, 0, 1.2, 1), (RELEASE, 1, 3.5, 1, 0.0, 1),
         (ARRIVE, 1, 4.2, 2, 0.7, 0), (RELEASE, 1, 4.7, 3, 0.0, 0), (END, 1, 7.0, 4, 2.3, -1)],
    ]
    g = _hand_graph(lines, keys, [500.0, 600.0])
    rep = wr.replay(g)
    assert rep.value[1][2] == pytest.approx(1.8e3)  # rank 1 leaves its wait for Y: 1.2 + 0.6 ms
    assert rep.value[1][3] == pytest.approx(2.5e3)  # and arrives at X 0.7 ms later, the last
    assert rep.value[0][2] == pytest.approx(3.0e3)  # rank 0 leaves its wait for X at 2.5 + 0.5 ms
    assert rep.done[keys[0]] == pytest.approx(3.0e3) and rep.last[keys[0]] == 1
    # Rank 0 arrives at Y at 3.3 ms, the last, so Y completes again at 3.9 for its own wait; both end at 5.3 ms
    # (3.9 + 1.4; X's completion 3.0 + 2.3).
    assert rep.done[keys[1]] == pytest.approx(3.9e3)
    assert [rep.value[0][-1], rep.value[1][-1]] == pytest.approx([5.3e3, 5.3e3])


def test_a_step_only_one_rank_traced_saves_nothing() -> None:
    """Rank 0 traced steps 1-3, rank 1 steps 2-3 (the common ones): a replay where rank 0 ends step 1 2 ms sooner and
    every common step as long as before saves nothing per step (it read 2 ms over 3 steps on rank 0: 0.33 ms)."""
    from hf_distprof.analysis.whatif import replay as wr
    from hf_distprof.analysis.whatif.model import running_saving_pct, window_saving

    lines = [
        [(START, 1, 0.0, -1, 0.0, -1), (END, 1, 10.0, 0, 10.0, -1), (START, 2, 10.0, 1, 0.0, -1),
         (END, 2, 20.0, 2, 10.0, -1), (START, 3, 20.0, 3, 0.0, -1), (END, 3, 30.0, 4, 10.0, -1)],
        [(START, 2, 10.0, -1, 0.0, -1), (END, 2, 20.0, 0, 10.0, -1), (START, 3, 20.0, 1, 0.0, -1),
         (END, 3, 30.0, 2, 10.0, -1)],
    ]
    g = _hand_graph(lines, [], [])
    assert g.steps == [2, 3]
    base = wr.replay(g)
    assert base.value == [[0.0, 10e3, 10e3, 20e3, 20e3, 30e3], [10e3, 20e3, 20e3, 30e3]]
    sooner = wr.Replay([[0.0, 8e3, 8e3, 18e3, 18e3, 28e3], list(base.value[1])], base.bound, {}, {})
    assert window_saving(g, base, sooner) == 0.0
    # Counted from step 2's start on both ranks: nothing saved by step 2's end nor by step 3's.
    assert running_saving_pct(g, base, sooner) == [0.0, 0.0]


def test_hiding_the_transfers_never_reads_slower() -> None:
    """The step a scenario predicts is the measured one less how much sooner the traced steps end, not the median of
    the replayed steps: hiding rank 1's 4 ms transfer in step 1 makes it start step 2 sooner, where it then waits
    longer for rank 0 (11.5 -> 15 ms); the median step of the mean over ranks went from 14 to 14.5 ms ("no: slower"
    beside a change that only takes time away), while the three steps end 0.5 ms sooner on rank 1."""
    from statistics import median

    from hf_distprof.analysis.whatif import replay as wr
    from hf_distprof.analysis.whatif.model import running_saving_pct, window_saving

    g = _async_graph()
    base = wr.replay(g)
    assert wr.step_times(g, base) == wr.measured_step_times(g) == {
        1: [15e3, 18e3], 2: [15e3, 11.5e3], 3: [14e3, 14e3]}
    hidden = wr.replay(g, transfer=dict.fromkeys(g.transfer, 0.0))
    steps = wr.step_times(g, hidden)
    assert steps == {1: [15e3, 14e3], 2: [15e3, 15e3], 3: [14e3, 14e3]}
    assert median(sum(v) / 2 for v in steps.values()) == 14.5e3  # the old statistic: 0.5 ms slower than 14 ms
    # Rank 0 ends as before, rank 1 0.5 ms sooner (the last step's transfer): 0.5 ms over 3 steps, half of it per rank.
    assert window_saving(g, base, hidden) == pytest.approx(0.5e3 / 3 / 2)
    assert window_saving(g, base, base) == 0.0
    # By each step's end (both ranks): 4 of 33 ms saved, 0.5 of 59.5, 0.5 of 87.5; step 2 alone read -13.2%.
    assert running_saving_pct(g, base, hidden) == pytest.approx([100 * 4 / 33, 100 * 0.5 / 59.5, 100 * 0.5 / 87.5])


def test_each_window_s_steps_end_sooner_on_their_own() -> None:
    """Windows of 1 and 2 steps (the second's first step starts at its measured time): rank 1 ends the first window
    4 ms sooner (its transfer), the second 0.5 ms sooner; 4.5 ms over 3 steps."""
    from hf_distprof.analysis.whatif import replay as wr
    from hf_distprof.analysis.whatif.model import window_saving

    g = _async_graph(windows=(1, 2))
    base = wr.replay(g)
    assert wr.step_times(g, base) == wr.measured_step_times(g)
    hidden = wr.replay(g, transfer=dict.fromkeys(g.transfer, 0.0))
    # Step 2 starts where it was measured: no longer wait, 0.5 ms shorter (its own transfer).
    assert wr.step_times(g, hidden)[2] == [15e3, 11e3]
    assert window_saving(g, base, hidden) == pytest.approx(4.5e3 / 3 / 2)


def test_the_critical_path_starts_at_the_step_s_start_even_when_the_step_before_s_collective_wakes_into_it() -> None:
    # A trial's 2-rank run: rank 1 woke 2.12 ms after step 7's all-reduce completed, 1.76 ms of it before step 8
    # started; the path of step 8 began "-1.76 ms ... all_reduce#0 wake-up 2.12 ms" and its links added up to 1.76 ms
    # more than the step.
    result = analyze_paths([DATA / "wake_up_before_step"], AnalysisOptions(workers=1))
    first = result.critical_path[0]
    assert (first.rank, first.kind, first.name, first.start_ms) == (1, "collective", "step 7's all_reduce#0 wake-up",
                                                                   0.0)
    assert first.ms == pytest.approx(0.36, abs=0.005)
    assert min(s.start_ms for s in result.critical_path) == 0.0
    end = max(s.start_ms + s.ms for s in result.critical_path)
    assert sum(s.ms for s in result.critical_path) == pytest.approx(end)  # the links add up to the step's span


def _verdict(status: str, rank: int, steps: int, min_steps: int = 6) -> Any:
    from hf_distprof.core.verdicts import SlowRankVerdict

    return SlowRankVerdict(status, rank, 20.0, 10.0, 5.0, steps, steps, 2, 0.001, min_steps, "")


def test_the_rank_a_weighed_verdict_raised_is_the_one_replayed_and_its_replay_counts() -> None:
    """A test_whatif run beside a busy core: 4 judged untraced steps named rank 0 by 11.9% (not enough to decide);
    the 20 traced steps had rank 1 loading 81 ms of a 150 ms step, and the verdict weighed with the run raised rank 1.
    The what-if replayed rank 0 ("no: slower") under findings naming rank 1, and over those 4 steps rank 1's pace
    saved 0.0%."""
    from hf_distprof.analysis.judge.whatif import judge_scenarios, replay_pace
    from hf_distprof.analysis.results.across import RankVerdicts, RunEvidence
    from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario

    few = _verdict("undecided", 0, 4)
    weighed = RankVerdicts(imbalance=_verdict("raised", 1, 20), straggler=_verdict("raised", 1, 20), run=few,
                           run_real=False)
    assert replay_pace(weighed, (0, 1)) == (1, None)
    # The run's own verdict decided: the verdicts follow it, and so does the replay (the live table's rank).
    decided = RankVerdicts(imbalance=_verdict("quiet", 0, 17), run=_verdict("quiet", 0, 17), run_real=False)
    assert replay_pace(decided, (0, 1)) == (0, 1)
    assert replay_pace(RankVerdicts(imbalance=_verdict("quiet", 1, 20), run=few), (0, 1)) == (0, 1)
    # With 3 ranks the straggler verdict and the imbalance verdict may name two: the replay takes the one the box's
    # slow-rank finding names (the straggler's first, as RankVerdicts.raised orders them).
    two = RankVerdicts(straggler=_verdict("raised", 2, 20), imbalance=_verdict("raised", 1, 20), run=few)
    assert replay_pace(two, (0, 1)) == (2, 1)

    def judged(verdicts: RankVerdicts, slowest: int, own_candidate: int = 0) -> WhatIfScenario:
        pace = WhatIfScenario(scenario="slow_rank", title=f"rank {slowest} at its peers' median pace", ranks=[slowest],
                              step_ms_now=150.0, step_ms_predicted=67.8, saving_ms=82.2, saving_pct=54.8,
                              hours_per_1000_steps=0.0, error_ms=0.0, noise_ms=None, run_saving_pct=0.0)
        model = WhatIfModel(steps=[7, 8], median_step=7, step_ms_measured=150.0, step_ms_replayed=150.0, error_ms=0.0,
                            noise_ms=8.0, sync_points=2, slowest_rank=slowest, fastest_rank=None, run_noise_ms=0.8,
                            run_steps=4)
        evidence = RunEvidence(steps=4, noise_ms=0.8, slowest_rank=own_candidate, fastest_rank=1 - own_candidate,
                               excess_ms={0: 0.0, 1: 0.0}, step_ms=150.0)
        answer = judge_scenarios(WhatIf([pace], [], model), verdicts, evidence)
        return answer.scenarios[0]

    counted = judged(weighed, 1)
    assert (counted.beyond_noise, counted.run_saving_pct, counted.counted_pct) == (True, None, 54.8)
    from hf_distprof.analysis.tell.whatif import _header

    model = WhatIfModel(steps=[7, 8], median_step=7, step_ms_measured=150.0, step_ms_replayed=150.0, error_ms=0.0,
                        noise_ms=8.0, sync_points=2, slowest_rank=1, fastest_rank=None, run_noise_ms=0.8, run_steps=4)
    assert "; rank 1's pace has no run%: the verdict named it" in _header(model, [counted])
    # The run's own candidate, its excess not real over the run: held to the run's figure as before.
    held = judged(RankVerdicts(imbalance=_verdict("quiet", 0, 20), run=few, run_real=False), 0)
    assert (held.beyond_noise, held.not_counted, held.run_saving_pct) == (False, "noise", 0.0)
    # The run decided and raised rank 1 on its arrival at the sync (its wait for a CPU with it), while its own work
    # names rank 0: rank 1 is replayed, its excess is real, and rank 0's own-work figure does not hold it.
    arrival = _verdict("raised", 1, 17)
    on_arrival = RankVerdicts(imbalance=arrival, straggler=arrival, run=arrival, run_real=False)
    assert replay_pace(on_arrival, (0, 1)) == (1, None)
    assert judged(on_arrival, 1, own_candidate=0).beyond_noise is True
    # Decided and raised on own work: the run's figure holds the pace, as it always did.
    own = _verdict("raised", 1, 17)
    held_to_run = judged(RankVerdicts(imbalance=own, run=own, run_real=True), 1, own_candidate=1)
    assert (held_to_run.run_saving_pct, held_to_run.not_counted) == (0.0, "noise")


def test_a_burst_s_rank_is_the_slowest_and_the_one_replayed() -> None:
    """A trial: rank 1 stalled 0.3 s once (step 24 of 40), the run's verdict quiet with rank 0 its candidate by 5.6%.
    The step timer's table marked rank 1 (the burst's), `analyze` said "Rank 1 held the others back in one stall" but
    gave `slowest_rank` 0 and replayed rank 0. Now both name rank 1; its pace is not called real by rank 0's figure."""
    from hf_distprof.analysis.judge.findings import slowest_rank
    from hf_distprof.analysis.judge.whatif import replay_pace
    from hf_distprof.analysis.results.across import RankVerdicts
    from hf_distprof.analysis.results.facts import BurstFacts
    from hf_distprof.analysis.results.findings import STEP_TIMER, Judgement
    from hf_distprof.core.burst import find_burst

    work = {0: [0.02] * 30, 1: [0.02] * 30}
    work[1][20] = 0.32
    burst = find_burst(work, list(range(5, 35)), [0.03] * 30, 10.0, None, None, "threshold")
    assert burst is not None and burst.single and burst.rank == 1 and burst.beside is None
    found = Judgement(kind="burst", severity=burst.pct, ranks=[1], facts=BurstFacts(burst), basis=STEP_TIMER)
    quiet = _verdict("quiet", 0, 30)
    verdicts = RankVerdicts(imbalance=quiet, straggler=quiet, run=quiet, run_real=True)
    assert replay_pace(verdicts, (0, 1), [found]) == (1, None)
    assert replay_pace(verdicts, (0, 1), []) == (0, 1)
    assert slowest_rank([found], verdicts, (0, 1), True, 1) == (1, "finding:burst")
    # Its pace is not called real by the run's figure, which is rank 0's (the run's candidate).
    from hf_distprof.analysis.judge.whatif import judge_scenarios
    from hf_distprof.analysis.results.across import RunEvidence
    from hf_distprof.analysis.results.whatif import WhatIf, WhatIfModel, WhatIfScenario

    pace = WhatIfScenario(scenario="slow_rank", title="rank 1 at its peers' median pace", ranks=[1], step_ms_now=30.0,
                          step_ms_predicted=25.0, saving_ms=5.0, saving_pct=16.7, hours_per_1000_steps=0.0,
                          error_ms=0.0, noise_ms=None, run_saving_pct=None)
    model = WhatIfModel(steps=[8, 9, 10], median_step=9, step_ms_measured=30.0, step_ms_replayed=30.0, error_ms=0.0,
                        noise_ms=1.0, sync_points=2, slowest_rank=1, fastest_rank=None, run_noise_ms=1.0, run_steps=30)
    evidence = RunEvidence(steps=30, noise_ms=1.0, slowest_rank=0, fastest_rank=1, excess_ms={0: 1.0}, step_ms=30.0)
    judged = judge_scenarios(WhatIf([pace], [], model), verdicts, evidence)
    assert (judged.scenarios[0].not_counted, judged.model.rank_saving_real) == ("verdict", False)
