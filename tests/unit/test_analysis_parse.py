"""The msgspec event decoder against a plain reading of the same traces with ``orjson``.

``parse_trace`` decodes only the fields it reads, into structs; this checks, on the committed gloo traces
and the shared DLRM GPU traces, that what it keeps is exactly what a straightforward pass over the fully
parsed JSON keeps, also when the file is cut into small chunks (cuts inside strings and nested objects).
"""

from __future__ import annotations

import gzip
import math
import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, TraceReadError, analyze_paths
from hf_distprof.analysis.read import trace_io
from hf_distprof.analysis.read.events import STEP_PREFIX, SYNC_NAMES, ParsedTrace, parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"
DLRM = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "dlrm_8gpu_v100"
CPU_CATS = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "ac2g", "Trace"}
CPU_CATS |= {"cpu_instant_event", "fwdbwd", "overhead", "gpu_user_annotation", "Runtime", "Kernel launch"}


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _reference(path: Path) -> dict[str, Any]:
    """What parse_trace must keep, computed the obvious way from the whole parsed file."""
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ops: dict[Any, list[tuple[Any, Any, str]]] = {}
    steps: dict[Any, list[tuple[int, Any, Any]]] = {}
    gloo, fsdp, nccl, gpu, launches = [], [], [], [], {}
    for ev in events:
        cat, dur, args = ev.get("cat"), ev.get("dur"), ev.get("args")
        if cat in ("cpu_op", "user_annotation") and dur is not None:
            ts, name = ev["ts"], ev["name"]
            ops.setdefault(ev.get("tid"), []).append((ts, ts + dur, name))
            if cat == "user_annotation" and name.startswith(STEP_PREFIX):
                steps.setdefault(ev.get("tid"), []).append((int(name[len(STEP_PREFIX) :]), ts, ts + dur))
            elif cat == "user_annotation" and name.startswith("gloo:"):
                gloo.append((ts, ts + dur, name))
            elif cat == "user_annotation" and name.startswith("FSDP::"):
                fsdp.append((ts, ts + dur, name))
            elif cat == "user_annotation" and name.startswith("nccl:"):
                nccl.append((ts, ts + dur, name))
        elif cat in ("cuda_runtime", "cuda_driver"):
            if ev["name"] in SYNC_NAMES and dur is not None:  # the host waiting for the GPU: kept among the ops
                ops.setdefault(ev.get("tid"), []).append((ev["ts"], ev["ts"] + dur, ev["name"]))
            if isinstance(args, dict) and args.get("correlation") is not None:
                launches[args["correlation"]] = ev["ts"]
        elif cat is not None and cat not in CPU_CATS and dur is not None and isinstance(args, dict):
            stream = _int(args.get("stream"))
            if stream is not None:
                ts = ev["ts"]
                start, end = (ts, ts + dur)
                if isinstance(ts, float):
                    start, end = math.ceil(ts), math.floor(ts + dur)
                corr = _int(args.get("correlation"))
                gpu.append((start, end, ev["name"], stream, -1 if corr is None else corr))
    main = max(steps, key=lambda t: len(steps[t]))
    return {
        "n_events": len(events),
        "main_tid": main,
        "steps": sorted((s[1], s[0], s[2]) for s in steps[main]),
        "main_ops": sorted(ops[main]),
        "comm_spans": sorted(gloo),
        "fsdp_spans": sorted(fsdp),
        "nccl_ops": sorted(nccl),
        "gpu": gpu,
        "launches": launches,
    }


def _kept(trace: ParsedTrace) -> dict[str, Any]:
    gpu = trace.gpu
    return {
        "n_events": trace.n_events,
        "main_tid": trace.main_tid,
        "steps": [(s.start, s.number, s.end) for s in trace.steps],
        "main_ops": trace.main_ops,
        "comm_spans": trace.comm_spans,
        "fsdp_spans": trace.fsdp_spans,
        "nccl_ops": trace.nccl_ops,
        "gpu": list(zip(gpu.start, gpu.end, gpu.name, gpu.stream, gpu.correlation, strict=True)),
        "launches": trace.launches,
    }


def _cases() -> list[Path]:
    # The committed gloo traces, and two GPU ranks of the shared DLRM set when it is there.
    return sorted(DATA.glob("*/rank-*.json.gz")) + sorted(DLRM.glob("worker[01]_*.json.gz"))


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("chunk", [997, trace_io.CHUNK_BYTES])
def test_parse_keeps_what_a_full_orjson_pass_keeps(
    monkeypatch: pytest.MonkeyPatch, path: Path, chunk: int
) -> None:
    monkeypatch.setattr(trace_io, "CHUNK_BYTES", chunk)
    kept = _kept(parse_trace(path))
    ref = _reference(path)
    assert kept == ref
    # Same values and the same types (an int timestamp stays an int: it changes float sums).
    assert [type(x) for op in kept["main_ops"] for x in op] == [type(x) for op in ref["main_ops"] for x in op]
    assert all(sys.intern(op[2]) is op[2] for op in kept["main_ops"])


@pytest.mark.parametrize(("events", "kind"), [(b"[{}, 1, {}]", "int"), (b'[{"ph": "X"}, "x", {}]', "str")])
def test_an_event_that_is_not_an_object_is_named(tmp_path: Path, events: bytes, kind: str) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes(b'{"traceEvents": ' + events + b', "distributedInfo": {"rank": 0}}')
    with pytest.raises(TraceReadError, match=f"traceEvents holds a {kind}"):
        parse_trace(path)


def _tiny_trace(path: Path, extra: dict[str, Any], rank: int = 0) -> Path:
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "tid": 1, "ts": 0, "dur": 100}
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 10, "dur": 5}
    path.write_bytes(orjson.dumps({"traceEvents": [step, op, extra], "distributedInfo": {"rank": rank}}))
    return path


_STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "tid": 1}
_OP = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 1}
_KERNEL = {"ph": "X", "cat": "kernel", "name": "gemm", "args": {"stream": 7, "correlation": 1}}
_LAUNCH = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "dur": 1, "args": {"correlation": 1}}


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({**_STEP, "ts": 200, "dur": -10}, "'ProfilerStep#2' has dur -10, which is negative"),
        ({**_OP, "ts": 20, "dur": -0.5}, "'aten::add' has dur -0.5, which is negative"),
        ({**_OP, "ts": 1e308, "dur": 1e308}, "'aten::add' has ts 1e+308, which is not a finite time"),
        ({**_STEP, "ts": 200, "dur": 1e308}, "has dur 1e+308, which is not a finite time"),
        ({**_OP, "ts": True, "dur": 1}, "'aten::add' has ts True, which is a bool, not a number"),
        ({**_OP, "ts": 20, "dur": False}, "has dur False, which is a bool, not a number"),
        ({**_KERNEL, "ts": 20.5, "dur": -1.0}, "'gemm' has dur -1.0, which is negative"),
        ({**_KERNEL, "ts": 1e300, "dur": 1.0}, "'gemm' has ts 1e+300, which is not a finite time"),
        ({**_LAUNCH, "ts": True}, "'cudaLaunchKernel' has ts True, which is a bool"),
    ],
)
def test_impossible_times_are_rejected_naming_the_file(
    tmp_path: Path, event: dict[str, Any], message: str
) -> None:
    bad = _tiny_trace(tmp_path / "rank0.json", event)
    with pytest.raises(TraceReadError, match=re.escape(message)) as exc:
        parse_trace(bad)
    assert exc.value.path == str(bad)
    # In a run, the file becomes an error and the other ranks are still analysed.
    _tiny_trace(tmp_path / "rank1.json", {**_OP, "ts": 20, "dur": 0}, rank=1)
    result = analyze_paths([tmp_path], AnalysisOptions(workers=1))
    assert [r.rank for r in result.ranks] == [1] and result.ranks[0].steps[0].duration_us == 100
    assert [(e.path, message in e.reason) for e in result.errors] == [(str(bad), True)]


def test_numbers_beyond_float_range_and_valid_edge_times(tmp_path: Path) -> None:
    # 1e400 (inf as a float) is refused by the decoder, so inf and nan never reach the analysis from JSON.
    path = tmp_path / "rank0.json"
    path.write_bytes(
        b'{"distributedInfo": {"rank": 0}, "traceEvents": [{"ph": "X", "cat": "user_annotation", "tid": 1,'
        b' "name": "ProfilerStep#1", "ts": 1e400, "dur": 10}]}'
    )
    with pytest.raises(TraceReadError, match="invalid JSON in traceEvents"):
        parse_trace(path)
    # A zero duration, a float time and a negative time (before the trace's base time) are all fine.
    for ts in (20.25, -5):
        ops = parse_trace(_tiny_trace(tmp_path / "ok.json", {**_OP, "ts": ts, "dur": 0})).main_ops
        assert (ts, ts, "aten::add") in ops
