"""Parsing: one trace file -> the few compact event lists the analyzers need.

Only complete events (``ph == "X"``) that some analyzer reads are kept, as tuples of plain numbers and
interned names: profiler steps, CPU ops and annotations per thread, ``gloo:*`` collective spans, GPU
kernels/memcpy/memset, and the correlation id -> timestamp of each CUDA launch. A 50 MB trace becomes a
few MB of tuples.

The events are decoded by msgspec into :class:`~hf_distprof.analysis.decode.Event` structs that declare
only the fields read here (``cat``, ``name``, ``tid``, ``ts``, ``dur``, ``args.stream``,
``args.correlation`` and the few keys that give a collective's message size): every other key, and most
of the bytes of a trace (``args`` of CPU ops, flow events' ids ...), is skipped by the decoder without
building a Python object, which makes parsing several times faster than a generic ``orjson.loads``.
Fields are typed ``Any`` and non-object events or ``args`` are allowed, so a decoded event carries exactly
the values ``orjson`` would give and malformed traces fail the same way.

Message sizes (:class:`~hf_distprof.analysis.message_sizes.MessageSize`) come from ``record_param_comms``
ops, whose ``args`` state them in newer PyTorch builds with NCCL, and, when the profiler recorded shapes,
from the ``Input Dims`` / ``Input type`` of ``nccl:*`` and ``gloo:*`` annotations and ``c10d::*`` ops.
Every op carries shapes in such a trace and msgspec cannot decode them for a few events only, so reading
them costs ~25% more parse time on a shape-recorded GPU trace: by default they are read on CPU-backend
traces only (small, and with no other source of sizes), see :func:`parse_trace`.
"""

from __future__ import annotations

import math
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from hf_distprof.analysis import message_sizes as sizes
from hf_distprof.analysis.decode import Args, ChunkDecoder, Event, ShapedArgs
from hf_distprof.analysis.message_sizes import MessageSize
from hf_distprof.analysis.trace_io import TraceReadError, iter_decoded_events, trace_rank

# Event categories on CPU threads that can never be GPU activity; any other category is a GPU event when
# its args carry an integer "stream" (HTA's rule), so new Kineto GPU categories are not missed.
_CPU_CATS = frozenset(
    {
        "cpu_op",
        "user_annotation",
        "python_function",
        "cuda_runtime",
        "cuda_driver",
        "cpu_instant_event",
        "Trace",
        "fwdbwd",
        "ac2g",
        "overhead",
        "gpu_user_annotation",
        "Runtime",
        "Kernel launch",
    }
)
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# CPU-side categories that no analyzer reads (flow events, Python stacks ...): skipped at once.
_UNUSED_CPU_CATS = _CPU_CATS - _LAUNCH_CATS - {"cpu_op", "user_annotation"}
STEP_PREFIX = "ProfilerStep#"
# Times are microseconds. Past 1e18 us (~31,700 years) a value is not a time, and sums of such values
# overflow to inf; 1e18 also rejects inf and (as every comparison with it is false) nan.
_MAX_TIME_US = 1e18

# (start_us, end_us, name)
Span = tuple[float, float, str]

RECORD_PARAM_COMMS = "record_param_comms"
# The header is read up to here to find the backend (Kineto writes it before the events, ~1 kB in).
_HEADER_BYTES = 1 << 16
_BACKEND_RE = re.compile(rb'"backend"\s*:\s*"([^"]*)"')


@dataclass(frozen=True)
class Step:
    """One ``ProfilerStep#N`` annotation: the CPU-side extent of a profiled step."""

    number: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Wall time of the step on the CPU, in microseconds."""
        return self.end - self.start


@dataclass
class GpuEvent:
    """GPU activity columns (kernels, memcpy, memset), one list entry per event, in file order."""

    start: list[int | float] = field(default_factory=list)
    end: list[int | float] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    correlation: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class ParsedTrace:
    """What the analyzers read from one rank's trace. Timestamps are the trace's own, in microseconds."""

    path: str
    rank: int
    world_size: int | None
    backend: str | None
    host: str | None
    base_time_ns: int
    steps: list[Step]
    main_tid: Any
    main_ops: list[Span]  # cpu_op and user_annotation events on the thread that runs the steps
    comm_spans: list[Span]  # gloo:* spans (any thread): the time collectives take on CPU backends
    c10d_ops: list[Span]  # c10d::* ops on the main thread: they name the collectives
    nccl_ops: list[Span]  # nccl:* annotations (any thread): they name the NCCL kernels launched under them
    fsdp_spans: list[Span]  # FSDP::* annotations (any thread): FSDP unit and forward/backward of a collective
    gpu: GpuEvent
    launches: dict[int, float]  # correlation id -> CPU timestamp of the CUDA launch
    n_events: int
    message_sizes: dict[Span, MessageSize] = field(default_factory=dict)
    """Sizes recorded by ``record_param_comms`` (any thread), ``nccl:*`` and ``gloo:*`` annotations (any
    thread) and ``c10d::*`` ops (main thread), keyed by the event's span as it stands in the other lists."""


@dataclass
class _Collected:
    """Events gathered in one pass over the file, before the main thread is known."""

    ops: list[Event] = field(default_factory=list)  # cpu_op events, any thread
    annotations: list[Event] = field(default_factory=list)  # user_annotation events, any thread
    gpu: GpuEvent = field(default_factory=GpuEvent)
    launches: dict[int, float] = field(default_factory=dict)
    n_events: int = 0


def _collect(path: Path, meta: dict[str, Any], decode: ChunkDecoder) -> _Collected:
    """One pass over the file: sort the events into the lists the analyzers read, skip the rest.

    CPU ops are kept as decoded structs and turned into spans only for the training thread, once it is
    known (the thread holding the ``ProfilerStep#N`` annotations), as no analyzer reads other threads'
    ops. The branches are ordered by how common each category is in Kineto traces.

    GPU events' float (nanosecond-resolution) timestamps are rounded inward like HTA's (ceil start, floor
    end), so that back-to-back kernels do not overlap by a fraction of a microsecond
    (pytorch/pytorch#122425) and our numbers match its numbers.
    """
    out = _Collected()
    ops_append = out.ops.append
    annotations_append = out.annotations.append
    gpu = out.gpu
    launches = out.launches
    unset = msgspec.UNSET
    gpu_start, gpu_end = gpu.start.append, gpu.end.append
    ceil, floor, flt, int_, max_us = math.ceil, math.floor, float, int, _MAX_TIME_US
    event_t, args_t = decode.event_type, decode.args_type
    for chunk in iter_decoded_events(path, meta, decode):
        out.n_events += len(chunk)
        try:
            for ev in chunk:
                cat = ev.cat
                if cat == "cpu_op":
                    ops_append(ev)
                elif cat in _UNUSED_CPU_CATS:
                    continue
                elif cat in _LAUNCH_CATS:
                    args = ev.args
                    if type(args) is args_t:
                        corr = args.correlation
                        if corr is not None:
                            ts = ev.ts
                            if ts is unset:  # _required, inlined: one launch per kernel
                                raise KeyError("ts")
                            tt = type(ts)
                            if not ((tt is flt or tt is int_) and -max_us <= ts <= max_us):
                                _check_time(path, ev, ts, 0)
                            launches[corr] = ts
                elif cat == "user_annotation":
                    annotations_append(ev)
                elif cat is not None:  # any other category is GPU activity when it names a stream
                    dur = ev.dur
                    args = ev.args
                    if dur is None or type(args) is not args_t:
                        continue
                    stream = _as_int(args.stream)
                    if stream is None:
                        continue
                    ts = ev.ts
                    if ts is unset:  # _required, inlined like the two calls below: one kernel per launch
                        raise KeyError("ts")
                    # _check_time, inlined: a bool is neither a float nor an int here.
                    tt = type(ts)
                    td = type(dur)
                    if not (
                        (tt is flt or tt is int_)
                        and (td is flt or td is int_)
                        and -max_us <= ts <= max_us
                        and 0 <= dur <= max_us
                    ):
                        _check_time(path, ev, ts, dur)
                    # _round_like_hta, inlined.
                    if tt is flt:
                        gpu_start(ceil(ts))
                        gpu_end(floor(ts + dur))
                    else:
                        gpu_start(ts)
                        gpu_end(ts + dur)
                    gpu.name.append(sys.intern(_required(ev.name, "name")))
                    gpu.stream.append(stream)
                    corr = _as_int(args.correlation)
                    gpu.correlation.append(-1 if corr is None else corr)
        except AttributeError:
            # Checked here rather than per event: only a non-object event lacks ``.cat``.
            bad = next((ev for ev in chunk if type(ev) is not event_t), None)
            if bad is None:
                raise
            raise TraceReadError(path, f"not a trace: traceEvents holds a {type(bad).__name__}") from None
    return out


def _spans(path: Path, events: list[Event]) -> list[Span]:
    """(start, end, interned name) of complete CPU events; events without a duration are skipped.

    Raises:
        TraceReadError: An event's ``ts`` or ``dur`` is not a time (see :func:`_check_time`).
    """
    intern = sys.intern
    unset = msgspec.UNSET
    flt, int_, max_us = float, int, _MAX_TIME_US
    out = []
    for ev in events:
        dur = ev.dur
        if dur is None:
            continue
        ts = ev.ts
        name = ev.name
        if ts is unset or name is unset:  # inlined _required: this loop runs for most events
            raise KeyError("ts" if ts is unset else "name")
        # Inlined _check_time, for the same reason.
        tt = type(ts)
        td = type(dur)
        if not (
            (tt is flt or tt is int_) and (td is flt or td is int_) and -max_us <= ts <= max_us and 0 <= dur <= max_us
        ):
            _check_time(path, ev, ts, dur)
        out.append((ts, ts + dur, intern(name)))
    return out


def _check_time(path: Path, ev: Event, ts: Any, dur: Any) -> None:
    """Raise unless ``ts`` is a time and ``dur`` a duration, in microseconds.

    A time is an int or a float (not a bool, which JSON-wise is neither) within +-1e18, so finite; a
    duration is one in [0, 1e18]. Checked only on the events an analyzer keeps, where one bad value would
    otherwise print as a negative step, inf or nan.

    Raises:
        TraceReadError: Naming the event and the bad value.
    """
    for key, value, low in (("ts", ts, -_MAX_TIME_US), ("dur", dur, 0)):
        if type(value) is not float and type(value) is not int:
            bad = f"is a {type(value).__name__}, not a number"
        elif not low <= value <= _MAX_TIME_US:
            bad = "is negative" if value < 0 and key == "dur" else "is not a finite time in microseconds"
        else:
            continue
        name = ev.name if isinstance(ev.name, str) else "?"
        raise TraceReadError(path, f"event {name!r} has {key} {value!r}, which {bad}")


def parse_trace(path: str | os.PathLike[str], shapes: bool | None = None) -> ParsedTrace:
    """Read one trace file into a :class:`ParsedTrace`.

    Args:
        path: A Kineto trace (``.json`` or ``.json.gz``).
        shapes: Whether to read collectives' message sizes from the recorded input shapes, when the trace
            has them (``record_shapes``). None: only on traces whose header names a backend other than
            NCCL (gloo: small traces, no other source of sizes); NCCL traces of newer PyTorch state sizes
            on ``record_param_comms``, which are always read. True costs ~25% more parse time on a
            shape-recorded GPU trace.

    Returns:
        The compact events of that trace.

    Raises:
        TraceReadError: The file cannot be read or parsed, has no rank, has no ``ProfilerStep#N``, or an event
            that the analysis reads has a ``ts`` or ``dur`` that is not a time (a bool, negative duration,
            inf, nan, beyond 1e18 us).
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    decode = ChunkDecoder(_cpu_backend(path) if shapes is None else shapes)
    got = _collect(path, meta, decode)
    n_events = got.n_events
    if n_events == 0:
        raise TraceReadError(path, "trace has no events")
    rank = trace_rank(path, meta)
    steps_by_tid: dict[Any, list[Step]] = {}
    comm_spans: list[Span] = []
    nccl_ops: list[Span] = []
    fsdp_spans: list[Span] = []
    for ev in got.annotations:
        dur = ev.dur
        if dur is None:
            continue
        ts = _required(ev.ts, "ts")
        name = sys.intern(_required(ev.name, "name"))
        _check_time(path, ev, ts, dur)  # one annotation per step or collective: not worth inlining
        if name.startswith(STEP_PREFIX):
            number = _step_number(name)
            if number is not None:
                steps_by_tid.setdefault(ev.tid, []).append(Step(number, ts, ts + dur))
        elif name.startswith("gloo:"):
            comm_spans.append((ts, ts + dur, name))
        elif name.startswith("FSDP::"):
            fsdp_spans.append((ts, ts + dur, name))
        elif name.startswith("nccl:"):
            nccl_ops.append((ts, ts + dur, name))
    if not steps_by_tid:
        raise TraceReadError(
            path,
            f"no ProfilerStep#N events among {n_events} events (record with torch.profiler and "
            "call prof.step() once per training step)",
        )
    gpu, launches = got.gpu, got.launches
    # The thread that annotates the steps is the training loop's thread.
    main_tid = max(steps_by_tid, key=lambda t: len(steps_by_tid[t]))
    steps = sorted(steps_by_tid[main_tid], key=lambda s: s.start)
    main_ops = _spans(path, [ev for ev in got.ops if ev.tid == main_tid])
    main_ops += _spans(path, [ev for ev in got.annotations if ev.tid == main_tid])
    main_ops.sort()
    c10d_ops = [s for s in main_ops if s[2].startswith("c10d::")]
    comm_spans.sort()
    nccl_ops.sort()
    fsdp_spans.sort()
    raw_info = meta.get("distributedInfo")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    # record_param_comms states sizes for NCCL only, whose collectives nccl:* annotations name.
    sized = [ev for ev in got.ops if ev.name == RECORD_PARAM_COMMS] if nccl_ops else []
    sized += [ev for ev in decode.sized if ev.cat == "user_annotation" or ev.tid == main_tid]
    return ParsedTrace(
        path=str(path),
        rank=rank,
        world_size=_as_int(info.get("world_size")),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        host=meta.get("host_name") if isinstance(meta.get("host_name"), str) else None,
        base_time_ns=_as_int(meta.get("baseTimeNanoseconds")) or 0,
        steps=steps,
        main_tid=main_tid,
        main_ops=main_ops,
        comm_spans=comm_spans,
        c10d_ops=c10d_ops,
        nccl_ops=nccl_ops,
        fsdp_spans=fsdp_spans,
        gpu=gpu,
        launches=launches,
        n_events=n_events,
        message_sizes=_message_sizes(path, sized),
    )


def _message_sizes(path: Path, events: list[Event]) -> dict[Span, MessageSize]:
    """The size each of ``events`` records, keyed by its span; events that record none are left out."""
    out: dict[Span, MessageSize] = {}
    for ev in events:
        args = ev.args
        if not isinstance(args, Args) or ev.dur is None:
            continue
        if ev.name == RECORD_PARAM_COMMS:
            size = sizes.from_param_comms(
                _as_int(args.in_nelems), _as_int(args.out_nelems), args.dtype, _as_int(args.group_size)
            )
        elif isinstance(args, ShapedArgs) and args.dims and args.types:
            size = sizes.from_shapes(ev.name, bytes(args.dims), bytes(args.types))
        else:
            continue
        if size is not None:
            _check_time(path, ev, ev.ts, ev.dur)
            out[(ev.ts, ev.ts + ev.dur, sys.intern(ev.name))] = size
    return out


def _cpu_backend(path: Path) -> bool:
    """Whether the trace's header (the top-level keys before the events, where Kineto writes
    ``distributedInfo``) names a backend other than NCCL. Any doubt (no backend, unreadable) is False: the
    reader proper reports a bad file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEADER_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(wbits=47).decompress(head, _HEADER_BYTES)
    except (OSError, zlib.error):
        return False
    cut = head.find(b'"traceEvents"')
    match = _BACKEND_RE.search(head if cut < 0 else head[:cut])
    return match is not None and match.group(1) != b"nccl"


def _required(value: Any, key: str) -> Any:
    # A missing key is a malformed event, reported like the KeyError of ``event[key]``.
    if value is msgspec.UNSET:
        raise KeyError(key)
    return value


def _step_number(name: str) -> int | None:
    try:
        return int(name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def _as_int(value: Any) -> int | None:
    """``int(value)`` for ints and integer strings (HTA's stream normalisation), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None
