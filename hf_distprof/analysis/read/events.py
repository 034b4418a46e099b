"""Parsing: one trace file -> the few compact event lists the analyzers need.

Only complete events (``ph == "X"``) that some analyzer reads are kept, as tuples of plain numbers and
interned names: profiler steps, CPU ops and annotations per thread, ``gloo:*`` collective spans, GPU
kernels/memcpy/memset, and the correlation id -> timestamp of each CUDA launch. A 50 MB trace becomes a
few MB of tuples.

The events are decoded by msgspec into :class:`~hf_distprof.analysis.read.decode.Event` structs that declare
only the fields read here (``cat``, ``name``, ``tid``, ``ts``, ``dur``, ``args.stream``,
``args.correlation`` and the few keys that give a collective's message size): every other key, and most
of the bytes of a trace (``args`` of CPU ops, flow events' ids ...), is skipped by the decoder without
building a Python object, which makes parsing several times faster than a generic ``orjson.loads``.
Fields are typed ``Any`` and non-object events or ``args`` are allowed, so a decoded event carries exactly
the values ``orjson`` would give and malformed traces fail the same way.

Message sizes (:class:`~hf_distprof.analysis.read.message_sizes.MessageSize`) come from ``record_param_comms``
ops, whose ``args`` state them in newer PyTorch builds with NCCL, and, when the profiler recorded shapes,
from the ``Input Dims`` / ``Input type`` of ``nccl:*`` and ``gloo:*`` annotations and ``c10d::*`` ops.
Every op carries shapes in such a trace and msgspec cannot decode them for a few events only, so reading
them costs ~25% more parse time on a shape-recorded GPU trace: by default they are read on CPU-backend
traces only (small, and with no other source of sizes), see :func:`parse_trace`.

``[memory]`` instant events (``profile_memory``) are kept, as :class:`MemoryEvents`, when the trace's header
says the profiler recorded them (``"profile_memory": 1``, which ``torch.profiler.profile`` writes), so that
other traces are decoded exactly as before, at no cost.
"""

from __future__ import annotations

import math
import os
import re
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from hf_distprof.analysis.read import message_sizes as sizes
from hf_distprof.analysis.read.decode import Args, ChunkDecoder, Event, MemoryArgs, ShapedArgs, ShapedMemoryArgs
from hf_distprof.analysis.read.message_sizes import MessageSize
from hf_distprof.analysis.read.pauses import PAUSE_NAME, after_pauses, gpu_outside, without_pauses
from hf_distprof.analysis.results.rank import StepAfterPause
from hf_distprof.analysis.read.trace_io import TraceReadError, iter_decoded_events, steps_named, trace_rank

# Event categories on CPU threads that can never be GPU activity; any other category is a GPU event when
# its args carry an integer "stream" (HTA's rule), so new Kineto GPU categories are not missed.
_CPU_CATS = frozenset({
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "cpu_instant_event", "Trace",
    "fwdbwd", "ac2g", "overhead", "gpu_user_annotation", "Runtime", "Kernel launch",
})
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# CUDA calls in which the host waits for the GPU (a blocking cudaMemcpy too): kept among the ops (rank/cpu's split).
SYNC_NAMES = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
# CPU-side categories that no analyzer reads (flow events, Python stacks ...): skipped at once.
_UNUSED_CPU_CATS = _CPU_CATS - _LAUNCH_CATS - {"cpu_op", "user_annotation"}
STEP_PREFIX = "ProfilerStep#"
# Times are microseconds. Past 1e18 us (~31,700 years) a value is not a time, and sums of such values
# overflow to inf; 1e18 also rejects inf and (as every comparison with it is false) nan.
_MAX_TIME_US = 1e18

# (start_us, end_us, name)
Span = tuple[float, float, str]

_T = TypeVar("_T")

RECORD_PARAM_COMMS = "record_param_comms"
MEMORY_EVENT = "[memory]"
_INSTANT_CAT = "cpu_instant_event"  # the category of [memory] events
# c10::DeviceType codes of [memory] events' "Device Type"; others are named "device_type_<code>".
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia"}
# The header is read up to here to find the backend (Kineto writes it before the events, ~1 kB in).
_HEADER_BYTES = 1 << 16
_BACKEND_RE = re.compile(rb'"backend"\s*:\s*"([^"]*)"')
_PROFILE_MEMORY_RE = re.compile(rb'"profile_memory"\s*:\s*(?:1|"1"|true)\b')


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
class MemoryEvents:
    """``[memory]`` events as columns, in time order, and the CPU ops of the threads that hold them.

    Every process-wide allocation or free the profiler saw, on any device, records the bytes (> 0 allocated,
    < 0 freed) and the device's allocated total after it. All CPU events of a trace come from one process,
    so a thread id alone names the thread an allocation ran on.
    """

    ts: list[float]
    tid: list[Any]
    device: list[str]  # "cpu", "cuda:0" ...
    bytes: list[int]
    total_allocated: list[int]
    ops: dict[Any, list[Span]]
    """``cpu_op`` spans of each thread in ``tid``, sorted (by start, then end): an allocation is attributed to
    the innermost op around it."""

    def __len__(self) -> int:
        return len(self.ts)


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
    memory: MemoryEvents | None = None
    """The ``[memory]`` events; None unless the header says the profiler recorded them."""
    main_op_columns: tuple[list[Any], list[Any], list[int], list[str]] | None = field(default=None, repr=False,
                                                                                       compare=False)
    """``main_ops`` as columns (starts, ends, name indices into a string table, the table) when the trace was
    read from its compact file, which stores them so: the vectorised analyzers read them as they are."""
    steps_after_pause: list[StepAfterPause] = field(default_factory=list)  # left out of ``steps`` (read.pauses)


@dataclass
class _Collected:
    """Events gathered in one pass over the file, before the main thread is known."""

    ops: list[Event] = field(default_factory=list)  # cpu_op events, any thread
    annotations: list[Event] = field(default_factory=list)  # user_annotation events, any thread
    gpu: GpuEvent = field(default_factory=GpuEvent)
    launches: dict[int, float] = field(default_factory=dict)
    memory: list[Event] = field(default_factory=list)  # [memory] events, when the decoder reads them
    n_events: int = 0


def _collect(path: Path, meta: dict[str, Any], decode: ChunkDecoder) -> _Collected:
    """One pass over the file: sort the events into the lists the analyzers read, skip the rest.

    CPU ops are kept as decoded structs and turned into spans only for the training thread, once it is
    known (the thread holding the ``ProfilerStep#N`` annotations), as no analyzer reads other threads'
    ops. The branches are ordered by how common each category is in Kineto traces.

    GPU events' float (nanosecond-resolution) timestamps are rounded inward like HTA's (ceil start, floor
    end), so that back-to-back kernels do not overlap by a fraction of a microsecond
    (pytorch/pytorch#122425) and our numbers match its numbers.

    ``[memory]`` events are kept when the decoder reads their keys; otherwise their category is skipped with
    the other unused ones, and the loop runs exactly as it does for a trace without them.
    """
    out = _Collected()
    ops_append = out.ops.append
    annotations_append = out.annotations.append
    memory_append = out.memory.append
    unused = _UNUSED_CPU_CATS - {_INSTANT_CAT} if decode.memory else _UNUSED_CPU_CATS
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
                elif cat in unused:
                    continue
                elif cat in _LAUNCH_CATS:
                    if ev.name in SYNC_NAMES:
                        ops_append(ev)
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
                        # Instant events: only [memory] ones (their category reaches here only when read).
                        if cat == _INSTANT_CAT and ev.name == MEMORY_EVENT:
                            memory_append(ev)
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
        The compact events of that trace; its ``[memory]`` events when the header says the profiler
        recorded them (``profile_memory``).

    Raises:
        TraceReadError: The file cannot be read or parsed, has no rank, has no ``ProfilerStep#N``, or an event
            that the analysis reads has a ``ts`` or ``dur`` that is not a time (a bool, negative duration,
            inf, nan, beyond 1e18 us), or a ``[memory]`` event has a byte count or device that is not an
            integer.
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    head = _header(path)
    profiles_memory = _PROFILE_MEMORY_RE.search(head) is not None
    decode = ChunkDecoder(_cpu_backend(head) if shapes is None else shapes, profiles_memory)
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
    # A trace written or concatenated twice holds every event twice: each list is sorted, and its exact repeats
    # dropped (in one pass once sorted), so that nothing is counted twice.
    steps, cut = steps_named(path, _unique_sorted(steps_by_tid[main_tid], key=lambda s: (s.start, s.end, s.number)))
    main_ops = _spans(path, [ev for ev in got.ops if ev.tid == main_tid])
    memory = _memory_events(path, got.memory, got.ops, main_tid, main_ops) if got.memory else None
    main_ops = _unique_sorted(main_ops + _spans(path, [ev for ev in got.annotations if ev.tid == main_tid]))
    left: list[StepAfterPause] = []
    if cut or any(ev.name == PAUSE_NAME for ev in got.annotations):  # an evaluation or a checkpoint between steps
        steps, left, cut = after_pauses(steps, main_ops, cut)
        gpu = gpu_outside(gpu, launches, main_ops, cut)
        steps, main_ops, comm_spans, nccl_ops, fsdp_spans = without_pauses(steps, main_ops, comm_spans, nccl_ops,
                                                                            fsdp_spans, cut=cut)
    c10d_ops = [s for s in main_ops if s[2].startswith("c10d::")]
    comm_spans = _unique_sorted(comm_spans)
    nccl_ops = _unique_sorted(nccl_ops)
    fsdp_spans = _unique_sorted(fsdp_spans)
    if len(steps) < len(steps_by_tid[main_tid]):
        gpu = _unique_gpu(gpu)  # only then: hashing every kernel of a large GPU trace is not free
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
        memory=memory,
        steps_after_pause=left,
    )


def _unique_sorted(items: list[_T], key: Callable[[_T], Any] | None = None) -> list[_T]:
    """``items`` sorted, each exact repeat dropped."""
    ordered = sorted(items, key=key)  # type: ignore[type-var, arg-type]
    out: list[_T] = []
    for item in ordered:
        if not out or item != out[-1]:
            out.append(item)
    return out


def _unique_gpu(gpu: GpuEvent) -> GpuEvent:
    """The GPU columns without events repeated exactly (same start, end, stream, correlation and name)."""
    seen: set[tuple[Any, ...]] = set()
    out = GpuEvent()
    for row in zip(gpu.start, gpu.end, gpu.name, gpu.stream, gpu.correlation, strict=True):
        if row in seen:
            continue
        seen.add(row)
        out.start.append(row[0])
        out.end.append(row[1])
        out.name.append(row[2])
        out.stream.append(row[3])
        out.correlation.append(row[4])
    return out


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


def _header(path: Path) -> bytes:
    """The trace's header: the top-level keys before the events, where Kineto writes ``distributedInfo`` and
    the profiler's options. Empty when unreadable: the reader proper reports a bad file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEADER_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(wbits=47).decompress(head, _HEADER_BYTES)
    except (OSError, zlib.error):
        return b""
    cut = head.find(b'"traceEvents"')
    return head if cut < 0 else head[:cut]


def _cpu_backend(head: bytes) -> bool:
    """Whether the trace's header names a backend other than NCCL; False without one."""
    match = _BACKEND_RE.search(head)
    return match is not None and match.group(1) != b"nccl"


def default_shapes(path: str | os.PathLike[str]) -> bool:
    """What :func:`parse_trace` with ``shapes=None`` does on this trace: read recorded shapes (a header naming a
    backend other than NCCL) or not."""
    return _cpu_backend(_header(Path(path)))


def _memory_events(
    path: Path, events: list[Event], ops: list[Event], main_tid: Any, main_cpu_ops: list[Span]
) -> MemoryEvents:
    """The ``[memory]`` events as columns in time order, with the ``cpu_op`` spans of their threads.

    Args:
        path: The trace, for error messages.
        events: The ``[memory]`` events, in file order.
        ops: The ``cpu_op`` events of every thread.
        main_tid: The training thread, whose ops are already spans: ``main_cpu_ops``.
        main_cpu_ops: Its ``cpu_op`` spans.

    Raises:
        TraceReadError: An event's ``ts`` is not a time, its ``args`` not an object, or one of its ``Bytes``,
            ``Total Allocated``, ``Device Type``, ``Device Id`` not an integer.
    """
    ts_col: list[float] = []
    tids: list[Any] = []
    devices: list[str] = []
    amounts: list[int] = []
    totals: list[int] = []
    names: dict[tuple[int, int], str] = {}
    flt, int_, max_us = float, int, _MAX_TIME_US
    for ev in events:  # one per allocation or free: checks inlined like _collect's
        ts = ev.ts
        tt = type(ts)
        if not ((tt is flt or tt is int_) and -max_us <= ts <= max_us):
            _check_time(path, ev, _required(ts, "ts"), 0)
        args = ev.args
        if not isinstance(args, (MemoryArgs, ShapedMemoryArgs)):
            raise TraceReadError(path, f"{MEMORY_EVENT} event at ts {ts} has args {args!r}, not an object")
        amount, total, kind, index = args.bytes, args.total_allocated, args.device_type, args.device_id
        if type(amount) is not int_ or type(total) is not int_ or type(kind) is not int_ or type(index) is not int_:
            raise _not_an_integer(path, ts, args)
        device = names.get((kind, index))
        if device is None:
            name = DEVICE_TYPES.get(kind, f"device_type_{kind}")
            device = names[(kind, index)] = name if kind == 0 or index < 0 else f"{name}:{index}"
        ts_col.append(ts)
        tids.append(ev.tid)
        devices.append(device)
        amounts.append(amount)
        totals.append(total)
    if any(b < a for a, b in zip(ts_col, ts_col[1:])):  # Kineto writes them in time order; others may not
        order = sorted(range(len(ts_col)), key=ts_col.__getitem__)  # stable: ties keep their file order
        ts_col, tids, devices = _take(ts_col, order), _take(tids, order), _take(devices, order)
        amounts, totals = _take(amounts, order), _take(totals, order)
    by_tid: dict[Any, list[Event]] = {tid: [] for tid in set(tids) - {main_tid}}
    for ev in ops:
        group = by_tid.get(ev.tid)
        if group is not None:
            group.append(ev)
    spans = {tid: sorted(_spans(path, group)) for tid, group in by_tid.items()}
    if main_tid in tids:
        spans[main_tid] = sorted(main_cpu_ops)
    return MemoryEvents(ts=ts_col, tid=tids, device=devices, bytes=amounts, total_allocated=totals, ops=spans)


def _take(column: list[_T], order: list[int]) -> list[_T]:
    return [column[i] for i in order]


def _not_an_integer(path: Path, ts: float, args: MemoryArgs | ShapedMemoryArgs) -> TraceReadError:
    """The error naming the first of a ``[memory]`` event's integer keys that holds something else."""
    pairs = (
        ("Bytes", args.bytes),
        ("Total Allocated", args.total_allocated),
        ("Device Type", args.device_type),
        ("Device Id", args.device_id),
    )
    key, value = next((k, v) for k, v in pairs if type(v) is not int)  # a bool is not a byte count
    return TraceReadError(path, f"{MEMORY_EVENT} event at ts {ts} has {key} {value!r}, which is not an integer")


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
