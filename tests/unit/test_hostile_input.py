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
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, TraceReadError, analyze_paths, format_summary
from hf_distprof.analysis.read import trace_io
from hf_distprof.analysis.read.events import parse_trace
from hf_distprof.runs.hang_report import Recorder, parse_recorder

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
    assert format_summary(result).startswith("Analysed 1 rank(s), 0 file(s) skipped or read in part.")


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
    assert proc.stdout.startswith("Analysed 1 rank(s), 0 file(s) skipped or read in part.")


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


@pytest.mark.parametrize("entry", [
    {"collective_seq_id": "7"}, {"collective_seq_id": [7]}, {"collective_seq_id": None}, {"collective_seq_id": True},
    {"collective_seq_id": 7, "profiling_name": 5, "state": ["started"], "input_sizes": "big"},
    {"collective_seq_id": 7, "input_sizes": [[1, "x"]]}, {"collective_seq_id": 7, "input_sizes": [3]},
], ids=["seq-text", "seq-list", "seq-null", "seq-bool", "fields-wrong", "size-text", "sizes-flat"])
def test_a_flight_recorder_entry_with_wrong_types_reads_as_absent_fields(tmp_path, entry):
    dump = tmp_path / "flight_recorder_rank3_h.pkl"
    dump.write_bytes(pickle.dumps({"entries": [entry]}))
    seq = 7 if entry["collective_seq_id"] == 7 else None
    assert parse_recorder(dump) == Recorder(3, seq, None, None, None)


@pytest.mark.parametrize("raw", [b"g0\n.", b"\x80\x05\x95\x00", b"h\x05.", b"", b"\x80\x05K\x01."])
def test_a_malformed_pickle_is_a_named_error(tmp_path, raw):
    dump = tmp_path / "flight_recorder_rank0_h.pkl"
    dump.write_bytes(raw)
    named = "^" + re.escape(str(dump)) + ": (not a readable flight-recorder dump|no 'entries' list)"
    with pytest.raises(ValueError, match=named):
        parse_recorder(dump)


def test_no_module_loads_a_pickle_or_torch_file_except_the_plain_data_unpickler():
    sources = {p: p.read_text(encoding="utf-8") for p in (REPO_ROOT / "hf_distprof").rglob("*.py")}
    loaders = ("pickle.load(", "pickle.loads(", "torch.load(", "Unpickler(", "yaml.load(", "yaml.unsafe_load(")
    users = sorted(str(p.relative_to(REPO_ROOT)) for p, text in sources.items() if any(s in text for s in loaders))
    assert users == ["hf_distprof/runs/flight_recorder.py"]
    text = sources[REPO_ROOT / "hf_distprof" / "runs" / "flight_recorder.py"]
    assert "pickle.load(" not in text and "pickle.loads(" not in text and "_PlainUnpickler(" in text
