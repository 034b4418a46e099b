"""Trace I/O and robustness: chunked reading, rank naming, and every bad-input case."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, TraceReadError, analyze_paths
from hf_distprof.analysis.read import trace_io
from hf_distprof.analysis.read.events import parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"
CLEAN = DATA / "clean"
OPTS = AnalysisOptions(workers=1)


def _full_parse(path: Path) -> dict:
    return orjson.loads(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("chunk", [257, 4096, trace_io.CHUNK_BYTES])
def test_chunked_read_equals_whole_file_parse(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(trace_io, "CHUNK_BYTES", chunk)
    path = CLEAN / "rank-1.json.gz"
    ref = _full_parse(path)
    meta: dict = {}
    events = [e for batch in trace_io.iter_trace_events(path, meta) for e in batch]
    assert events == ref["traceEvents"]
    assert meta == {k: v for k, v in ref.items() if k != "traceEvents"}
    assert meta["distributedInfo"]["rank"] == 1


def test_plain_json_and_one_line_json_read_the_same(tmp_path: Path) -> None:
    ref = _full_parse(CLEAN / "rank-0.json.gz")
    (tmp_path / "a.json").write_bytes(orjson.dumps(ref))  # no whitespace at all
    (tmp_path / "b.json").write_bytes(orjson.dumps(ref, option=orjson.OPT_INDENT_2))
    for name in ("a.json", "b.json"):
        events = [e for b in trace_io.iter_trace_events(tmp_path / name, {}) for e in b]
        assert events == ref["traceEvents"]


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3_host_step4-5.pt.trace.json.gz", 3),
        ("worker7_step_12.1694.pt.trace.json", 7),
        ("rank-12.json.gz", 12),
        ("trace.json", None),
        ("myrank.json", None),
    ],
)
def test_rank_from_file_name(name: str, rank: int | None) -> None:
    assert trace_io.rank_from_file_name(name) == rank


def _without_rank_info(tmp_path: Path, name: str) -> Path:
    doc = _full_parse(CLEAN / "rank-1.json.gz")
    del doc["distributedInfo"]
    out = tmp_path / name
    out.write_bytes(gzip.compress(orjson.dumps(doc)))
    return out


def test_rank_falls_back_to_file_name(tmp_path: Path) -> None:
    assert parse_trace(_without_rank_info(tmp_path, "worker5_trace.json.gz")).rank == 5


def test_no_rank_anywhere_is_a_clear_error(tmp_path: Path) -> None:
    path = _without_rank_info(tmp_path, "trace.json.gz")
    with pytest.raises(TraceReadError, match=r"trace\.json\.gz: cannot tell the rank"):
        parse_trace(path)


def test_discover_skips_hidden_temp_files_and_non_traces(tmp_path: Path) -> None:
    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "rank0_h_step1-2.pt.trace.json.gz")
    shutil.copy(CLEAN / "rank-1.json.gz", tmp_path / ".rank1_h_step1-2.pt.trace.json.gz.abc.tmp.gz")
    (tmp_path / "rank0_h_step1-2_summary.txt").write_text("x")
    found = trace_io.discover_trace_files([tmp_path])
    assert [p.name for p in found] == ["rank0_h_step1-2.pt.trace.json.gz"]
    with pytest.raises(FileNotFoundError, match="no such file"):
        trace_io.discover_trace_files([tmp_path / "missing"])


def test_folder_with_torch_traces_ignores_other_json(tmp_path: Path) -> None:
    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "rank0_h_step1-2.pt.trace.json.gz")
    (tmp_path / "sub").mkdir()
    raw_rank1 = gzip.decompress((CLEAN / "rank-1.json.gz").read_bytes())
    (tmp_path / "sub" / "rank1_h_step1-2.pt.trace.json").write_bytes(raw_rank1)
    (tmp_path / "timing_summary.json").write_text('{"steps": []}')
    (tmp_path / "analysis.json").write_text("{}")
    (tmp_path / "sub" / "notes.json.gz").write_bytes(gzip.compress(b"{}"))
    found = trace_io.discover_trace_files([tmp_path])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "rank0_h_step1-2.pt.trace.json.gz",
        "sub/rank1_h_step1-2.pt.trace.json",
    ]
    result = analyze_paths([tmp_path], OPTS)
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.errors == []
    # An explicit file is analysed as given, even next to traces (and reported, as it is no trace).
    result = analyze_paths([tmp_path, tmp_path / "analysis.json"], OPTS)
    assert [Path(e.path).name for e in result.errors] == ["analysis.json"]


def test_folder_without_torch_traces_takes_every_json(tmp_path: Path) -> None:
    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    (tmp_path / "rank-1.json").write_bytes(gzip.decompress((CLEAN / "rank-1.json.gz").read_bytes()))
    (tmp_path / "timing_summary.json").write_text('{"steps": []}')
    found = trace_io.discover_trace_files([tmp_path])
    assert [p.name for p in found] == ["rank-0.json.gz", "rank-1.json", "timing_summary.json"]
    result = analyze_paths([tmp_path], OPTS)
    assert [r.rank for r in result.ranks] == [0, 1]
    assert [(Path(e.path).name, e.reason) for e in result.errors] == [
        ("timing_summary.json", "not a trace: no traceEvents array")
    ]


def _bad_files(tmp_path: Path) -> dict[str, str]:
    """Each bad case -> the reason the analyzer must give for it."""
    good = (CLEAN / "rank-0.json.gz").read_bytes()
    raw = gzip.decompress(good)
    (tmp_path / "rank0.json.gz").write_bytes(good[: len(good) // 2])
    cut = raw.index(b"},", len(raw) // 2) + 2  # between two events, never inside a string
    (tmp_path / "rank1.json").write_bytes(raw[:cut] + b"#garbage" + raw[cut:])
    (tmp_path / "rank2.json").write_bytes(b"")
    (tmp_path / "rank3.json").write_bytes(b'{"hello": "world", "items": [1, 2]}')
    doc = orjson.loads(raw)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")
    ]
    (tmp_path / "rank4.json").write_bytes(orjson.dumps(doc))
    (tmp_path / "rank5.json").write_bytes(raw[: len(raw) - 200])  # plain JSON cut short
    return {
        "rank0.json.gz": "truncated gzip",
        "rank1.json": "invalid JSON",
        "rank2.json": "empty file",
        "rank3.json": "not a trace: no traceEvents array",
        "rank4.json": "no ProfilerStep#N events",
        "rank5.json": "truncated JSON",
    }


def test_each_bad_file_gets_its_own_clear_error(tmp_path: Path) -> None:
    expected = _bad_files(tmp_path)
    for name, reason in expected.items():
        with pytest.raises(TraceReadError) as info:
            parse_trace(tmp_path / name)
        assert info.value.path.endswith(name)
        assert reason in info.value.reason


def test_bad_files_are_reported_and_good_ranks_still_analysed(tmp_path: Path) -> None:
    expected = _bad_files(tmp_path)
    shutil.copy(CLEAN / "rank-1.json.gz", tmp_path / "good_rank1.json.gz")
    result = analyze_paths([tmp_path], OPTS)
    assert [r.rank for r in result.ranks] == [1]
    assert {Path(e.path).name: e.reason for e in result.errors}.keys() == expected.keys()
    for err in result.errors:
        assert expected[Path(err.path).name] in err.reason


def test_same_rank_twice_with_same_steps_is_rejected(tmp_path: Path) -> None:
    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "a_rank0.json.gz")
    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "b_rank0.json.gz")
    result = analyze_paths([tmp_path], OPTS)
    assert len(result.ranks) == 1
    assert len(result.errors) == 1 and "already read from" in result.errors[0].reason


def test_options_validate_their_fields() -> None:
    with pytest.raises(ValueError, match="comm_bound_pct"):
        AnalysisOptions(comm_bound_pct=-1)
    with pytest.raises(ValueError, match="low_util_pct"):
        AnalysisOptions(low_util_pct=150)


def test_a_rank_whose_trace_cannot_be_read_leaves_no_clean_no_finding_line(tmp_path: Path) -> None:
    # Trial T: one of two traces truncated; the text said "No finding: nothing crosses its threshold ..." above a box
    # saying "not enough evidence for a verdict across ranks".
    from hf_distprof.analysis.tell.text import format_summary as format_text
    from hf_distprof.analysis.tell.tracker import markdown

    shutil.copy(CLEAN / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    good = (CLEAN / "rank-1.json.gz").read_bytes()
    (tmp_path / "rank-1.json.gz").write_bytes(good[: len(good) // 2])
    result = analyze_paths([tmp_path], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.undecided and not result.findings
    line = "No finding among what could be decided; the rest had not enough evidence: no verdict on the whole run."
    for text in (format_text(result), markdown(result)):
        assert line in text and "No finding: nothing crosses" not in text
    assert "| Verdict: not enough evidence for a verdict across ranks" in markdown(result)  # the box above it
