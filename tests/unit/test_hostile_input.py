"""The analyzer on hostile files: bounded work and memory, a clear error naming the file, never a crash.

A huge single line, deep nesting, wrong types in every field read, non-UTF-8 file names, unsorted and duplicated
events, a gzip bomb; and no pickle is loaded unless it is plain data.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, TraceReadError, analyze_paths, format_summary, trace_io
from hf_distprof.analysis.events import parse_trace
from hf_distprof.analysis.manifest import FORMAT, PART_FORMAT
from hf_distprof.hang_report import parse_recorder
from hf_distprof.runs.load import RunFolderError, load_run

from ..conftest import REPO_ROOT

DATA = Path(__file__).resolve().parents[1] / "data"
OPTS = AnalysisOptions(workers=1)


def clean_doc(rank: int = 0) -> dict:
    return orjson.loads(gzip.decompress((DATA / "clean" / f"rank-{rank}.json.gz").read_bytes()))


def write(path: Path, doc: dict | bytes) -> Path:
    # json, not orjson: the hostile values include integers beyond 64 bits.
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return path


def reason(path: Path) -> str:
    with pytest.raises(TraceReadError) as info:
        parse_trace(path)
    assert info.value.path == str(path)
    return info.value.reason


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120)


# ---- bounded: a bomb or an endless string is refused early, not read into memory ---------------------------


def test_a_gzip_bomb_without_events_is_refused_after_the_metadata_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_io, "MAX_HEAD_BYTES", 8 << 20)
    bomb = tmp_path / "rank0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b'{"padding": "')
        for _ in range(64):  # 64 MiB of zeros in ~64 KiB of gzip
            fh.write(b"0" * (1 << 20))
        fh.write(b'"}')
    assert bomb.stat().st_size < 1 << 20
    assert reason(bomb) == "not a trace: no traceEvents array in the first 8 MB"


def test_a_gzip_bomb_inside_the_events_array_is_refused_after_the_event_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_io, "MAX_PENDING_BYTES", 16 << 20)
    bomb = tmp_path / "rank0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(64):
            fh.write(b" " * (1 << 20))
        fh.write(b"]}")
    assert reason(bomb).startswith("no complete event in ")


def test_a_gzip_bomb_of_valid_events_is_refused_once_it_inflates_past_the_ratio_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_io, "MIN_INFLATED_BOUND", 1 << 20)
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
    bomb = tmp_path / "rank0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(64):  # 64 x 1 MB of whole events, each one kept by the parser: ~0.8 M events
            fh.write(event * ((1 << 20) // len(event)))
        fh.write(b'{"ph": "i", "name": "end", "pid": 1, "tid": 1, "ts": 2}]}')
    bound = trace_io.MAX_GZIP_RATIO * bomb.stat().st_size
    assert 1 << 20 < bound < 32 << 20  # refused half-way through at most
    events = 0
    with pytest.raises(TraceReadError) as info:
        for chunk in trace_io.iter_trace_events(bomb, {}):
            events += len(chunk)
    assert info.value.reason.startswith("inflates to more than 100x its size (")
    assert info.value.reason.endswith(f" MB read, {bound >> 20} MB allowed; traces inflate 12-18x): a gzip bomb, not "
                                      "a trace")
    assert events * len(event) <= bound  # what was parsed before the refusal
    assert reason(bomb) == info.value.reason


def test_real_traces_inflate_well_inside_the_ratio_bound():
    for trace in sorted(DATA.glob("*/*.json.gz")):
        inflated = len(gzip.decompress(trace.read_bytes()))
        assert inflated < trace_io.MAX_GZIP_RATIO / 4 * trace.stat().st_size, trace


def test_one_huge_line_holding_one_endless_string_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_io, "MAX_PENDING_BYTES", 16 << 20)
    huge = write(tmp_path / "rank0.json", b'{"traceEvents": [{"name": "' + b"x" * (40 << 20) + b'", "ts": 1}]}')
    assert reason(huge).startswith("no complete event in ")


def test_a_real_trace_on_one_line_reads_like_the_indented_one(tmp_path):
    doc = clean_doc()
    one_line = write(tmp_path / "rank0.json", orjson.dumps(doc))
    indented = write(tmp_path / "rank1.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    assert b"\n" not in one_line.read_bytes()
    a, b = parse_trace(one_line), parse_trace(indented)
    ref = parse_trace(DATA / "clean" / "rank-0.json.gz")
    assert a.n_events == b.n_events == ref.n_events > 0 and a.steps == b.steps == ref.steps


def test_deeply_nested_json_is_invalid_json_naming_the_file(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    nested = write(tmp_path / "rank0.json", b'{"traceEvents": [{"name": "a", "ts": 1, "args": ' + deep + b"}]}")
    assert reason(nested).startswith("invalid JSON in traceEvents")
    meta = write(tmp_path / "rank1.json", b'{"deviceProperties": ' + deep + b', "traceEvents": []}')
    assert reason(meta).startswith("invalid JSON outside traceEvents")


# ---- wrong types in every field the analysis reads ----------------------------------------------------------

FIELDS_READ = ("name", "ts", "dur", "tid", "pid", "cat", "ph", "args")
ARGS_READ = ("stream", "correlation", "In msg nelems", "Out msg nelems", "dtype", "Group size", "External id")
WRONG = ("text", -1.5, [1, 2], {"a": 1}, None, True, 10**30)


def _with_field(doc: dict, field: str, value: object, in_args: bool = False) -> dict:
    """The clean trace with ``field`` set to ``value`` on every event that has ``cat`` (ops, kernels, ...)."""
    events = []
    for event in doc["traceEvents"]:
        event = dict(event)
        if "cat" in event:
            if in_args:
                event["args"] = {**(event.get("args") if isinstance(event.get("args"), dict) else {}), field: value}
            else:
                event[field] = value
        events.append(event)
    return {**doc, "traceEvents": events}


@pytest.mark.parametrize("value", WRONG, ids=[type(v).__name__ + str(i) for i, v in enumerate(WRONG)])
@pytest.mark.parametrize(("field", "in_args"), [(f, False) for f in FIELDS_READ] + [(f, True) for f in ARGS_READ])
def test_a_wrong_type_in_any_field_read_is_a_named_file_error_or_ignored_never_a_crash(tmp_path, field, in_args,
                                                                                      value):
    doc = clean_doc()
    path = write(tmp_path / "rank0_h_step1-2.pt.trace.json", _with_field(doc, field, value, in_args))
    try:
        result = analyze_paths([path], OPTS)
    except TraceReadError as err:
        assert err.path == str(path) and err.reason
        return
    # Read: it analysed the rank, or said why it could not.
    assert [r.rank for r in result.ranks] == [0] or result.errors


META_READ = ("distributedInfo", "distributedInfo.rank", "distributedInfo.world_size", "distributedInfo.backend",
             "host_name", "baseTimeNanoseconds")


@pytest.mark.parametrize("value", WRONG, ids=[type(v).__name__ + str(i) for i, v in enumerate(WRONG)])
@pytest.mark.parametrize("field", META_READ)
def test_a_wrong_type_in_the_trace_metadata_is_ignored_and_the_rank_taken_from_the_name(tmp_path, field, value):
    doc = clean_doc()
    outer, _, inner = field.partition(".")
    if inner:
        doc[outer] = {**doc[outer], inner: value}
    else:
        doc[outer] = value
    path = write(tmp_path / "rank0_h_step1-2.pt.trace.json", doc)
    result = analyze_paths([path], OPTS)
    assert [r.rank for r in result.ranks] == [0] and result.errors == []
    assert format_summary(result).startswith("Analysed 1 rank(s), 0 file(s) skipped.")


# ---- the files analyze reads beside the traces: run manifest, step timer ---------------------------------------

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
    assert format_summary(result).startswith("Analysed 1 rank(s), 1 file(s) skipped.")


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
    "records-not-objects": ("timing_rank0.jsonl", b"[1, 2]\n[3]\n\"x\"\n"),
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


DEEP = b"[" * 100_000 + b"]" * 100_000
BESIDE_TRACES = {  # what analyze reads beside the traces: a named error (manifests) or ignored (step timer files)
    "manifest.json": "not valid JSON (nested too deeply)",
    "manifest_rank0_h.json": "not valid JSON (nested too deeply)",
    "timing_summary.json": "",
    "timing_rank0.jsonl": "",
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


# ---- file names, order and duplicates -----------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="non-UTF-8 file names are a POSIX matter")
def test_a_non_utf8_file_name_is_analysed_and_printed_without_crashing(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    name = os.fsdecode(b"rank0_h\xff\xfe_step1-2.pt.trace.json.gz")
    (folder / name).write_bytes((DATA / "clean" / "rank-0.json.gz").read_bytes())
    proc = cli("analyze", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("Analysed 1 rank(s), 0 file(s) skipped.")


def without_paths(result: dict) -> dict:
    for rank in result["ranks"]:
        assert rank.pop("path").endswith(f"_rank{rank['rank']}.json")
    return result


def test_unsorted_events_give_the_same_analysis_as_sorted_ones(tmp_path):
    docs = {r: clean_doc(r) for r in (0, 1)}
    for rank, doc in docs.items():
        write(tmp_path / f"sorted{rank}_rank{rank}.json", doc)
        shuffled = list(doc["traceEvents"])
        random.Random(rank).shuffle(shuffled)
        write(tmp_path / f"shuffled{rank}_rank{rank}.json", {**doc, "traceEvents": shuffled})
    a = without_paths(analyze_paths(sorted(tmp_path.glob("sorted*")), OPTS).to_dict())
    b = without_paths(analyze_paths(sorted(tmp_path.glob("shuffled*")), OPTS).to_dict())
    assert orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


def test_duplicated_events_are_counted_once(tmp_path):
    docs = {r: clean_doc(r) for r in (0, 1)}
    for rank, doc in docs.items():
        write(tmp_path / f"once{rank}_rank{rank}.json", doc)
        write(tmp_path / f"twice{rank}_rank{rank}.json", {**doc, "traceEvents": doc["traceEvents"] * 2})
    a = without_paths(analyze_paths(sorted(tmp_path.glob("once*")), OPTS).to_dict())
    b = without_paths(analyze_paths(sorted(tmp_path.glob("twice*")), OPTS).to_dict())
    assert [r.pop("n_events") * 2 for r in a["ranks"]] == [r.pop("n_events") for r in b["ranks"]]
    assert orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


def test_temporary_files_of_a_killed_write_are_not_read_as_traces(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    trace = (DATA / "clean" / "rank-0.json.gz").read_bytes()
    (folder / "rank0_h_step1-2.pt.trace.json.gz").write_bytes(trace)
    (folder / ".rank1_h_step1-2.pt.trace.json.gz.k3j2.tmp.json.gz").write_bytes(trace[: len(trace) // 2])
    (folder / ".rank1_h_step1-2.pt.trace.json.gz.k3j2.tmp.json").write_bytes(b'{"traceEvents": [{"na')
    assert [p.name for p in trace_io.discover_trace_files([folder])] == ["rank0_h_step1-2.pt.trace.json.gz"]


# ---- pickles: plain data only ---------------------------------------------------------------------------------


class _Exploit:
    def __reduce__(self):  # what a hostile pickle does: call something on load
        return (os.system, ("touch PWNED",))


def test_a_flight_recorder_pickle_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dump = tmp_path / "flight_recorder_rank0_h.pkl"
    dump.write_bytes(pickle.dumps({"entries": [_Exploit()]}))
    with pytest.raises(ValueError, match="refusing to load posix.system"):
        parse_recorder(dump)
    assert not (tmp_path / "PWNED").exists()
    plain = tmp_path / "flight_recorder_rank1_h.pkl"
    buf = io.BytesIO()
    pickle.dump({"entries": [{"collective_seq_id": 3, "profiling_name": "gloo:all_reduce", "state": "started"}]}, buf)
    plain.write_bytes(buf.getvalue())
    assert parse_recorder(plain).seq == 3


def test_no_module_loads_a_pickle_or_torch_file_except_the_plain_data_unpickler():
    sources = {p: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "hf_distprof").rglob("*.py")}
    loaders = ("pickle.load(", "pickle.loads(", "torch.load(", "Unpickler(", "yaml.load(", "yaml.unsafe_load(")
    users = sorted(str(p.relative_to(REPO_ROOT)) for p, text in sources.items() if any(s in text for s in loaders))
    assert users == ["hf_distprof/hang_report.py"]
    text = sources[REPO_ROOT / "hf_distprof" / "hang_report.py"]
    assert "pickle.load(" not in text and "pickle.loads(" not in text and "_PlainUnpickler(" in text
