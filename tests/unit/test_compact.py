"""Compact summaries beside traces: the same parsed events and the same analysis as the JSON, and never a stale one."""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path

import msgspec
import pytest

from hf_distprof.core import names
from hf_distprof.analysis import AnalysisOptions, analyze_paths
from hf_distprof.analysis.read import compact
from hf_distprof.analysis.read.events import parse_trace
from hf_distprof.cli.main import main
from hf_distprof.callbacks.profiler.compact_export import CompactExports
from tests.conftest import SHARED_DIR, require
from tests.unit.test_analysis_memory import write_pair

DATA = Path(__file__).resolve().parents[1] / "data"
DLRM = SHARED_DIR / "traces" / "dlrm_8gpu_v100"
# Our own 2-rank gloo traces (shapes recorded), FSDP2 on gloo, and the GPU reference with float timestamps.
SETS = ["clean", "slow_rank1", "fsdp2", "gpu_float_ts"]


def copy_set(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for trace in sorted((DATA / name).glob("rank-*.json.gz")):
        shutil.copy(trace, folder / trace.name)
    return folder


def compacts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(names.COMPACT_SUFFIX))


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("shapes", [None, True, False])
def test_round_trip_gives_the_parsed_trace_exactly(tmp_path, name, shapes):
    for trace in sorted(copy_set(name, tmp_path).iterdir()):
        out = compact.write_compact(trace)
        assert out.name == trace.name + ".compact.msgpack"
        # repr tells 1 from 1.0 and keeps the order of every list and dict.
        assert repr(compact.load_compact(trace, shapes)) == repr(parse_trace(trace, shapes))


def test_round_trip_with_memory_events(tmp_path):
    folder = write_pair(tmp_path / "mem", scale=3.0)
    for trace in sorted(folder.iterdir()):
        compact.write_compact(trace)
        parsed = compact.load_compact(trace)
        assert parsed is not None and parsed.memory is not None and len(parsed.memory) == 10
        assert repr(parsed) == repr(parse_trace(trace))


def test_round_trip_on_the_shared_nccl_traces(tmp_path):
    require(DLRM.is_dir(), f"shared DLRM traces not found at {DLRM}")
    trace = tmp_path / "worker0.json.gz"
    shutil.copy(sorted(DLRM.glob("worker0_*.json.gz"))[0], trace)
    compact.write_compact(trace)
    parsed = compact.load_compact(trace)
    assert parsed is not None and (len(parsed.gpu), len(parsed.launches), parsed.n_events) == (261, 525, 3290)
    assert repr(parsed) == repr(parse_trace(trace))


@pytest.mark.parametrize("name", SETS)
def test_analysis_from_compact_files_is_exactly_the_analysis_from_json(tmp_path, name, capsys):
    folder = copy_set(name, tmp_path)
    from_json = analyze_paths([folder], AnalysisOptions(workers=1)).to_dict()
    argv = ["analyze", str(folder), "--workers", "1"]
    assert main([*argv, "--json"]) == 0 and main(argv) == 0
    json_out = capsys.readouterr().out
    assert main([*argv, "--write-compact", "--json"]) == 0
    ranks = 4 if name == "gpu_float_ts" else 2
    assert compacts(folder) == [f"rank-{r}.json.gz.compact.msgpack" for r in range(ranks)]
    assert json_out.startswith(capsys.readouterr().out)  # the run that writes them prints the same
    # Now read from the compact files: the same dict, the same --json and text output, and nothing logged.
    assert analyze_paths([folder], AnalysisOptions(workers=1)).to_dict() == from_json
    assert main([*argv, "--json"]) == 0 and main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == json_out and "compact" not in captured.err


def test_message_sizes_from_shapes_follow_the_option(tmp_path):
    # The GPU traces record shapes: read by default on gloo, on NCCL only with message_sizes="shapes".
    folder = copy_set("gpu_float_ts", tmp_path)
    for sizes in ("auto", "shapes"):
        opts = AnalysisOptions(workers=1, message_sizes=sizes)
        from_json = analyze_paths([folder], opts, read_compact=False).to_dict()
        assert analyze_paths([folder], opts, write_compact=True).to_dict() == from_json
        assert analyze_paths([folder], opts).to_dict() == from_json


def bad_compact(trace: Path, how: str) -> None:
    """Make ``trace``'s compact file stale, foreign, corrupt, of another version, or not msgpack at all."""
    out = compact.compact_path(trace)
    if how == "stale":
        # Written again after its compact file (same events, other bytes): the compact file is not trusted.
        trace.write_bytes(gzip.compress(gzip.decompress(trace.read_bytes()), compresslevel=1, mtime=0))
    elif how == "foreign":
        shutil.copy(compact.compact_path(trace.with_name("rank-1.json.gz")), out)
    elif how == "truncated":
        out.write_bytes(out.read_bytes()[:-100])
    elif how == "version":
        data = msgspec.msgpack.decode(out.read_bytes())
        out.write_bytes(msgspec.msgpack.encode({**data, "version": 99}))
    elif how == "garbage":
        out.write_bytes(b"\x00not msgpack at all")


REASONS = {
    "stale": "made from another trace, or from this one before it changed",
    "foreign": "made from another trace, or from this one before it changed",
    "truncated": "corrupt (Input data was truncated)",
    "version": "format 'hf_distprof.compact' version 99, not 'hf_distprof.compact' version 4",
    "garbage": "corrupt (Expected `object`, got `int`)",
}


@pytest.mark.parametrize("how", list(REASONS))
def test_an_unusable_compact_file_falls_back_to_the_json_with_one_line(tmp_path, how, caplog):
    folder = copy_set("clean", tmp_path)
    from_json = analyze_paths([folder], AnalysisOptions(workers=1), write_compact=True).to_dict()
    trace = folder / "rank-0.json.gz"
    bad_compact(trace, how)
    with caplog.at_level(logging.WARNING, logger="hf_distprof.analysis.read.compact"):
        result = analyze_paths([folder], AnalysisOptions(workers=1)).to_dict()
    assert [r.getMessage() for r in caplog.records] == [
        f"hf_distprof: not using compact file {compact.compact_path(trace)}: {REASONS[how]}; "
        "reading the trace's JSON instead"
    ]
    assert result == from_json


def test_an_older_version_s_compact_file_is_replaced_quietly(tmp_path, caplog):
    # After an upgrade every run folder's compact files are an older version's: each analyze warned once per trace
    # and read the JSON, for ever after (a session's own upgrade to version 4: 8 lines a run, 3x slower).
    folder = copy_set("clean", tmp_path)
    from_json = analyze_paths([folder], AnalysisOptions(workers=1), write_compact=True).to_dict()
    trace = folder / "rank-0.json.gz"
    out = compact.compact_path(trace)
    data = msgspec.msgpack.decode(out.read_bytes())
    del data["after_pause"]  # (the field version 4 added)
    out.write_bytes(msgspec.msgpack.encode({**data, "version": compact.VERSION - 1}))
    with caplog.at_level(logging.INFO, logger="hf_distprof.analysis.read.compact"):
        assert analyze_paths([folder], AnalysisOptions(workers=1)).to_dict() == from_json
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "is an older hf_distprof's (format 'hf_distprof.compact' version" in caplog.records[0].getMessage()
    assert msgspec.msgpack.decode(out.read_bytes())["version"] == compact.VERSION  # written anew
    assert repr(compact.load_compact(trace)) == repr(parse_trace(trace))


def test_no_compact_ignores_them_and_write_compact_replaces_a_bad_one(tmp_path, caplog):
    folder = copy_set("clean", tmp_path)
    assert main(["analyze", str(folder), "--workers", "1", "--write-compact"]) == 0
    trace = folder / "rank-0.json.gz"
    bad_compact(trace, "garbage")
    with caplog.at_level(logging.WARNING, logger="hf_distprof.analysis.read.compact"):
        assert main(["analyze", str(folder), "--workers", "1", "--no-compact"]) == 0
        assert caplog.records == []
        assert main(["analyze", str(folder), "--workers", "1", "--write-compact"]) == 0  # says it once, rewrites
        assert len(caplog.records) == 1
        assert main(["analyze", str(folder), "--workers", "1"]) == 0
        assert len(caplog.records) == 1
    assert repr(compact.load_compact(trace)) == repr(parse_trace(trace))


def test_writes_are_atomic_and_hidden_files_are_never_read(tmp_path):
    folder = copy_set("clean", tmp_path)
    for trace in folder.iterdir():
        compact.write_compact(trace)
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank-0.json.gz", "rank-0.json.gz.compact.msgpack", "rank-1.json.gz", "rank-1.json.gz.compact.msgpack"
    ]
    hidden = folder / ".rank-0.json.gz.x.tmp.json.gz"  # a trace being written under its temporary name
    shutil.copy(folder / "rank-0.json.gz", hidden)
    shutil.copy(compact.compact_path(folder / "rank-0.json.gz"), compact.compact_path(hidden))
    assert compact.load_compact(hidden) is None


def test_a_compact_file_that_cannot_be_written_is_one_line_and_the_analysis_goes_on(tmp_path, caplog, monkeypatch):
    folder = copy_set("clean", tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with caplog.at_level(logging.WARNING, logger="hf_distprof.analysis.read.compact"):
        result = analyze_paths([folder], AnalysisOptions(workers=1), write_compact=True)
    assert len(result.ranks) == 2 and not result.errors
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"hf_distprof: could not write compact file {folder / f'rank-{r}.json.gz.compact.msgpack'}: Permission denied"
        for r in (0, 1)
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]  # no temp file left


def test_export_writes_on_a_thread_and_a_failure_is_one_warning(tmp_path, caplog):
    folder = copy_set("clean", tmp_path)
    not_a_trace = folder / "rank-2.json.gz"
    not_a_trace.write_text("{}")
    exports = CompactExports()
    with caplog.at_level(logging.WARNING, logger="hf_distprof.callbacks.profiler.compact_export"):
        for trace in sorted(folder.iterdir()):
            exports.submit(trace)
        exports.join()
    assert compacts(folder) == ["rank-0.json.gz.compact.msgpack", "rank-1.json.gz.compact.msgpack"]
    assert [r.getMessage() for r in caplog.records] == [
        f"[RANK 0] could not write the compact summary of {not_a_trace}: "
        f"TraceReadError('{not_a_trace}: not a trace: no traceEvents array'); analyze reads the trace instead"
    ]
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []
