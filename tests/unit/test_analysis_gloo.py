"""CPU/gloo analysis on the committed 2-rank traces (tests/data/make_gloo_traces.py wrote them)."""

from __future__ import annotations

import json

import gzip
from pathlib import Path

import orjson
import pytest

from hf_distprof.core.stats import fisher_p
from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_findings
from hf_distprof.analysis.read.events import parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def results() -> dict[str, AnalysisResult]:
    # what_if_pct=100: diagnose()'s findings alone (the what-if finding is tested in test_analysis_whatif.py).
    return {
        name: analyze_paths([DATA / name], AnalysisOptions(workers=1, what_if_pct=100))
        for name in ("clean", "slow_rank1", "slow_data")
    }


@pytest.mark.parametrize("scenario", ["clean", "slow_rank1", "slow_data"])
def test_parse_keeps_exact_counts(scenario: str) -> None:
    for rank in (0, 1):
        path = DATA / scenario / f"rank-{rank}.json.gz"
        doc = orjson.loads(gzip.decompress(path.read_bytes()))
        events = doc["traceEvents"]
        trace = parse_trace(path)
        assert trace.rank == rank and trace.world_size == 2 and trace.backend == "gloo"
        assert trace.n_events == len(events)
        assert [s.number for s in trace.steps] == [2, 3, 4, 5, 6, 7]
        gloo = [e for e in events if e.get("ph") == "X" and e["name"].startswith("gloo:")]
        assert len(trace.comm_spans) == len(gloo) == 12
        assert [n for _, _, n in trace.c10d_ops] == ["c10d::allreduce_"] * 12
        assert len(trace.gpu) == 0


def test_cpu_breakdown_adds_up_to_the_step(results: dict[str, AnalysisResult]) -> None:
    for result in results.values():
        for rank in result.ranks:
            assert rank.device == "cpu"
            for s in rank.steps:
                c = s.cpu
                # Disjoint parts (other is the remainder, so only the three measured ones can overrun the
                # step; exact parts are checked on a hand-built step in test_analysis_cpu).
                assert c.compute_us + c.communication_us + c.data_loading_us <= s.duration_us
                assert c.compute_us > 0 and c.communication_us > 0
                assert s.n_collectives == 2
                assert c.comm_backward_overlap_pct is not None and 0 <= c.comm_backward_overlap_pct <= 100


def test_slow_rank_is_named_not_the_waiting_one(results: dict[str, AnalysisResult]) -> None:
    result = results["slow_rank1"]
    cross = result.cross_rank
    assert cross is not None and cross.matched_collectives == 12
    assert [s.rank for s in cross.stragglers] == [1]
    late = {p.rank: p.lateness_us for p in cross.per_rank}
    assert late[0] == 0.0 and late[1] is not None and late[1] > 25_000  # rank 1 sleeps 30 ms per step
    wait = {p.rank: p.comm_wait_us for p in cross.per_rank}
    assert wait[0] > 25_000 > wait[1]  # the fast rank is the one that waits
    # One finding, the chain: rank 1's compute is slower (it sleeps in its forward), so it arrives late, so rank 0
    # waits. Rank 0's exposed communication is that wait, not the network: no communication-bound finding.
    assert [(f.kind, f.ranks) for f in result.findings] == [("slow_rank", [1])]
    (chain,) = result.findings
    assert chain.title == "Rank 1 holds the others back: its compute (forward, backward and optimizer)"
    assert "clocks aligned): rank 0 waits 46.4% of its step at all_reduce for rank 1." in chain.evidence
    assert "straggler verdict: rank 1's arrival at the step's collectives exceeds its peers'" in chain.evidence
    assert chain.numbers["phase_excess_ms"] == pytest.approx(29.267968587239583)
    assert chain.numbers["peer_wait_pct"] == pytest.approx(46.44022553790378)
    (row,) = result.ranks[0].comm_by_kind
    assert (row.kind, row.waited_for) == ("all_reduce", [1]) and row.wait_pct == pytest.approx(46.44022553790378)
    assert row.transfer_pct < 30.0 < row.exposed_pct  # the wait, not the transfer, crosses the threshold
    busy = {p.rank: p.busy_us for p in cross.per_rank}
    assert result.imbalance_pct == pytest.approx(100 * (busy[1] / busy[0] - 1))
    assert result.imbalance_pct == pytest.approx(101.86923811531842)  # rank 1 sleeps 30 ms in its forward
    assert "rank 1" in format_findings(result)


def test_clean_run_raises_no_alarm(results: dict[str, AnalysisResult]) -> None:
    result = results["clean"]
    assert result.findings == []
    assert result.cross_rank is not None and result.cross_rank.stragglers == []
    busy = {p.rank: p.busy_us for p in result.cross_rank.per_rank}
    assert result.imbalance_pct == pytest.approx(100 * (busy[0] / busy[1] - 1)) == pytest.approx(1.6257287030430945)
    assert "No finding" in format_findings(result)
    # Both questions were asked and answered "no", each with the evidence why.
    verdicts = (result.cross_rank.straggler_verdict, result.cross_rank.imbalance_verdict)
    assert [v.status for v in verdicts] == ["quiet", "quiet"] and all(v.steps == 6 for v in verdicts)
    assert result.undecided == []


def test_slow_data_loader_is_the_only_finding(results: dict[str, AnalysisResult]) -> None:
    result = results["slow_data"]
    assert [f.kind for f in result.findings] == ["data_loading_bound"]
    assert result.findings[0].ranks == [0, 1]
    for rank in result.ranks:
        for s in rank.steps:
            assert s.cpu.data_loading_us > 25_000  # the loader sleeps 30 ms per batch


def test_thresholds_are_options() -> None:
    strict = analyze_paths([DATA / "clean"], AnalysisOptions(workers=1, comm_bound_pct=1.0))
    assert {f.kind for f in strict.findings} == {"communication_bound"}
    lax = analyze_paths(
        [DATA / "slow_rank1"], AnalysisOptions(workers=1, straggler_pct=100, imbalance_pct=1000)
    )
    assert {"straggler", "imbalance"}.isdisjoint({f.kind for f in lax.findings})


def test_result_serialises_to_json(results: dict[str, AnalysisResult]) -> None:
    data = orjson.loads(results["slow_rank1"].to_json())
    assert data["imbalance_pct"] == pytest.approx(101.86923811531842)
    assert data["exposed_comm_pct"] == pytest.approx(27.794984464375865)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert [r["steps"][0]["step"] for r in data["ranks"]] == [2, 2] and len(data["ranks"][1]["steps"]) == 6
    assert [(f["kind"], f["ranks"]) for f in data["findings"]] == [("slow_rank", [1])]
    assert data["ranks"][0]["comm_by_kind"][0]["wait_pct"] == pytest.approx(46.44022553790378)


def test_every_finding_carries_a_confidence(results: dict[str, AnalysisResult]) -> None:
    findings = [f for result in results.values() for f in result.findings]
    assert {f.kind for f in findings} == {"slow_rank", "data_loading_bound"}
    assert all(f.confidence is not None and 0.5 < f.confidence <= 1.0 for f in findings)
    chain = next(f for f in results["slow_rank1"].findings if f.kind == "slow_rank")
    assert chain.confidence == 1 - 0.5**6  # last in 6 of 6 steps of 2 ranks


def _timing_logs(folder: Path, slow: float) -> None:
    """Step timer files beside the traces: steps 1-14, the traced steps 2-7 ``slow`` times the others."""
    import json
    import shutil

    for rank in (0, 1):
        shutil.copy(DATA / "clean" / f"rank-{rank}.json.gz", folder / f"rank-{rank}.json.gz")
        rows = [{"step": s, "step_s": 0.1 * (slow if 2 <= s <= 7 else 1.0)} for s in range(1, 15)]
        (folder / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_profilers_slowdown_is_read_from_the_timer_files_beside_the_traces(tmp_path: Path) -> None:
    _timing_logs(tmp_path, slow=2.0)
    result = analyze_paths([tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"], AnalysisOptions(workers=1))
    slowdown = result.profiler_slowdown
    assert slowdown is not None and slowdown["ratio"] == pytest.approx(2.0)
    # Step 1 is the timer's warm-up (left out); no step before the window, so steps 8-14 after it are the reference.
    assert (slowdown["steps_inside"], slowdown["steps_before"], slowdown["steps_after"]) == (6, 0, 7)
    assert (slowdown["noise_pct"], slowdown["median_step_s_reference"]) == (0.0, pytest.approx(0.1))
    (finding,) = [f for f in result.findings if f.kind == "profiler_slowdown"]
    assert finding.numbers == {"ratio": pytest.approx(2.0)} and finding.confidence == 1.0
    assert "2.00x" in finding.evidence
    # A run folder's timing_summary.json, when there, is what the timer measured with the options in effect.
    written = {"ratio": 1.1, "threshold_ratio": 1.25, "warning": None}
    (tmp_path / "timing_summary.json").write_text(json.dumps({"profiler_slowdown": written}))
    again = analyze_paths([tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"], AnalysisOptions(workers=1))
    assert again.profiler_slowdown == written
    assert "profiler_slowdown" not in {f.kind for f in again.findings}


def test_a_profiler_that_costs_little_raises_nothing(tmp_path: Path) -> None:
    _timing_logs(tmp_path, slow=1.1)
    result = analyze_paths([tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"], AnalysisOptions(workers=1))
    assert result.profiler_slowdown["ratio"] == pytest.approx(1.1) and result.findings == []
    assert ("Profiler slowdown: the 6 steps under the profiler (its warm-up and recorded steps) 1.10x the 7 untraced "
            "steps after the window's start (the run's own noise 0.0%); below 1.25x") in format_findings(result)


@pytest.mark.parametrize(("written", "line"), [
    # Above the threshold but within the run's noise (the step timer raised nothing): not called "below" it.
    ({"ratio": 1.35, "threshold_ratio": 1.25, "warning": None, "noise_pct": 40.0, "steps_inside": 5,
      "steps_before": 4, "steps_after": 12},
     "Profiler slowdown: the 5 steps under the profiler (its warm-up and recorded steps) 1.35x the 12 untraced steps "
     "after the window's start (the 4 before it left out: a run's first steps run slower), within the run's own noise "
     "of 40.0%: above the 1.25x threshold, but no slowdown the run can tell from its noise"),
    ({"ratio": 1.15, "threshold_ratio": 1.25, "warning": None, "noise_pct": 3.0, "steps_inside": 5,
      "steps_before": 0, "steps_after": 12},
     "Profiler slowdown: the 5 steps under the profiler (its warm-up and recorded steps) 1.15x the 12 untraced steps "
     "after the window's start (the run's own noise 3.0%); below 1.25x"),
    # A step of the window after an evaluation, left out of the count: said (a trial's 5-step window read "the 4").
    ({"ratio": 1.15, "threshold_ratio": 1.25, "warning": None, "noise_pct": 3.0, "steps_inside": 4,
      "steps_before": 0, "steps_after": 12, "steps_left_out": [10]},
     "Profiler slowdown: the 4 steps under the profiler (its warm-up and recorded steps; step 10 left out: it waited "
     "for an evaluation, a checkpoint or a trace's export) 1.15x the 12 untraced steps after the window's start (the "
     "run's own noise 3.0%); below 1.25x"),
    # An older summary: no noise, compared with every other step.
    ({"ratio": 1.1, "threshold_ratio": 1.25, "warning": None}, "Profiler slowdown: traced steps 1.10x the other steps; "
     "below 1.25x"),
    ({"ratio": None, "threshold_ratio": 1.25, "warning": None, "note": "not enough untraced steps (run more)"},
     "Profiler slowdown: not enough untraced steps (run more)"),
    # Above the threshold with no warning and no noise (not what the step timer writes): not called "below" it.
    ({"ratio": 1.4, "threshold_ratio": 1.25, "warning": None}, "Profiler slowdown: traced steps 1.40x the other steps; "
     "threshold 1.25x"),
])
def test_the_quiet_slowdown_line_says_why_it_is_quiet(tmp_path: Path, written: dict, line: str) -> None:
    import json
    import shutil

    for rank in (0, 1):
        shutil.copy(DATA / "clean" / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
    (tmp_path / "timing_summary.json").write_text(json.dumps({"profiler_slowdown": written}))
    result = analyze_paths([tmp_path], AnalysisOptions(workers=1))
    assert result.profiler_slowdown == written and result.slowdown_line == line
    assert format_findings(result).splitlines().count(line) == 1
    assert "slowdown_line" not in result.to_dict()


@pytest.mark.parametrize("bad", [{"steps_after": float("nan")}, {"noise_pct": float("nan")}, {"steps_inside": "5"},
                                 {"note": 3}])
def test_a_slowdown_edited_by_hand_is_ignored_as_an_unreadable_one(tmp_path: Path, bad: dict) -> None:
    import json
    import shutil

    for rank in (0, 1):
        shutil.copy(DATA / "clean" / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
    written = {"ratio": 1.1, "threshold_ratio": 1.25, "warning": None, "noise_pct": 3.0, "steps_inside": 5,
               "steps_before": 0, "steps_after": 12, **bad}
    (tmp_path / "timing_summary.json").write_text(json.dumps({"profiler_slowdown": written}))
    result = analyze_paths([tmp_path], AnalysisOptions(workers=1))
    assert result.profiler_slowdown is None and result.slowdown_line is None


def test_rank_findings_of_a_distorted_window_against_a_quiet_timer_are_withheld(tmp_path: Path) -> None:
    import json
    import shutil

    for rank in (0, 1):
        shutil.copy(DATA / "slow_rank1" / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
    files = [tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"]
    summary = {"profiler_slowdown": {"ratio": 1.4, "threshold_ratio": 1.25, "warning": "the profiler slows ..."},
               "imbalance_verdict": {"status": "quiet", "reason": "rank 1 ... within the 10% threshold"}}
    (tmp_path / "timing_summary.json").write_text(json.dumps(summary))
    result = analyze_paths(files, AnalysisOptions(workers=1))
    assert {"straggler", "imbalance", "slow_rank"}.isdisjoint(f.kind for f in result.findings)
    assert "profiler_slowdown" in {f.kind for f in result.findings}
    assert [u.question for u in result.undecided] == ["straggler", "imbalance"]
    assert "ran 1.40x slower than the rest of the run" in result.undecided[0].reason
    assert result.undecided[0].basis == "trace + step timer"
    assert result.undecided[0].to_decide == ("trace again with fewer profiler options (the profiler-slowdown finding "
                                             "names the costly ones), so that the traced steps run like the others")
    # The timer saw the same rank slow outside the window: the trace's findings stand.
    summary["imbalance_verdict"] = {"status": "raised", "rank": 1}
    (tmp_path / "timing_summary.json").write_text(json.dumps(summary))
    kinds = {f.kind for f in analyze_paths(files, AnalysisOptions(workers=1)).findings}
    assert "slow_rank" in kinds  # straggler and imbalance, as one chain
    # An undistorted window keeps them when the timer could not judge the other steps.
    summary = {"profiler_slowdown": {"ratio": 1.1, "threshold_ratio": 1.25, "warning": None},
               "imbalance_verdict": {"status": "undecided", "steps": 3}}
    (tmp_path / "timing_summary.json").write_text(json.dumps(summary))
    assert "slow_rank" in {f.kind for f in analyze_paths(files, AnalysisOptions(workers=1)).findings}
    # But when the timer judged them and names no slow rank, rank 1 was slow in the window only: no finding.
    summary["imbalance_verdict"] = {"status": "quiet", "rank": 0, "p_value": 0.5, "steps": 11, "reason": "r0 ..."}
    (tmp_path / "timing_summary.json").write_text(json.dumps(summary))
    result = analyze_paths(files, AnalysisOptions(workers=1))
    assert {"straggler", "imbalance", "slow_rank"}.isdisjoint(f.kind for f in result.findings)
    assert result.cross_rank.stragglers == []
    for verdict in (result.cross_rank.straggler_verdict, result.cross_rank.imbalance_verdict):
        # Last in 6 of 6 traced steps (p = 1/64) against a timer leaning to rank 0 at p = 0.5 (0.5 for rank 1).
        assert (verdict.status, verdict.gate, verdict.rank) == ("quiet", "outside", 1)
        assert verdict.p_value == pytest.approx(fisher_p(1 / 64, 0.5))
        assert verdict.reason.endswith("over the run's 11 untraced steps the step timer says: r0 ... (for the "
                                       "window's rank 1, p = 0.500); together p = 0.046 (Fisher), not below 0.02: "
                                       "slow in the traced window, not across the run")


def test_the_wait_for_a_cpu_is_read_from_the_timer_files_beside_the_traces(tmp_path: Path) -> None:
    from hf_distprof.analysis.read.timer_records import read_timer_records

    for rank, wait in ((0, 0.02), (1, 0.0)):
        rows = [{"step": s, "step_s": 0.1, "cpu_wait_s": wait} for s in range(1, 4)]
        rows += [{"step": 5, "cpu_wait_s": -1.0}, {"step": 6, "cpu_wait_s": None}]
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "timing_rankX.jsonl").write_text('{"step": 1, "cpu_wait_s": 0.5}\n')  # no rank in the name
    # A garbled line is left out and named with its file and line (compare refuses such a run); the file's other lines
    # are read: one bad line must not cost a rank its records (a cut-short last line of a killed run is no bad line).
    garbled = {2: ['{"step": 1, "cpu_wait_s": 0.5}', "{not json", '{"step": 3, "cpu_wait_s": 0.5}'],
               3: ['{"step": 1, "cpu_wait_s": "x"}'], 4: ['["not", "a", "row"]'], 5: ['{"step": "7"}'],
               6: ['{"step": 1, "cpu_wait_s": 0.1}', '{"step": 2, "cpu_']}
    for rank, lines in garbled.items():
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    files = [str(tmp_path / "rank-0.json.gz"), str(tmp_path / "rank-1.json.gz")]
    from hf_distprof.analysis.across.evidence import timer_figures

    records = read_timer_records(files)
    none = "that line is left out, no record of this rank read"
    assert records.skipped == [
        (str(tmp_path / "timing_rank2.jsonl"), "line 2: not JSON (Expecting property name enclosed in double quotes): "
                                               "that line is left out, the others read"),
        (str(tmp_path / "timing_rank3.jsonl"), f"line 1: 'cpu_wait_s' is 'x', not a number: {none}"),
        (str(tmp_path / "timing_rank4.jsonl"), f"line 1: a record without a 'step': {none}"),
        (str(tmp_path / "timing_rank5.jsonl"), f"line 1: 'step' is '7', not a number: {none}"),
    ]
    assert sorted(records.rows) == [0, 1, 2, 6]
    assert timer_figures(records, set()).cpu_wait == {0: {1: 0.02, 2: 0.02, 3: 0.02}, 1: {1: 0.0, 2: 0.0, 3: 0.0},
                                                      2: {1: 0.5, 3: 0.5}, 6: {1: 0.1}}


def test_analyze_names_a_garbled_timer_line_it_reads_around(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare refuses a run whose timing_rank{R}.jsonl has a garbled line; analyze read the lines around it in
    silence. It still reads them (a rank's records lost for one line cleared the slow rank), and now says so, where it
    says every file it could not read."""
    import shutil

    from hf_distprof.analysis import format_box
    from hf_distprof.analysis.results.rank import FileError
    from hf_distprof.cli.main import main

    for rank in (0, 1):
        shutil.copy(DATA / "slow_rank1" / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
    files = [tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"]
    (tmp_path / "timing_rank0.jsonl").write_text('{"step": 1, "step_s": 0.1}\n{"step": 2, "step_s": 0.1}\n')
    (tmp_path / "timing_rank1.jsonl").write_text('{"step": 1, "step_s": 0.1}\ngarbage\n{"step": 2, "step_s": 0.1}\n')
    result = analyze_paths(files, AnalysisOptions(workers=1))
    why = "line 2: not JSON (Expecting value): that line is left out, the others read"
    assert result.errors == [FileError(str(tmp_path / "timing_rank1.jsonl"), why)]
    assert [r.rank for r in result.ranks] == [0, 1]
    assert "1 file(s) skipped or read in part; the answer covers the 2 ranks read" in format_box(result)
    assert main(["analyze", *map(str, files)]) == 0
    err = capsys.readouterr().err
    assert f"hf-distprof analyze: skipped {tmp_path / 'timing_rank1.jsonl'}: {why}" in err.splitlines()
