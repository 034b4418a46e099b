"""``hf-distprof analyze`` / ``merge`` front ends, the report folder, and the merged trace."""

from __future__ import annotations

import gzip
import shutil
import statistics
from pathlib import Path

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_findings, format_summary
from hf_distprof.analysis.merge import merge_traces, write_merged
from hf_distprof.analysis.tell.report import (
    BREAKDOWN_PNG,
    COMM_PNG,
    LATENESS_PNG,
    PHASES_PNG,
    REPORT_HTML,
    REPORT_MD,
    RESULT_JSON,
    STEPS_PNG,
)
from hf_distprof.analysis.tell.whatif import CRITICAL_PATH_PNG
from hf_distprof.cli.main import build_parser, main

DATA = Path(__file__).resolve().parents[1] / "data"
PNGS = (BREAKDOWN_PNG, STEPS_PNG, PHASES_PNG, LATENESS_PNG, COMM_PNG, CRITICAL_PATH_PNG)


def test_subcommands_registered_and_thresholds_are_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["analyze", "x", "--comm-bound-pct", "25", "--straggler-min-us", "10"])
    assert args.comm_bound_pct == 25.0 and args.straggler_min_us == 10.0 and args.imbalance_pct == 10.0
    assert parser.parse_args(["merge", "x"]).align == "collectives"


def test_analyze_json_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["analyze", str(DATA / "slow_rank1"), "--json", "--workers", "1", "--report", str(tmp_path / "rep")]
    )
    assert rc == 0
    data = orjson.loads(capsys.readouterr().out)
    # The slow rank's chain opens the diagnosis's findings (a "what to fix first" from the what-if replay, when its
    # saving is beyond the noise, may come before it: test_analysis_whatif.py checks that).
    diagnosed = [(f["kind"], f["ranks"]) for f in data["findings"] if f["kind"] != "what_to_fix_first"]
    assert diagnosed[0] == ("slow_rank", [1])
    for name in (REPORT_MD, REPORT_HTML, RESULT_JSON):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    for name in PNGS:
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    html = (tmp_path / "rep" / REPORT_HTML).read_text()
    assert html.count("data:image/png;base64,") == len(PNGS) and "Rank 1 holds the others back" in html
    assert ("Rank 1 holds the others back: its compute (forward, backward and optimizer)**, confidence 0.98"
            in (tmp_path / "rep" / REPORT_MD).read_text())


def test_analyze_text_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(DATA / "clean"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "Analysed 2 rank(s), 0 file(s) skipped or read in part." in out and "No finding" in out


def test_exit_status_nonzero_only_when_nothing_analysed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rank0.json").write_bytes(b"")
    assert main(["analyze", str(tmp_path), "--workers", "1"]) == 1
    assert "rank0.json: empty file" in capsys.readouterr().err
    shutil.copy(DATA / "clean" / "rank-1.json.gz", tmp_path / "rank1.json.gz")
    assert main(["analyze", str(tmp_path), "--workers", "1"]) == 0
    assert main(["analyze", str(tmp_path / "missing")]) == 2


def test_parallel_workers_give_the_same_result() -> None:
    serial = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=1)).to_dict()
    parallel = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=2)).to_dict()
    assert serial.pop("options")["workers"] == 1 and parallel.pop("options")["workers"] == 2
    assert serial == parallel


def test_merge_one_process_per_rank_with_aligned_clocks(tmp_path: Path) -> None:
    out = tmp_path / "merged.json.gz"
    res = merge_traces([DATA / "slow_rank1"], out, options=AnalysisOptions(workers=1))
    assert res.align == "collectives" and res.matched_collectives == 12 and res.ranks == [0, 1]
    merged = orjson.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in merged if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        src = orjson.loads(gzip.decompress((DATA / "slow_rank1" / f"rank-{rank}.json.gz").read_bytes()))[
            "traceEvents"
        ]
        src_x = sorted(e["ts"] for e in src if e.get("ph") == "X")
        out_x = sorted(e["ts"] for e in merged if e.get("ph") == "X" and e["pid"] == rank)
        assert len(out_x) == len(src_x)
        assert out_x == pytest.approx([t + res.shifts_us[rank] for t in src_x])
    # After alignment the matched collectives end together on both ranks (median within 0.2 ms; a single
    # one may not, since a descheduled gloo thread finishes late, which is why the median is used).
    ends = {
        rank: sorted(
            e["ts"] + e["dur"]
            for e in merged
            if e.get("ph") == "X" and e["pid"] == rank and e["name"].startswith("gloo:")
        )
        for rank in (0, 1)
    }
    diffs = sorted(abs(a - b) for a, b in zip(ends[0], ends[1]))
    assert len(diffs) == 12 and statistics.median(diffs) < 200
    none = merge_traces(
        [DATA / "slow_rank1"], tmp_path / "n.json.gz", align="none", options=AnalysisOptions(workers=1)
    )
    assert none.align == "none" and none.shifts_us == {0: 0.0, 1: 0.0}  # same host, same baseTimeNanoseconds
    with pytest.raises(ValueError, match="align must be one of"):
        merge_traces([DATA / "slow_rank1"], tmp_path / "x.json.gz", align="bogus")


def test_report_that_cannot_be_written_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "rep"
    assert main(["analyze", str(DATA / "clean"), "--workers", "1", "--report", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert err == f"hf-distprof analyze: --report {bad}: Not a directory\n"
    assert out == ""  # said before the analysis runs, not after its tables
    # Every report file is renamed into place only when complete: no temporary file is left behind.
    rep = tmp_path / "rep"
    assert main(["analyze", str(DATA / "clean"), "--workers", "1", "--report", str(rep)]) == 0
    assert sorted(p.name for p in rep.iterdir()) == sorted([REPORT_MD, REPORT_HTML, RESULT_JSON, *PNGS])


def test_merge_output_that_cannot_be_written_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "adir").mkdir()
    missing = tmp_path / "nope" / "m.json.gz"
    for out, reason in ((tmp_path / "adir", "Is a directory"), (missing, "No such directory")):
        assert main(["merge", str(DATA / "clean"), "--workers", "1", "-o", str(out)]) == 2
        assert capsys.readouterr().err == f"hf-distprof merge: --output {out}: {reason}\n"
    # Past the CLI's early check, the library names the output, never its temporary file, and cleans up.
    result = analyze_paths([DATA / "clean"], AnalysisOptions(workers=1))
    with pytest.raises(FileNotFoundError) as exc:
        write_merged(result, missing)
    assert exc.value.filename == str(missing)
    with pytest.raises(IsADirectoryError):
        write_merged(result, tmp_path / "adir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"] and not list((tmp_path / "adir").iterdir())
    assert main(["merge", str(DATA / "clean"), "--workers", "1", "-o", str(tmp_path / "m.json.gz")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "m.json.gz"]



def test_merge_never_writes_over_or_among_the_traces_it_merges(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A trial: -o over rank 0's own trace replaced it, and analyze of the folder then read rank 0's steps twice.
    run = tmp_path / "run"
    shutil.copytree(DATA / "clean", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    trace = run / "rank-0.json.gz"
    for out, why in ((trace, "it is one of the traces it merges"),
                     (run / "rank0_merged.json", f"it would lie among the traces it merges ({run}) under a rank's")):
        assert main(["merge", str(run), "--workers", "1", "-o", str(out)]) == 2
        assert capsys.readouterr().err.startswith(f"hf-distprof merge: --output {out}: {why}")
    assert main(["merge", str(trace), "--workers", "1", "-o", str(trace)]) == 2  # the file given itself
    assert "it is one of the traces it merges" in capsys.readouterr().err
    # The files given, not their folder: a rank-named output beside them too (a review).
    assert main(["merge", str(trace), str(run / "rank-1.json.gz"), "--workers", "1", "-o",
                 str(run / "rank0_merged.json.gz")]) == 2
    assert "under a rank's trace name" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert main(["merge", str(run), "--workers", "1", "-o", str(run / "all_ranks.json.gz")]) == 0  # a name of its own
    assert "shifts rank 0: +0.000 ms" in capsys.readouterr().out  # (never "-0.000")


def test_bad_option_names_the_flag_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(DATA / "clean"), "--workers", "-1"]) == 2
    assert capsys.readouterr().err == "hf-distprof analyze: error: --workers must be >= 0, got -1\n"
    assert main(["analyze", str(DATA / "clean"), "--comm-bound-pct", "200"]) == 2
    assert capsys.readouterr().err == (
        "hf-distprof analyze: error: --comm-bound-pct is a percentage in [0, 100], got 200.0\n"
    )
    assert main(["analyze", str(DATA / "clean"), "--profiler-slowdown-threshold", "0"]) == 2
    assert capsys.readouterr().err == "hf-distprof analyze: error: --profiler-slowdown-threshold must be > 0, got 0.0\n"
    assert main(["analyze", str(DATA / "clean"), "--profiler-slowdown-threshold", "-1"]) == 2  # (not ">= 0")
    assert capsys.readouterr().err == ("hf-distprof analyze: error: --profiler-slowdown-threshold must be > 0, got "
                                       "-1.0\n")
    assert main(["merge", str(DATA / "clean"), "--workers", "-1"]) == 2
    assert capsys.readouterr().err == "hf-distprof merge: error: --workers must be >= 0, got -1\n"
    with pytest.raises(ValueError, match=r"^AnalysisOptions.workers must be >= 0, got -1$"):
        AnalysisOptions(workers=-1)  # API users see the field's name


def test_nothing_analysed_prints_no_headline_and_each_skip_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rank0.json").write_bytes(b"")
    assert main(["analyze", str(tmp_path), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == "Analysed 0 rank(s), 1 file(s) skipped or read in part.\n"
    assert err.count("rank0.json") == 1 and "Headline" not in err
    shutil.copy(DATA / "clean" / "rank-1.json.gz", tmp_path / "rank1.json.gz")
    assert main(["analyze", str(tmp_path), "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    assert "Analysed 1 rank(s), 1 file(s) skipped or read in part." in out
    assert "Headline:" in out and "rank0.json" not in out
    assert err.count("rank0.json") == 1
    # The hook's findings text, printed alone, still lists the skipped file (and no zero headline).
    result = analyze_paths([tmp_path / "rank0.json"], AnalysisOptions(workers=1))
    assert format_findings(result) == f"Skipped {tmp_path / 'rank0.json'}: empty file"


def test_message_sizes_takes_only_its_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(DATA / "clean"), "--message-sizes", "bogus"])
    assert exc.value.code == 2
    assert "--message-sizes: invalid choice: 'bogus' (choose from 'auto', 'shapes')" in capsys.readouterr().err


def test_running_one_subcommand_imports_only_its_own_code() -> None:
    import subprocess
    import sys

    code = ("import sys; from hf_distprof.cli.main import main; "
            f"main(['analyze', {str(DATA / 'clean')!r}, '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith(('hf_distprof.cli.', 'hf_distprof.doctor', "
            "'hf_distprof.autorun', 'hf_distprof.collectives', 'hf_distprof.analysis.merge'))), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "['hf_distprof.cli.analyze', 'hf_distprof.cli.main']"
    # Help without a subcommand still lists every one.
    assert [a.dest for a in build_parser()._subparsers._group_actions][0] == "command"  # type: ignore[union-attr]
    assert len(build_parser()._subparsers._group_actions[0].choices) == 9  # type: ignore[union-attr]


def test_worker_processes_start_only_when_the_traces_pay_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from hf_distprof.analysis.rank import workers

    files = [str(p) for p in sorted((DATA / "clean").glob("*.json.gz"))]
    assert workers.worker_count(files, 0) == 1  # 76 kB in all: read here, one after the other
    assert workers.worker_count(files, 3) == 3  # as asked
    monkeypatch.setattr(workers, "PARALLEL_BYTES", sum(os.path.getsize(f) for f in files))
    assert workers.worker_count(files, 0) == min(2, os.cpu_count() or 1)


def test_log_to_tensorboard_sends_the_answer_analyze_json_gives(tmp_path, capsys):
    import json as _json


    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_distprof.cli.main import main as cli_main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "golden" / "cpu_slow_data", run)
    assert cli_main(["analyze", str(run), "--json"]) == 0
    reference = _json.loads(capsys.readouterr().out)
    assert reference["schema_version"] == 2
    assert cli_main(["analyze", str(run), "--findings", "--log-to", "tensorboard"]) == 0
    err = capsys.readouterr().err
    assert f"TensorBoard: {run / 'tensorboard'}" in err
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    last = _json.loads((run / "timing_summary.json").read_text())["last_step"]
    scalars = {tag: acc.Scalars(tag)[-1] for tag in acc.Tags()["scalars"]}
    assert scalars["hf_distprof/exposed_comm_pct"].step == last == 30
    assert scalars["hf_distprof/exposed_comm_pct"].value == pytest.approx(reference["exposed_comm_pct"], rel=1e-6)
    assert scalars["hf_distprof/imbalance_pct"].value == pytest.approx(reference["imbalance_pct"], rel=1e-6)
    for scenario in reference["what_if"]:
        # The saving that counts, in ms and in %, one figure (a trial read 54.12 ms beside 28.75%: the replay's ms
        # beside the run's %): the run's figure of the measured step when it is the smaller.
        run_pct = scenario["run_saving_pct"]
        held = run_pct is not None and run_pct < scenario["saving_pct"]
        pct = run_pct if held else scenario["saving_pct"]
        ms = scenario["step_ms_now"] * pct / 100 if held else scenario["saving_ms"]
        assert scalars[f"hf_distprof/whatif/{scenario['scenario']}_saving_ms"].value == pytest.approx(ms, rel=1e-6)
        assert scalars[f"hf_distprof/whatif/{scenario['scenario']}_saving_pct"].value == pytest.approx(pct, rel=1e-6)
    text = acc.Tensors("hf_distprof/answer")[-1].tensor_proto.string_val[0].decode()
    assert "Rank 1 holds the others back: its data loading" in text and "| finding | ranks |" in text


@pytest.mark.parametrize("steps", [[10], [4, 5, 6, 7], [1, 2, 4, 5], [8, 9, 10, 31, 32]])
def test_the_report_s_step_axes_tick_whole_steps_even_for_one_step(steps: list[int]) -> None:
    # One traced step (the shared DLRM set's step 10) once got ticks 9.5, 9.6, ... 10.5: matplotlib's integer
    # locator gives up on integers when fewer than two fall in view. Steps that do not follow each other (a step left
    # out after a checkpoint; two windows) were spread over the gap, a column partly over a step with no data (a
    # review): a column per step, labelled with its number.
    from hf_distprof.analysis.tell import report
    from hf_distprof.analysis.tell.plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    report._heatmap(ax, [[float(s) for s in steps]] * 2, [0, 1], steps, "t", "%")
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert ticks == [float(i) for i in range(len(steps))]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(s) for s in steps]
    assert ax.images[0].get_extent()[:2] == [-0.5, len(steps) - 0.5]
    plt.close(fig)


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``hf-distprof analyze RUN | head``: the pipe closes before the output is written; the command stops quietly
    with the shell's SIGPIPE status, not a BrokenPipeError traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(DATA / "slow_rank1"),
                             "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the analysis (a few hundred ms) prints anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_lateness_plot_leaves_a_step_without_matched_collectives_blank() -> None:
    """A rank with no matched collective in a step has no lateness there: a blank cell (NaN), not 0 ms ("on time")."""
    import math

    from hf_distprof.analysis.tell.report import lateness_rows

    result = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=1))
    late = result.cross_rank.per_rank[1]
    steps, rows = lateness_rows(result)
    assert steps == late.lateness_steps and rows[1] == [us / 1e3 for us in late.lateness_per_step_us]
    dropped = late.lateness_steps[1]
    del late.lateness_steps[1], late.lateness_per_step_us[1]
    steps, rows = lateness_rows(result)
    column = steps.index(dropped)
    assert math.isnan(rows[1][column]) and not math.isnan(rows[0][column])


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a reader that closed stdout is a quiet exit: a BrokenPipeError from another pipe (a worker process's, a
    launched command's) is an error the user must see."""
    from hf_distprof.cli import analyze as analyze_cli

    def broken(args: object) -> int:
        raise BrokenPipeError("a worker's pipe")

    monkeypatch.setattr(analyze_cli, "run", broken)
    with pytest.raises(BrokenPipeError, match="a worker's pipe"):
        main(["analyze", str(DATA / "clean")])


def test_the_profiler_slowdown_is_judged_at_the_threshold_given(capsys: pytest.CaptureFixture[str]) -> None:
    """A run that ended normally has timing_summary.json's slowdown, judged at the training's threshold; analyze's own
    --profiler-slowdown-threshold judges it again from the records (it was ignored: "below 1.25x" at any value)."""
    run = DATA / "golden" / "cpu_clean_memory"
    assert main(["analyze", str(run), "--workers", "1", "--findings"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Profiler slowdown:")]
    assert line == ["Profiler slowdown: the 5 steps under the profiler (its warm-up and recorded steps) 0.94x the 12 "
                    "untraced steps after the window's start (the 4 before it left out: a run's first steps run "
                    "slower), within the run's own noise of 30.0%; below 1.25x"]
    assert main(["analyze", str(run), "--workers", "1", "--json", "--profiler-slowdown-threshold", "0.5"]) == 0
    slowdown = orjson.loads(capsys.readouterr().out)["profiler_slowdown"]
    assert (slowdown["threshold_ratio"], round(slowdown["ratio"], 2), slowdown["steps_inside"], slowdown["warning"]) \
        == (0.5, 0.94, 5, None)  # above 0.5x, within the run's noise: still no finding
    assert main(["analyze", str(run), "--workers", "1", "--findings", "--profiler-slowdown-threshold", "0.5"]) == 0
    assert ("within the run's own noise of 30.0%: above the 0.5x threshold, but no slowdown the run can tell from its "
            "noise") in capsys.readouterr().out


def test_the_traces_of_two_runs_are_refused_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder holding two runs (rank 0's traces in both) was analysed as one: the traces of the first, the step
    timer's records and verdict of the other. Folders holding different ranks are the nodes of one run."""
    golden = DATA / "golden" / "cpu_clean_memory"
    for name in ("own", "viarun"):
        shutil.copytree(golden, tmp_path / "P" / name)
    assert main(["analyze", str(tmp_path / "P"), "--workers", "1", "--report", str(tmp_path / "rep")]) == 2
    assert not (tmp_path / "rep").exists()  # made to check it can be written, taken back when nothing was
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"hf-distprof analyze: error: {tmp_path / 'P'} holds the traces of 2 runs ({tmp_path}/P/"
                            f"own, {tmp_path}/P/viarun: rank 0 in each); give one run folder at a time (hf-distprof"
                            " compare sets runs side by side)\n")
    assert main(["analyze", str(tmp_path / "P" / "own"), "--workers", "1", "--findings"]) == 0
    capsys.readouterr()
    # One run's two nodes copied into two folders: each holds its own ranks' traces and records.
    for node, rank in (("node0", 0), ("node1", 1)):
        (tmp_path / "N" / node).mkdir(parents=True)
        for name in (f"rank{rank}_vm_step8-10.pt.trace.json.gz", f"timing_rank{rank}.jsonl"):
            shutil.copy(golden / name, tmp_path / "N" / node / name)
    split = analyze_paths([tmp_path / "N"], AnalysisOptions(workers=1))
    whole = analyze_paths([golden], AnalysisOptions(workers=1))
    assert [r.rank for r in split.ranks] == [0, 1] and not split.errors
    assert split.what_if_model is not None and whole.what_if_model is not None
    assert split.what_if_model.run_steps == whole.what_if_model.run_steps == 24  # both ranks' records, as one run's
    # With every file on the node that wrote it (rank 0's: the manifest too), nothing the manifest lists is lost: a
    # trial's two node folders given together read "6 file(s) listed in the manifest are missing from the folder".
    for f in golden.iterdir():
        node = "node1" if f.name.startswith(("rank1", "timing_rank1", "memory_rank1", "manifest_rank1")) else "node0"
        shutil.copy(f, tmp_path / "N" / node / f.name)
    split = analyze_paths([tmp_path / "N" / "node0", tmp_path / "N" / "node1"], AnalysisOptions(workers=1))
    assert split.run is not None and split.run.missing_files == []
    (tmp_path / "N" / "node1" / "timing_rank1.jsonl").unlink()
    lost = analyze_paths([tmp_path / "N" / "node0", tmp_path / "N" / "node1"], AnalysisOptions(workers=1))
    assert lost.run is not None and len(lost.run.missing_files) == 1
    assert "timing_rank1.jsonl (rank 1 on host vm) but none of the folders given holds it" in lost.run.missing_files[0]


def test_a_run_with_a_rank_s_trace_unread_withholds_what_weighs_the_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0's trace truncated: rank 1's wait for rank 0 inside its collectives reads as the transfer. It said "What to
    fix first: exposed communication hidden, 56.5%" and "Communication-bound"; now both are withheld, naming rank 0,
    the what-if is not replayed (its table, and the saving the trackers get, would be the same mistake), and the box
    says which ranks the answer covers."""
    from hf_distprof.analysis import format_box
    from hf_distprof.analysis.tell.tracker import headline

    run = tmp_path / "run"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    trace = run / "rank0_vm_step8-10.pt.trace.json.gz"
    trace.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    result = analyze_paths([run], AnalysisOptions(workers=1))
    assert [r.rank for r in result.ranks] == [1] and [Path(e.path).name for e in result.errors] == [trace.name]
    assert [f.kind for f in result.findings] == [] and result.unread_ranks == [0]
    why = ("withheld: the trace of rank 0 is not among those read (not given, or could not be read), so the other "
           "ranks' time in collectives cannot be told apart into waiting for rank 0 and the transfer")
    assert [(u.question, u.why) for u in result.undecided] == [
        ("communication_bound", f"Communication-bound {why}"), ("what_if", f"The what-if replay across ranks {why}")]
    assert result.what_if == [] and result.what_if_model is None and headline(result)["predicted_saving"] is None
    box = " ".join(" ".join(line.strip("|").split()) for line in format_box(result).splitlines())
    assert "Verdict: not enough evidence for a verdict across ranks" in box
    assert ("Skipped: 1 file(s) skipped or read in part; no trace of rank 0 read: the answer covers the 1 rank read"
            in box)
    # Rank 1's trace alone, given on purpose from the intact run: the same, nothing skipped.
    alone = analyze_paths([DATA / "golden" / "cpu_clean_memory" / "rank1_vm_step8-10.pt.trace.json.gz"],
                          AnalysisOptions(workers=1))
    assert alone.unread_ranks == [0] and not alone.errors
    assert [u.question for u in alone.undecided] == ["communication_bound", "what_if"]
    assert "Skipped" not in format_box(alone)
    # Without the manifest the traces say their world (distributedInfo.world_size 2): rank 0 is missing all the same.
    (run / "manifest.json").unlink()
    for part in run.glob("manifest_rank*"):
        part.unlink()
    bare = analyze_paths([run], AnalysisOptions(workers=1))
    assert bare.unread_ranks == [0] and [u.question for u in bare.undecided] == ["communication_bound", "what_if"]


def test_a_trace_of_another_run_in_the_folder_is_left_out_naming_the_one_the_manifest_lists(tmp_path: Path) -> None:
    # A trial: node folders gathered with `cp -rn` kept an earlier job's rank-0 trace (another host's name) beside
    # this run's; the earlier one was read (name order) and this run's skipped as "already read", and the analysis
    # printed a negative step time and a saving above 100%.
    run = tmp_path / "run"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    stale = run / "rank0_hostX_step8-10.pt.trace.json.gz"
    shutil.copy(run / "rank0_vm_step8-10.pt.trace.json.gz", stale)
    result = analyze_paths([run], AnalysisOptions(workers=1))
    assert [r.rank for r in result.ranks] == [0, 1]
    assert [r.path for r in result.ranks][0].endswith("rank0_vm_step8-10.pt.trace.json.gz")
    assert [(e.path, e.reason) for e in result.errors] == [(str(stale), (
        "another run's trace: the run's manifest lists rank0_vm_step8-10.pt.trace.json.gz for rank 0's steps 8-10, "
        "not this file (a node-local folder that held an earlier run of the name, or files copied in from another "
        "job); left out"))]
    clean = analyze_paths([DATA / "golden" / "cpu_clean_memory"], AnalysisOptions(workers=1))
    assert result.to_dict()["findings"] == clean.to_dict()["findings"]
    # A trace gunzipped in place is the one the manifest lists, not another run's.
    stale.unlink()
    listed = run / "rank1_vm_step8-10.pt.trace.json.gz"
    (run / "rank1_vm_step8-10.pt.trace.json").write_bytes(gzip.decompress(listed.read_bytes()))
    listed.unlink()
    plain = analyze_paths([run], AnalysisOptions(workers=1))
    assert [r.rank for r in plain.ranks] == [0, 1] and plain.errors == []


def test_the_ranks_expected_come_from_the_manifest_else_the_traces_world() -> None:
    from types import SimpleNamespace

    from hf_distprof.analysis.api import _expected_ranks

    def run(world: int, windows: list[list[int]] | None, profile: str | None = "0,5,7") -> SimpleNamespace:
        manifest = None if windows is None else SimpleNamespace(
            world_size=world, windows=[SimpleNamespace(ranks=w) for w in windows], profile_ranks=profile)
        return SimpleNamespace(run=manifest)

    def ranks(*worlds: int | None) -> list[SimpleNamespace]:
        return [SimpleNamespace(world_size=w) for w in worlds]

    assert _expected_ranks(run(8, [[0, 5], [5, 7]]), ranks(8)) == [0, 5, 7]  # --profile-ranks: the windows' ranks
    assert _expected_ranks(run(4, []), ranks(4)) == [0, 1, 2, 3]  # no window listed: every rank
    # Every rank was to trace (no --profile-ranks): one the window lacks died in it, or lost its trace (a trial's
    # crashed rank 1 "took no profiler window (--profile-ranks)").
    assert _expected_ranks(run(2, [[0]], "all"), ranks(2)) == _expected_ranks(run(2, [[0]], None), ranks(2)) == [0, 1]
    assert _expected_ranks(run(0, None), ranks(4, 4)) == [0, 1, 2, 3]  # no manifest: the traces' world
    assert _expected_ranks(run(0, None), ranks(4, 2)) is None  # traces that disagree say nothing
    assert _expected_ranks(run(0, None), ranks(None)) is None  # nor traces without distributedInfo


def _profiled_ranks(tmp_path: Path, keep: int) -> Path:
    """The slow-data run (rank 1 loads 30 ms more per step) as ``--profile-ranks {keep}`` leaves it: one rank's trace,
    the manifest's window on that rank, every rank's step timer records."""
    run = tmp_path / f"only{keep}"
    shutil.copytree(DATA / "golden" / "cpu_slow_data", run)
    for other in run.glob(f"rank{1 - keep}_vm_step*"):
        other.unlink()
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    manifest["profile_ranks"] = str(keep)
    manifest["windows"][0]["ranks"] = [keep]
    manifest["files"] = [f for f in manifest["files"] if (run / f["name"]).exists()]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run


def test_with_profile_ranks_the_step_timer_s_slow_rank_stands_and_the_traced_rank_s_waits_are_not_its_transfers(
        tmp_path: Path) -> None:
    # A trial: --profile-ranks 1 on 2 ranks, rank 0 the slow one. The analysis dropped the step timer's raised verdict
    # (one trace: no verdict across ranks at all), called rank 1 communication-bound and put "exposed communication
    # hidden" first, from rank 1's wait for rank 0, which no trace measured; its headline read "load imbalance 0.0%".
    result = analyze_paths([_profiled_ranks(tmp_path, 0)], AnalysisOptions(workers=1))
    assert [r.rank for r in result.ranks] == [0] and not result.errors and result.unread_ranks == []
    assert [(f.kind, f.ranks) for f in result.findings] == [("slow_rank", [1])]  # the step timer's, over the run
    assert result.findings[0].basis == "step timer"  # (it read "trace + step timer": no window verdict weighs in)
    assert result.cross_rank is None and result.imbalance_pct is None and result.to_dict()["imbalance_pct"] is None
    # Rank 0's wait for rank 1 is in no trace: the per-kind table states no late-peer figure (it read 0.00 ms).
    summary = format_summary(result)
    assert ("late-peer wait: n/a: no trace of rank 1 read where it matters, so the others' time in collectives cannot "
            "be told apart into waiting for them and the transfer") in summary
    kinds = [line.split() for line in summary.splitlines() if line.startswith(("   0 all_", "mean all_"))]
    assert len(kinds) == 4 and all(row[5] == row[7] == "n/a" for row in kinds)
    out = result.to_dict()  # the JSON says no figure where the text says n/a (it read 0.0)
    assert out["unmeasured_waits"] == [1] and out["ranks"][0]["peer_waits"] == []
    rows = out["comm_by_kind"] + out["ranks"][0]["comm_by_kind"]
    assert len(rows) == 4 and all((r["wait_us"], r["wait_pct"], r["waited_for"]) == (None, None, []) for r in rows)
    assert all(r["exposed_us"] > 0 for r in rows)  # (the rest of the row stands)
    from hf_distprof.analysis.tell.tracker import headline

    assert headline(result)["slowest_rank"] == 1  # the trackers' headline names it too
    assert "the traces hold only rank 0's steps: no window verdict across ranks" in result.findings[0].evidence
    why = ("withheld: rank 1, which the step timer names as holding the others back over the run, took no profiler "
           "window (--profile-ranks), so the other ranks' time in collectives cannot be told apart into waiting for "
           "rank 1 and the transfer")
    assert [(u.question, u.why) for u in result.undecided] == [
        ("communication_bound", f"Communication-bound {why}"), ("what_if", f"The what-if replay across ranks {why}")]
    assert result.what_if == [] and result.undecided[0].to_decide == "trace rank 1 too (--profile-ranks auto picks it)"
    assert "Headline: exposed communication 80.6% of step time, load imbalance n/a (1 rank(s))" in \
        format_findings(result)
    # Only timing_summary.json beside the trace (no per-step records): its verdict stands all the same.
    summary_only = _profiled_ranks(tmp_path / "summary_only", 0)
    for rows in summary_only.glob("timing_rank*.jsonl"):
        rows.unlink()
    kept = analyze_paths([summary_only], AnalysisOptions(workers=1))
    assert [(f.kind, f.ranks) for f in kept.findings] == [("slow_rank", [1])]
    # The slow rank traced (--profile-ranks 1): its peers reach each collective before it, so what the trace holds of
    # its collectives is theirs to measure: nothing withheld, and the step timer still names it.
    slow = analyze_paths([_profiled_ranks(tmp_path, 1)], AnalysisOptions(workers=1))
    assert [u.question for u in slow.undecided] == [] and slow.findings[0].kind == "slow_rank"
    assert slow.findings[0].ranks == [1] and slow.what_if != []
    # Its data loading is what exceeds: the slow-rank finding stands for its data-loading finding too, as when every
    # rank is traced (a trial's run listed "Data-loading bound (rank 1)" third, the guide says it is replaced).
    assert [(f.kind, f.ranks) for f in slow.findings] == [("slow_rank", [1]), ("what_to_fix_first", [1])]


def test_untraced_ranks_withhold_what_their_waits_would_distort_as_the_step_timer_s_verdict_says() -> None:
    from hf_distprof.analysis.judge.coverage import unmeasured
    from hf_distprof.analysis.results.facts import Coverage
    from hf_distprof.analysis.results.run import WindowInfo
    from hf_distprof.analysis.tell.unread import unread_words
    from hf_distprof.core.verdicts import SlowRankVerdict

    def verdict(status: str, rank: int | None) -> SlowRankVerdict:
        return SlowRankVerdict(status, rank, 30.0, 10.0, 2.0, 20, 24, 8, 0.001, 6, "r")

    def window(first: int, ranks: list[int]) -> WindowInfo:
        return WindowInfo(first=first, last=first + 2, reasons=["schedule"], detail="", ranks=ranks)

    world, read = list(range(8)), {0}
    # Quiet over the run: no rank holds the others back beyond the threshold; the traces' collectives are the run's.
    assert unmeasured(world, read, [], verdict("quiet", 5)) is None
    # No verdict (no step timer, or too few steps): nothing says whether the untraced ranks' waits matter.
    assert unmeasured(world, read, [], None) == Coverage([1, 2, 3, 4, 5, 6, 7], None, [])
    assert unmeasured(world, read, [], verdict("not enough evidence", 3)) == Coverage([1, 2, 3, 4, 5, 6, 7], None, [])
    # Raised on a rank no window traced: its peers' wait for it reads as their transfer.
    assert unmeasured(world, read, [], verdict("raised", 5)) == Coverage([1, 2, 3, 4, 5, 6, 7], 5, [])
    # Raised on a rank traced in every window: the others reach each collective before it.
    assert unmeasured(world, {0, 5}, [], verdict("raised", 5), [window(8, [0, 5])]) is None
    # --profile-ranks auto: the first window (before any evidence) traced ranks 0 and 7, the next the slow rank 5.
    windows = [window(8, [0, 7]), window(20, [5, 3])]
    assert unmeasured(world, {0, 3, 5, 7}, [], verdict("raised", 5), windows) == Coverage([], 5, [(8, 10)])
    assert unmeasured(world, set(), [], None) is None  # nothing read: nothing to withhold
    # The slow rank's trace was lost, not left out: the lost file is the reason (not "took no profiler window").
    assert unmeasured(world, {0}, [2], verdict("raised", 2), [window(8, [0, 2])]) is None
    # In words: each reason as what it is, a lost file apart from a rank untraced by choice.
    assert unread_words([2], Coverage([1, 3], None, [])) == (
        "the trace of rank 2 is not among those read (not given, or could not be read); and ranks 1, 3 took no "
        "profiler window (--profile-ranks) and no step timer verdict says whether a rank holds the others back, so "
        "the other ranks' time in collectives cannot be told apart into waiting for ranks 1-3 and the transfer",
        "analyse the run with the trace of rank 2 (a file that could not be read is named with its reason); keep the "
        "step timer on (its verdict over the run decides), or trace every rank")
    assert unread_words([], Coverage([], 5, [(8, 10)]))[0] == (
        "rank 5, which the step timer names as holding the others back over the run, was not traced in the window of "
        "steps 8-10 (--profile-ranks), so the other ranks' time in collectives cannot be told apart into waiting for "
        "rank 5 and the transfer")


def test_a_run_verdict_on_a_rank_no_trace_holds_gives_no_traced_imbalance_finding_and_no_crash() -> None:
    # A trial: --profile-ranks 0,2 on 4 ranks, rank 1 slow: analyze, compare and --profiler-analyze all stopped with
    # StopIteration looking up rank 1's traced figures for the imbalance finding (the chain states the run's instead).
    from types import SimpleNamespace

    from hf_distprof.analysis.judge.diagnosis import _imbalance
    from hf_distprof.core.verdicts import SlowRankVerdict

    run = SlowRankVerdict("raised", 1, 800.0, 10.0, 2.0, 20, 20, 4, 1e-6, 6, "r")
    skew = SimpleNamespace(per_rank=[SimpleNamespace(rank=0, busy_us=10.0, mean_step_us=50.0),
                                     SimpleNamespace(rank=2, busy_us=11.0, mean_step_us=50.0)])
    assert _imbalance(SimpleNamespace(skew=skew), SimpleNamespace(imbalance=run)) == []  # type: ignore[arg-type]


def test_a_clean_run_traced_on_one_rank_keeps_its_findings(tmp_path: Path) -> None:
    # --profile-ranks 0 on a run the step timer finds quiet: nothing withheld (the waits for rank 1 are not the ones
    # that matter), and nothing asked of the user.
    run = tmp_path / "clean0"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    for other in run.glob("rank1_vm_step*"):
        other.unlink()
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    manifest["windows"][0]["ranks"] = [0]
    manifest["profile_ranks"] = "0"
    manifest["files"] = [f for f in manifest["files"] if (run / f["name"]).exists()]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    result = analyze_paths([run], AnalysisOptions(workers=1))
    assert result.undecided == [] and result.unread_ranks == []
    # Without the step timer's records nothing says whether rank 1 held rank 0 back: withheld.
    for timed in [*run.glob("timing_rank*.jsonl"), run / "timing_summary.json"]:
        timed.unlink()
    bare = analyze_paths([run], AnalysisOptions(workers=1))
    assert [u.question for u in bare.undecided][-1] == "what_if"
    assert "rank 1 took no profiler window (--profile-ranks) and no step timer verdict" in bare.undecided[-1].why


def test_a_rank_that_died_in_the_window_is_said_to_have_died_not_to_have_taken_no_window(tmp_path: Path) -> None:
    # A trial: rank 1 died of SIGSEGV inside the window (rank1_crash.txt beside the run); analyze said "rank 1 took no
    # profiler window (--profile-ranks)", a flag the run never had.
    run = tmp_path / "segv"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    for other in [*run.glob("rank1_vm_step*"), *run.glob("timing_*")]:
        other.unlink()
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    manifest["windows"][0]["ranks"] = [0]  # rank 1's part never claimed the window
    manifest["files"] = [f for f in manifest["files"] if (run / f["name"]).exists()]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    (run / "rank1_crash.txt").write_text("Fatal Python error: Segmentation fault\n")
    died = analyze_paths([run], AnalysisOptions(workers=1))
    assert died.undecided and died.undecided[-1].why == (
        "The what-if replay across ranks withheld: rank 1 crashed and left no trace (rank1_crash.txt holds the stack), "
        "so the other ranks' time in collectives cannot be told apart into waiting for rank 1 and the transfer")
    assert died.undecided[-1].to_decide == ("hf-distprof hang-report RUN_FOLDER says where it died; fix that, then "
                                            "profile again")
    # An uncaught exception's traceback instead (rank1_exception.txt).
    (run / "rank1_crash.txt").write_text("")
    (run / "rank1_exception.txt").write_text("hf_distprof: rank 1 on host vm ended by an uncaught exception ...\n")
    raised = analyze_paths([run], AnalysisOptions(workers=1))
    assert ("rank 1 raised an exception and left no trace (rank1_exception.txt holds the traceback)"
            in raised.undecided[-1].why)
    # No crash file, but its manifest part never reached train end (killed, stopped).
    (run / "rank1_exception.txt").unlink()
    manifest["unfinished_ranks"] = [1]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    stopped = analyze_paths([run], AnalysisOptions(workers=1))
    assert "rank 1 never reached train end (it died or was stopped) and left no trace" in stopped.undecided[-1].why
    # A rank that took the window (a job stopped at its time limit after it: every rank unfinished) left a trace:
    # one not read is said as not read, not as "left no trace".
    manifest["windows"][0]["ranks"] = [0, 1]
    manifest["unfinished_ranks"] = [0, 1]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    unread = analyze_paths([run], AnalysisOptions(workers=1))
    assert "the trace of rank 1 is not among those read" in unread.undecided[-1].why
    assert "left no trace" not in unread.undecided[-1].why


def test_what_the_step_timer_decided_is_not_withheld_for_an_unread_trace() -> None:
    from hf_distprof.analysis.judge.slowdown import withhold_without_every_rank
    from hf_distprof.analysis.results.findings import STEP_TIMER, TRACE, TRACE_AND_TIMER, Judgement

    def finding(kind: str, basis: str) -> Judgement:
        return Judgement(kind=kind, severity=1.0, ranks=[2], facts=None, basis=basis)  # type: ignore[arg-type]

    timer, both, trace = finding("imbalance", STEP_TIMER), finding("imbalance", TRACE_AND_TIMER), \
        finding("straggler", TRACE)
    own = finding("data_loading_bound", TRACE)
    kept, withheld = withhold_without_every_rank([timer, both, trace, own], [0], replayed=True)
    assert kept == [timer, both, own]
    assert [(q.question, q.missing, q.withheld) for q in withheld] == [
        ("straggler", [0], trace), ("what_if", [0], None)]
    assert withhold_without_every_rank([trace], [], replayed=True) == ([trace], [])


def test_a_report_without_a_step_traced_on_every_rank_is_written(tmp_path: Path) -> None:
    # --profile-ranks auto: each window traces its own ranks, so no step is common to all (a trial's 3-rank run: the
    # report stopped with an IndexError in the phases plot).
    from hf_distprof.analysis.tell.report import PHASES_PNG, write_report

    result = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=1))
    result.common_steps = []
    html = write_report(result, tmp_path / "rep")
    assert html.is_file() and (tmp_path / "rep" / PHASES_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_trackers_what_if_figures_are_the_saving_that_counts_in_ms_and_in_pct() -> None:
    # Held to the run's figure (smaller than the replay's), a scenario's ms and % are both the run's: a trial's
    # TensorBoard read 54.12 ms (the replay's) beside 28.75% (the run's).
    from hf_distprof.analysis.tell.tracker import figures

    result = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=1, what_if_pct=100))
    scenario = next(s for s in result.what_if if s.scenario == "slow_rank")
    scenario.run_saving_pct = scenario.saving_pct / 2
    got = figures(result)
    assert got["hf_distprof/whatif/slow_rank_saving_pct"] == pytest.approx(scenario.saving_pct / 2)
    half_ms = scenario.step_ms_now * scenario.saving_pct / 200
    assert got["hf_distprof/whatif/slow_rank_saving_ms"] == pytest.approx(half_ms) != scenario.saving_ms


def test_two_ranks_of_one_host_that_traced_the_same_steps_apart_in_time_are_not_one_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A trial: rank 1's traces of another run copied in under the same names: "reaches each step's collectives
    # 8991.76 ms (13819.9% of its 65.06 ms step)". One host, one clock: the same steps 9 s apart are not one run's.
    run = tmp_path / "mixed"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    path = run / "rank1_vm_step8-10.pt.trace.json.gz"
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    doc["baseTimeNanoseconds"] += 9_000_000_000
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    (run / "rank1_vm_step8-10.pt.trace.json.gz.compact.msgpack").unlink(missing_ok=True)
    assert main(["analyze", str(run), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-distprof analyze: error: ranks 0 and 1 on host vm traced the same steps (8, 9, 10) 9.0 s "
                          f"apart ({path} after {run / 'rank0_vm_step8-10.pt.trace.json.gz'}): not one run's traces")
    assert main(["analyze", str(DATA / "golden" / "cpu_clean_memory"), "--workers", "1"]) == 0  # as it was: one run
    # Two machines under one host name keep their own clocks: the manifest's measured offset explains the 9 s.
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    manifest["ranks"][1]["clock_offset_us"] = 9_000_000.0
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    assert main(["analyze", str(run), "--workers", "1"]) == 0
    # Half a second apart without a measured offset: a host's lag, not another run (a GPU's host runs ahead, too).
    doc["baseTimeNanoseconds"] -= 8_500_000_000
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    manifest["ranks"][1]["clock_offset_us"] = 0.0
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    assert main(["analyze", str(run), "--workers", "1"]) == 0


def test_traces_whose_headers_say_two_world_sizes_are_not_one_run(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # A trial: a 2-rank gloo run's traces beside an 8-GPU NCCL run's, in one folder, read as one run of 8 ranks whose
    # ranks 0 and 1 held both runs' steps (rank 0's "step ms" 33.48, an all_reduce row of 2.1 calls), exit 0.
    run = tmp_path / "mixed"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    (run / "manifest.json").unlink()
    path = run / "rank1_vm_step8-10.pt.trace.json.gz"
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    assert doc["distributedInfo"]["world_size"] == 2
    doc["distributedInfo"]["world_size"] = 8
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    (run / "rank1_vm_step8-10.pt.trace.json.gz.compact.msgpack").unlink(missing_ok=True)
    assert main(["analyze", str(run), "--workers", "1"]) == 2
    assert capsys.readouterr().err.startswith(
        f"hf-distprof analyze: error: {run / 'rank0_vm_step8-10.pt.trace.json.gz'} says world size 2, {path} world "
        "size 8: not one run's traces; pass the traces of one run only")
    doc["distributedInfo"]["world_size"] = 2
    doc["distributedInfo"]["backend"] = "nccl"
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    assert main(["analyze", str(run), "--workers", "1"]) == 2
    assert "says backend gloo, " in capsys.readouterr().err
    del doc["distributedInfo"]["backend"]  # a trace that states none is not counted
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    assert main(["analyze", str(run), "--workers", "1"]) == 0


def test_one_step_of_two_ranks_of_one_host_an_hour_apart_is_not_one_run_and_clocks_apart_are_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Traces of one step per rank (the shared 8-GPU set's shape): one common step, 10 minutes or more apart on one host,
    # cannot be one run's. On hosts of their own, the alignment takes the offset out, and the text says it did.
    from hf_distprof.analysis.across.combine import APART_ONE_US

    run = tmp_path / "one"
    run.mkdir()
    for rank in (0, 1):
        events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": 1, "tid": 1, "ts": 0,
                   "dur": 10_000},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5_000},
                  {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 5_100,
                   "dur": 10},
                  {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 5_120,
                   "dur": 2_000}]
        doc = {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"}, "host_name": "node0",
               "baseTimeNanoseconds": 1_000_000_000_000 + rank * int(APART_ONE_US * 1e3 + 1e9),
               "traceEvents": events}
        (run / f"rank{rank}.json").write_bytes(orjson.dumps(doc))
    assert main(["analyze", str(run), "--workers", "1"]) == 2
    assert "ranks 0 and 1 on host node0 traced the same steps (5) 601.0 s apart" in capsys.readouterr().err
    doc["host_name"] = "node1"
    (run / "rank1.json").write_bytes(orjson.dumps(doc))
    assert main(["analyze", str(run), "--workers", "1"]) == 0
    assert ("clocks apart: rank 1 +601.0 s against rank 0's, found by matching their collectives and taken out"
            in capsys.readouterr().out)
    doc["baseTimeNanoseconds"] = 1_000_000_000_000 + 900_000_000  # 0.9 s: not said
    (run / "rank1.json").write_bytes(orjson.dumps(doc))
    assert main(["analyze", str(run), "--workers", "1"]) == 0
    assert "clocks apart" not in capsys.readouterr().out


def test_log_to_that_does_not_send_exits_1_after_the_answer(tmp_path, capsys):
    """A script that runs analyze --log-to and checks the status saw 0 when nothing was sent."""
    from hf_distprof.cli.main import main as cli_main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "golden" / "cpu_slow_data", run)
    (run / "tensorboard").write_text("a file where the tracker's folder goes")
    assert cli_main(["analyze", str(run), "--log-to", "tensorboard"]) == 1
    out, err = capsys.readouterr()
    assert "Verdict" in out  # the answer is still printed
    assert [line for line in err.splitlines() if "tensorboard: failed: " in line]


def test_a_trace_a_complete_manifest_does_not_list_is_another_run_s(tmp_path: Path) -> None:
    # A trial named rank 0's trace of a run and rank 1's of its resumed continuation (steps 26-28, another folder):
    # read as one run, 0 collectives matched, "Communication-bound (ranks 0-1)". The first run's manifest is complete:
    # it lists every trace the run wrote, and rank 1's of steps 26-28 is not among them.
    first, later = tmp_path / "myrun", tmp_path / "myrun-1"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", first)
    later.mkdir()
    other = later / "rank1_vm_step26-28.pt.trace.json.gz"
    shutil.copy(first / "rank1_vm_step8-10.pt.trace.json.gz", other)
    result = analyze_paths([first / "rank0_vm_step8-10.pt.trace.json.gz", other], AnalysisOptions(workers=1))
    assert [r.rank for r in result.ranks] == [0]
    assert [(e.path, e.reason) for e in result.errors] == [(str(other), (
        "another run's trace: the run's manifest, complete, lists no trace of rank 1 over steps 26-28 (its traces of "
        "rank 1: steps 8-10); left out"))]
    # The run's own traces, all listed: nothing left out.
    assert analyze_paths([first], AnalysisOptions(workers=1)).errors == []


def test_one_rank_s_trace_alone_measures_no_late_peer_wait(tmp_path: Path) -> None:
    # A trial's --profile-ranks 1 run with a quiet verdict: the per-kind table showed "late-peer ms 0.00" on every
    # row, a figure no trace measured (the peer's was never recorded); with a raised verdict it said n/a. Now n/a both.
    from hf_distprof.analysis.tell.text import format_summary

    run = tmp_path / "run"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    both = analyze_paths([run], AnalysisOptions(workers=1))
    assert both.unmeasured_waits == [] and both.cross_rank is not None
    # As --profile-ranks 0 writes it: rank 1 took no window (its trace is no lost file), and the verdict is quiet.
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    manifest["profile_ranks"] = "0"
    manifest["windows"][0]["ranks"] = [0]
    manifest["files"] = [f for f in manifest["files"] if f["rank"] == 0]
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    (run / "rank1_vm_step8-10.pt.trace.json.gz").unlink()
    (run / "rank1_vm_step8-10.pt.trace.json.gz.compact.msgpack").unlink(missing_ok=True)
    one = analyze_paths([run], AnalysisOptions(workers=1))
    assert one.errors == [] and one.unread_ranks == []
    assert [r.rank for r in one.ranks] == [0] and one.unmeasured_waits == [1]
    text = format_summary(one)
    assert "late-peer wait: n/a: no trace of rank 1 read" in text
    assert all(row["wait_us"] is None for row in one.to_dict()["ranks"][0]["comm_by_kind"])


@pytest.mark.parametrize("folder", ["slow_rank1", "fsdp2"])
def test_merge_names_each_thread_once_after_its_origin(tmp_path: Path, folder: str) -> None:
    # Trial T: one thread carried three thread_name records ("CPU tid 32164", "CPU thread 32164 (python3)", ...), and
    # Kineto's global instants a track named "pid  tid ".
    out = tmp_path / "merged.json.gz"
    merge_traces([DATA / folder], out, options=AnalysisOptions(workers=1))
    merged = orjson.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    names: dict[tuple[int, int], list[str]] = {}
    for e in merged:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names.setdefault((e["pid"], e["tid"]), []).append(e["args"]["name"])
    used = {(e["pid"], e["tid"]) for e in merged if e.get("ph") != "M"}
    assert used <= set(names) and all(len(n) == 1 for n in names.values()), names
    rank0 = sorted(n[0] for (pid, _), n in names.items() if pid == 0)
    assert "(no thread)" in rank0 and "Spans PyTorch Profiler" in rank0
    assert not any(n.startswith("pid ") for n in rank0), rank0
    assert any(n.startswith("CPU thread ") and n.endswith(" (python)") for n in rank0), rank0


def test_merge_numbers_a_rank_s_threads_once_over_its_windows(tmp_path: Path) -> None:
    # The review: each window's file numbered its threads afresh, so tid 1 was the CPU thread in one window and a GPU
    # stream in the next, one track under two names.
    doc = orjson.loads(gzip.decompress((DATA / "clean" / "rank-0.json.gz").read_bytes()))
    for name, (steps, shift) in {"rank0_a.json.gz": (0, 0), "rank0_b.json.gz": (100, 10**9)}.items():
        events = []
        for e in doc["traceEvents"]:
            e = dict(e)
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + steps}"
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift
            events.append(e)
        (tmp_path / name).write_bytes(gzip.compress(orjson.dumps({**doc, "traceEvents": events})))
    out = tmp_path / "merged.json.gz"
    merge_traces([tmp_path / "rank0_a.json.gz", tmp_path / "rank0_b.json.gz"], out,
                 options=AnalysisOptions(workers=1))
    merged = orjson.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    names: dict[int, list[str]] = {}
    for e in merged:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names.setdefault(e["tid"], []).append(e["args"]["name"])
    assert all(len(n) == 1 for n in names.values()), names
    assert len(names) == len({(e.get("tid")) for e in merged if e.get("ph") != "M"})  # every track named, once


def test_the_box_says_which_ranks_ended_early_where_a_file_of_theirs_says_so(tmp_path: Path) -> None:
    # Trial U: rank 1 raised after the window (traces of both ranks read); the box said "no finding ... nothing to fix"
    # and only the manifest's "incomplete" line hinted that the run had failed.
    from hf_distprof.analysis import format_box

    run = tmp_path / "raised"
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    assert "Ended:" not in format_box(analyze_paths([run], AnalysisOptions(workers=1)))
    (run / "rank1_exception.txt").write_text("hf_distprof: rank 1 on host vm ended by an uncaught exception ...\n")
    (run / "rank0_stopped.txt").write_text("hf_distprof: rank 0 on host vm stopped by SIGTERM ...\n")
    result = analyze_paths([run], AnalysisOptions(workers=1))
    assert (result.run.raised_ranks, result.run.stopped_ranks) == ([1], [0])
    box = " ".join(line.strip("| ") for line in format_box(result).splitlines())
    assert "Ended: rank 1 raised an exception; rank 0 was stopped by a signal: hf-distprof hang-report RUN_FOLDER " \
           "says how, where and in what order" in " ".join(box.split())
