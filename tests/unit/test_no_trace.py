"""A run folder without a trace: ``analyze`` reads the run manifest and says why no window was taken, instead of
taking the run's own JSON files for traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_distprof import ProfilingArguments
from hf_distprof.analysis import AnalysisOptions, analyze_paths
from hf_distprof.analysis.read.manifest import load_manifest, why_no_trace
from hf_distprof.cli.main import main
from hf_distprof.callbacks.profiler.manifest import RunManifest

CLOCK = {"rank": 0, "host": "h", "clock_offset_us": 0.0, "clock_uncertainty_us": 0.0}


def run_folder(tmp_path: Path, last_step: int, offset: int = 0, **flags: object) -> Path:
    """A finished 1-rank run's folder as the callbacks leave it: manifest (parts and combined), timer files."""
    folder = tmp_path / "run"
    folder.mkdir()
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path), **flags)  # type: ignore[arg-type]
    manifest = RunManifest(folder, args, ["h"], [CLOCK], {"torch": "x"})
    manifest.planned(args, offset, last_step)
    manifest.finish(0, last_step)
    (folder / "timing_rank0.jsonl").write_text(json.dumps({"step": 1, "step_s": 0.1}) + "\n")
    (folder / "timing_summary.json").write_text(json.dumps({"profiler_slowdown": None}))
    (folder / "parallelism.json").write_text("{}")
    return folder


def test_a_run_that_ended_before_its_first_recorded_step_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    folder = run_folder(tmp_path, last_step=5)
    doc = load_manifest(folder)
    assert doc is not None and doc["last_step"] == 5 and doc["schedule"] == {
        "skip_first": 0, "wait": 5, "warmup": 2, "active": 3, "repeat": 1, "offset": 0, "first_recorded_step": 8,
        "max_steps": 5, "on_demand": False, "on_anomaly": False,
    }
    why = ("the profiler took no window: training ended at step 5, before the schedule's first recorded step 8 "
           "(--profiler-skip-first 0 + --profiler-wait-steps 5 + --profiler-warmup-steps 2 + 1); lower those flags "
           "or run more steps")
    assert why_no_trace(folder) == why
    with pytest.raises(FileNotFoundError) as err:
        analyze_paths([folder], AnalysisOptions(workers=1))
    assert str(err.value) == f"{folder}: no profiler trace (*.pt.trace.json[.gz]) in this run folder: {why}"
    assert main(["analyze", str(folder)]) == 2
    stderr = capsys.readouterr().err
    assert stderr == f"hf-distprof analyze: error: {err.value}\n"
    assert "not a trace" not in stderr  # the run's own JSON files are not read as traces


def test_a_resumed_run_and_windows_on_request_are_said_too(tmp_path: Path):
    folder = run_folder(tmp_path, last_step=104, offset=100, profile_on_demand=True)
    assert why_no_trace(folder) == (
        "the profiler took no window: training ended at step 104, before the schedule's first recorded step 108 "
        "(--profiler-skip-first 0 + --profiler-wait-steps 5 + --profiler-warmup-steps 2 + 1, counted from step 100, "
        "where training resumed); lower those flags or run more steps; no window was requested on demand or opened "
        "on anomaly either")


def test_windows_the_manifest_lists_whose_traces_are_gone(tmp_path: Path):
    folder = run_folder(tmp_path, last_step=20)
    doc = json.loads((folder / "manifest.json").read_text())
    doc["windows"] = [{"first": 8, "last": 10, "reasons": ["schedule"], "detail": "", "ranks": [0],
                       "cut_short_ranks": []}]
    (folder / "manifest.json").write_text(json.dumps(doc))
    assert why_no_trace(folder) == ("the run manifest lists 1 window(s) (steps 8-10) whose traces are not in this "
                                    "folder: lost, or written to another host's node-local folder")
    (tmp_path / "b").mkdir()
    past = run_folder(tmp_path / "b", last_step=20)
    assert why_no_trace(past) == (
        "the profiler took no window although training reached step 20, past the schedule's first recorded step 8: "
        "it could not start or write on any rank (see rank{R}.log)")


def test_a_folder_that_is_no_run_folder_keeps_the_plain_message(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r": no trace file \(\*\.json, \*\.json\.gz\) in this folder$"):
        analyze_paths([tmp_path], AnalysisOptions(workers=1))
    assert why_no_trace(tmp_path) is None


def test_profile_ranks_that_name_no_rank_of_the_run_are_said(tmp_path: Path):
    """``--profile-ranks 5`` on a 1-rank run: the analysis named "could not start or write on any rank"; the manifest
    has the flag and the world size."""
    folder = run_folder(tmp_path, last_step=20, profile_ranks="5")
    assert why_no_trace(folder) == (
        "the profiler took no window: --profile-ranks 5 names no rank of this 1-rank run (rank 0); name ranks below "
        "1, or leave the flag out to trace every rank")
    (tmp_path / "b").mkdir()  # a rank it has: the schedule's word, as before
    named = run_folder(tmp_path / "b", last_step=20, profile_ranks="0,5")
    assert why_no_trace(named).startswith("the profiler took no window although training reached step 20")


def test_a_run_without_the_profiler_says_so_and_where_its_records_are_read(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]):
    # Trial T: `analyze` of a --enable-step-timing run said only "no profiler trace".
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "timing_rank0.jsonl").write_text(json.dumps({"step": 1, "step_s": 0.1}) + "\n")
    assert main(["analyze", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"hf-distprof analyze: error: {folder}: no profiler trace (*.pt.trace.json[.gz]) in this run folder: it has no "
        "run manifest either: the run was not profiled (no --enable-profiling), or it ended before the profiler "
        "started; its step timer's records are read by hf-distprof compare\n")
