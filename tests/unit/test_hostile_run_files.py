"""Hostile files beside the traces: the run manifest, the step timer's files, and compare's timing records.

``analyze`` reads them for its run section and the profiler's slowdown: a wrong type or deep nesting is one error
naming the manifest (the traces are still analysed) or the step timer file is ignored; ``compare`` names the file and
line it cannot use. Never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hf_distprof.analysis import analyze_paths, format_summary
from hf_distprof.analysis.read.manifest import FORMAT, PART_FORMAT
from hf_distprof.cli.main import main
from hf_distprof.runs.load import RunFolderError, load_run

from .test_hostile_input import DATA, OPTS, write

MANIFEST_HEAD = {"format": FORMAT, "version": 1}
HOSTILE_MANIFESTS = {
    "not-an-object": [MANIFEST_HEAD],
    "version-text": {**MANIFEST_HEAD, "version": "x"},
    "world-size-text": {**MANIFEST_HEAD, "world_size": "abc"},
    "files-not-objects": {**MANIFEST_HEAD, "files": [1]},
    "file-name-number": {**MANIFEST_HEAD, "files": [{"name": 7, "rank": 0, "host": "h"}]},
    "window-first-text": {**MANIFEST_HEAD, "windows": [{"first": "a", "last": 2}]},
    "window-reasons-numbers": {**MANIFEST_HEAD, "windows": [{"first": 1, "last": 2, "reasons": [1]}]},
    "host-name-number": {**MANIFEST_HEAD, "hosts": [{"host": 1, "ranks": [0]}]},
    "ranks-number": {**MANIFEST_HEAD, "ranks": 5},
    "clock-offset-text": {**MANIFEST_HEAD, "ranks": [{"rank": 0, "host": "h", "clock_offset_us": "x"}]},
    "clock-offset-nan": {**MANIFEST_HEAD, "ranks": [{"rank": 0, "host": "h", "clock_offset_us": float("nan")}]},
    "unfinished-text": {**MANIFEST_HEAD, "unfinished_ranks": "0"},
}


@pytest.mark.parametrize("doc", HOSTILE_MANIFESTS.values(), ids=HOSTILE_MANIFESTS)
def test_a_run_manifest_with_wrong_types_is_a_named_error_and_the_traces_are_still_analysed(tmp_path, doc):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    write(folder / "manifest.json", json.dumps(doc).encode())
    result = analyze_paths([folder], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.run is None
    assert [e.path for e in result.errors] == [str(folder / "manifest.json")] and result.errors[0].reason
    assert format_summary(result).startswith("Analysed 1 rank(s), 1 file(s) skipped or read in part.")


def test_a_manifest_part_with_wrong_types_is_a_named_error(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    part = {"format": PART_FORMAT, "version": 1, "rank": 0, "host": "h", "windows": 5}
    write(folder / "manifest_rank0_h.json", json.dumps(part).encode())
    result = analyze_paths([folder], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.run is None
    assert [e.path for e in result.errors] == [str(folder / "manifest_rank*_*.json")]
    assert result.errors[0].reason.startswith("the parts do not assemble")


HOSTILE_TIMING = {
    "summary-list": ("timing_summary.json", b"[1, 2]"),
    "slowdown-number": ("timing_summary.json", b'{"profiler_slowdown": 5}'),
    "slowdown-ratio-text": ("timing_summary.json",
                            b'{"profiler_slowdown": {"warning": "w", "ratio": "x", "threshold_ratio": 1.25}}'),
    "slowdown-ratio-zero": ("timing_summary.json",
                            b'{"profiler_slowdown": {"warning": "w", "ratio": 0, "threshold_ratio": 1.25}}'),
    "slowdown-no-ratio": ("timing_summary.json", b'{"profiler_slowdown": {"warning": "w", "threshold_ratio": 1.25}}'),
    "verdict-number": ("timing_summary.json", b'{"imbalance_verdict": 5}'),
}


@pytest.mark.parametrize(("name", "content"), HOSTILE_TIMING.values(), ids=HOSTILE_TIMING)
def test_step_timer_files_with_wrong_types_beside_the_traces_are_ignored(tmp_path, name, content):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    (folder / name).write_bytes(content)
    result = analyze_paths([folder], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.errors == [] and result.profiler_slowdown is None
    assert not any(f.kind == "profiler_slowdown" for f in result.findings)
    format_summary(result)


def test_step_timer_records_that_are_not_records_are_a_named_error(tmp_path):
    """Rows that are not the step timer's records: the file is left out and named, as compare names it."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    (folder / "timing_rank0.jsonl").write_bytes(b"[1, 2]\n[3]\n\"x\"\n")
    result = analyze_paths([folder], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.profiler_slowdown is None
    assert [(e.path, e.reason) for e in result.errors] == [(str(folder / "timing_rank0.jsonl"), (
        "line 1: a record without a 'step'; line 2: a record without a 'step'; line 3: a record without a 'step': "
        "those lines are left out, no record of this rank read"))]


DEEP = b"[" * 100_000 + b"]" * 100_000
BESIDE_TRACES = {  # what analyze reads beside the traces: a named error (manifests, step records) or ignored (summary)
    "manifest.json": "not valid JSON (nested too deeply)",
    "manifest_rank0_h.json": "not valid JSON (nested too deeply)",
    "timing_summary.json": "",
    "timing_rank0.jsonl": ("line 1: not a record (nested too deeply): that line is left out, no record of this rank "
                           "read"),
}


@pytest.mark.parametrize("name", BESIDE_TRACES)
def test_deeply_nested_json_beside_the_traces_is_no_crash(tmp_path, name):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    (folder / name).write_bytes(DEEP)
    result = analyze_paths([folder], OPTS)
    assert [r.rank for r in result.ranks] == [0]
    assert [(Path(e.path).name, e.reason) for e in result.errors] == ([(name, BESIDE_TRACES[name])] if
                                                                       BESIDE_TRACES[name] else [])


@pytest.mark.parametrize(("name", "content", "words"), [
    ("timing_rank0.jsonl", DEEP, "timing_rank0.jsonl, line 1: not a record (nested too deeply)"),
    ("timing_rank0.jsonl", b'{"step": 1, "step_s": 0.1}\n\xff\xfe\n', "timing_rank0.jsonl: not UTF-8 text"),
    ("timing_summary.json", DEEP, "timing_summary.json: not readable JSON (nested too deeply)"),
    ("timing_summary.json", b"\xff\xfe{}", "timing_summary.json: not readable JSON ('utf-8' codec can't decode"),
])
def test_compare_names_a_deeply_nested_or_non_utf8_file(tmp_path, name, content, words):
    (tmp_path / "timing_rank0.jsonl").write_text('{"step": 1, "step_s": 0.1}\n{"step": 2, "step_s": 0.1}\n')
    (tmp_path / name).write_bytes(content)
    with pytest.raises(RunFolderError) as info:
        load_run(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}{os.sep}{words}"), info.value


@pytest.mark.parametrize(("line", "words"), [
    ('{"step": "3", "step_s": 0.1}', "'step' is '3', not a number"),
    ('{"step": true, "step_s": 0.1}', "'step' is True, not a number"),
    ('{"step": 3, "step_s": "slow"}', "'step_s' is 'slow', not a number"),
    ('{"step": 3, "step_s": NaN}', "'step_s' is nan, not a number"),
    ('{"step": 3, "step_s": {"a": 1}}', "'step_s' is {'a': 1}, not a number"),
])
def test_compare_refuses_a_timing_record_with_a_wrong_type_naming_the_file_and_line(tmp_path, line, words):
    good = '{"step": 1, "step_s": 0.1}\n{"step": 2, "step_s": 0.1}\n'
    (tmp_path / "timing_rank0.jsonl").write_text(good + line + "\n")
    with pytest.raises(RunFolderError) as info:
        load_run(tmp_path)
    assert str(info.value) == f"{tmp_path / 'timing_rank0.jsonl'}, line 3: {words}"


@pytest.mark.parametrize(("name", "doc", "words"), [
    ("timing_summary.json", {"warmup_steps_excluded": "x"}, "'warmup_steps_excluded' is 'x', not an integer >= 0"),
    ("timing_summary.json", {"warmup_steps_excluded": -1}, "'warmup_steps_excluded' is -1, not an integer >= 0"),
    ("timing_summary.json", {"per_rank": 5}, "'per_rank' is 5, not a list"),
    ("timing_summary.json", {"per_rank": ["r0"]}, "per_rank[0] is 'r0', not an object"),
    ("timing_summary.json", {"per_rank": [{"rank": "a"}]}, "per_rank[0].rank is 'a', not an integer"),
    ("timing_summary.json", {"per_rank": [{"rank": 0, "peak_memory_bytes": "z"}]},
     "per_rank[0].peak_memory_bytes is 'z', not a number"),
    ("timing_summary.json", {"profiler_slowdown": [3]}, "'profiler_slowdown' is [3], not an object"),
    ("timing_summary.json", {"profiler_slowdown": {"steps_inside": "3"}},
     "profiler_slowdown.steps_inside is '3', not a number"),
    ("timing_summary.json", {"comm_overhead": {"overhead_pct": "high"}},
     "comm_overhead.overhead_pct is 'high', not a number"),
    ("memory_summary.json", {"peak_basis": 3}, "'peak_basis' is 3, not a string"),
    ("memory_summary.json", {"peak_basis": "rss_mb", "per_rank": [{"rank": 0, "rss_mb": "big"}]},
     "per_rank[0].rss_mb is 'big', not a number"),
    ("analysis.json", {"ranks": 5}, "a traced step's field has the wrong type"),
    ("analysis.json", {"ranks": [{"rank": 0, "steps": [{"step": 3, "cpu": {"compute_us": "x"}}]}]},
     "a traced step's field has the wrong type"),
])
def test_compare_names_a_summary_file_and_field_of_the_wrong_type(tmp_path, capsys, name, doc, words):
    # A summary edited by hand or written by another tool: one error naming the file and the field, exit 2.
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        (folder / "timing_rank0.jsonl").write_text("".join(
            json.dumps({"step": s, "step_s": 0.1}) + "\n" for s in range(1, 9)))
    (tmp_path / "b" / name).write_text(json.dumps(doc))
    with pytest.raises(RunFolderError) as info:
        load_run(tmp_path / "b")
    assert str(info.value).startswith(f"{tmp_path / 'b' / name}: {words}"), info.value
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.startswith(f"hf-distprof compare: error: {tmp_path / 'b' / name}: {words}")
