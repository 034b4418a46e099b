"""Every error path the README and the guide name, with the exact message and exit status (in-process, fast).

The analyzer's bad-file reasons, the CLIs' exit statuses (0 some rank analysed, 1 none, 2 bad option or path)
and the training script's cross-field check, each made to happen and its words checked.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
import sys
from pathlib import Path
from types import ModuleType

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, TraceReadError, analyze_paths
from hf_distprof.analysis.read import trace_io
from hf_distprof.analysis.read.events import parse_trace
from hf_distprof.cli.main import main
from hf_distprof.runs.hang_report import hang_report, parse_recorder

from ..conftest import REPO_ROOT

DATA = Path(__file__).resolve().parents[1] / "data"
OPTS = AnalysisOptions(workers=1)


def _clean_doc() -> dict:
    return orjson.loads(gzip.decompress((DATA / "clean" / "rank-0.json.gz").read_bytes()))


def _reason(path: Path) -> str:
    with pytest.raises(TraceReadError) as info:
        parse_trace(path)
    assert info.value.path == str(path)
    return info.value.reason


# ---- bad trace files: each gets its own reason, naming the file ----------------------------------------


def test_corrupt_gzip_is_named(tmp_path: Path) -> None:
    good = (DATA / "clean" / "rank-0.json.gz").read_bytes()
    middle = len(good) // 2
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(good[:middle] + bytes(b ^ 0xFF for b in good[middle : middle + 64]) + good[middle + 64 :])
    assert _reason(bad).startswith("corrupt gzip data (Error -3 while decompressing data: ")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"[1, 2, 3]", "not a trace: top level is not a JSON object"),
        (b'"just a string"', "not a trace: top level is not a JSON object"),
        (b"{not json", "invalid JSON (unexpected character, expected a string key: line 1 column 2 (char 1))"),
        (b'{"traceEvents": []}', "trace has no events"),
        (b'{"traceEvents": [], "distributedInfo": {"rank": 0}}', "trace has no events"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}], "x": }',
         "invalid JSON outside traceEvents (unexpected character, expected a JSON value: line 1 column 26 (char 25))"),
    ],
    ids=["array", "string", "invalid", "no-events", "no-events-with-info", "bad-tail"],
)
def test_json_that_is_not_a_trace_is_named(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(content)
    assert _reason(path) == reason


def test_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rank0.json.gz"
    path.write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())

    def denied(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    # Root reads any file whatever its mode, so the refusal is made where the reader opens it.
    monkeypatch.setattr(trace_io, "open", denied, raising=False)
    assert _reason(path) == "cannot read (Permission denied)"


def test_malformed_event_is_a_file_error_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _clean_doc()
    kernel_like = {"ph": "X", "cat": "kernel", "name": "k", "dur": 3, "args": {"stream": 7, "correlation": 1}}
    doc["traceEvents"].append(kernel_like)  # no "ts"
    path = tmp_path / "rank0.json"
    path.write_bytes(orjson.dumps(doc))
    result = analyze_paths([path], OPTS)
    assert result.ranks == []
    assert [(e.path, e.reason) for e in result.errors] == [(str(path), "malformed trace event (KeyError: 'ts')")]
    assert main(["analyze", str(path), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == "Analysed 0 rank(s), 1 file(s) skipped or read in part.\n"
    assert f"{path}: malformed trace event (KeyError: 'ts')" in err and "Traceback" not in err


def test_cpu_op_without_a_name_is_a_malformed_event(tmp_path: Path) -> None:
    doc = _clean_doc()
    main_tid = next(e["tid"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "ts": 5, "dur": 1, "tid": main_tid, "pid": 1})
    path = tmp_path / "rank0.json"
    path.write_bytes(orjson.dumps(doc))
    assert [e.reason for e in analyze_paths([path], OPTS).errors] == ["malformed trace event (KeyError: 'name')"]


# ---- paths: a missing one and an empty folder are errors of the command, not of a file ----------------------


def test_empty_folder_and_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("not a trace")
    with pytest.raises(FileNotFoundError, match=r"^" + str(tmp_path) + r": no trace file \(\*\.json, \*\.json\.gz\)"):
        analyze_paths([tmp_path], OPTS)
    for command in ("analyze", "merge"):
        extra = ["-o", str(tmp_path / "m.json.gz")] if command == "merge" else []
        assert main([command, str(tmp_path), "--workers", "1", *extra]) == 2
        assert capsys.readouterr().err == (
            f"hf-distprof {command}: error: {tmp_path}: no trace file (*.json, *.json.gz) in this folder\n"
        )
        assert main([command, str(tmp_path / "missing"), "--workers", "1", *extra]) == 2
        missing = tmp_path / "missing"
        assert capsys.readouterr().err == f"hf-distprof {command}: error: {missing}: no such file or folder\n"


def test_merge_exits_1_when_no_trace_could_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rank0.json").write_bytes(b"")
    out = tmp_path / "out" / "m.json.gz"
    out.parent.mkdir()
    assert main(["merge", str(tmp_path / "rank0.json"), "--workers", "1", "-o", str(out)]) == 1
    assert capsys.readouterr().err.startswith("hf-distprof merge: error: ")
    assert list(out.parent.iterdir()) == []  # nothing written, no temporary file left


# ---- the training script: a cross-field check exits 2 like argparse, without a traceback ------------------


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The training script, imported as a module (its dataclasses need it in sys.modules)."""
    name = "train_modernBERT_under_test"
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "hf_distprof" / "recipe" / "train_mlm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profiler-analyze"], "--profiler-analyze analyses the run's traces: it needs --enable-profiling"),
        (["--measure-comm-overhead", "2", "--enable-step-timing", "false"],
         "--measure-comm-overhead 2 needs step timing, but --enable-step-timing is false: drop one of the two"),
        (["--profiler-active-steps", "0"], "--profiler-active-steps: must be an integer >= 1, got '0'"),
    ],
    ids=["analyze-without-profiling", "comm-overhead-without-timing", "bad-value"],
)
def test_training_script_rejects_bad_flags_with_status_2(script, monkeypatch, capsys, argv, message) -> None:
    monkeypatch.setattr(sys, "argv", ["train_modernBERT.py", *argv])
    with pytest.raises(SystemExit) as exc:
        script.parse_args(script.build_parser())
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(message) and "Traceback" not in err
    assert err.splitlines()[-1].startswith("train_modernBERT.py: error: ")


def test_training_script_accepts_good_flags(script, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train_modernBERT.py", "--enable-profiling", "--profiler-analyze"])
    _, _, prof, _ = script.parse_args(script.build_parser())
    assert (prof.enable_profiling, prof.profiler_analyze, prof.enable_step_timing) == (True, True, True)


def test_training_script_help_lists_every_group_of_flags(script, monkeypatch, capsys) -> None:
    # A '%' in a help text is an argparse format directive: `--help` once crashed on NCCL's "%h" file pattern.
    monkeypatch.setattr(sys, "argv", ["train_modernBERT.py", "--help"])
    with pytest.raises(SystemExit) as exc:
        script.parse_args(script.build_parser())
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for flag in ("--tiny-vocab-size", "--strategy", "--nccl-debug", "--enable-profiling", "--max_steps"):
        assert flag in out, flag
    assert "nccl_<host>_<pid>.log" in out


def test_the_demo_corpus_is_parsed_once_and_kept_and_a_bad_cache_is_parsed_again(script, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parsed: list[int] = []

    def parse(root, min_chars):
        parsed.append(min_chars)
        return ["first docstring", "second docstring"]

    monkeypatch.setattr(script, "_parse_stdlib_docstrings", parse)
    assert script.stdlib_docstrings() == ["first docstring", "second docstring"] and parsed == [40]
    (cache,) = (tmp_path / "hf_distprof").iterdir()
    assert cache.name.startswith("stdlib_docstrings_") and cache.suffix == ".json"
    assert script.stdlib_docstrings() == ["first docstring", "second docstring"] and parsed == [40]  # read back
    cache.write_text("{not json")
    assert script.stdlib_docstrings() == ["first docstring", "second docstring"] and parsed == [40, 40]
    assert sorted(p.name for p in (tmp_path / "hf_distprof").iterdir()) == [cache.name]  # no temp file left
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # the cache cannot be created: parsed every time, no error
    assert script.stdlib_docstrings() == ["first docstring", "second docstring"] and parsed == [40, 40, 40]


# ---- hang-report: the errors its section names ------------------------------------------------------------


def test_hang_report_missing_folder_and_bad_recorder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hang-report", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"hf-distprof hang-report: error: {tmp_path / 'nope'}: no such folder\n"
    with pytest.raises(FileNotFoundError, match="no hang_rank"):
        hang_report(tmp_path)
    recorder = tmp_path / "flight_recorder_rank1_node-7.pkl"
    recorder.write_bytes(pickle.dumps({"version": "2.10"}))
    with pytest.raises(ValueError, match=r"^" + str(recorder) + ": no 'entries' list in the flight-recorder dump$"):
        parse_recorder(recorder)
    recorder.write_bytes(pickle.dumps({"entries": [{"is_p2p": True}]}))
    assert (parse_recorder(recorder).rank, parse_recorder(recorder).seq) == (1, None)
