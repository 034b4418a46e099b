"""Parsing: one trace file -> the few compact event lists the analyzers need.

Only complete events (``ph == "X"``) that some analyzer reads are kept, as tuples of plain numbers and
interned names: profiler steps, CPU ops and annotations per thread, ``gloo:*`` collective spans, GPU
kernels/memcpy/memset, and the correlation id -> timestamp of each CUDA launch. A 50 MB trace becomes a
few MB of tuples.

The events are decoded by msgspec into :class:`_Event` structs that declare only the fields read here
(``cat``, ``name``, ``tid``, ``ts``, ``dur``, ``args.stream``, ``args.correlation`` and the few keys that
give a collective's message size): every other key, and most of the bytes of a trace (``args`` of CPU
ops, flow events' ids ...), is skipped by the decoder without building a Python object, which makes
parsing several times faster than a generic ``orjson.loads``. Fields are typed ``Any`` and non-object
events or ``args`` are allowed, so a decoded event carries exactly the values ``orjson`` would give and
malformed traces fail the same way.

Message sizes (:class:`MessageSize`) come from ``record_param_comms`` ops, whose ``args`` name the element
counts, dtype and group size in newer PyTorch builds with NCCL, and, when the profiler recorded shapes, from the
``Input Dims`` / ``Input type`` of ``nccl:*`` and ``gloo:*`` annotations and ``c10d::*`` ops. Every op
carries shapes in such a trace, so they are kept undecoded (``msgspec.Raw``) and only the collectives'
are read; a trace without shapes pays nothing for them.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

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
# Events whose recorded input shapes can size a collective.
_SIZED_PREFIXES = ("nccl:", "gloo:", "c10d::")
# Bytes per element, by the names traces give dtypes: c10::ScalarType names in ``record_param_comms``'s
# "dtype", C++ type names in "Input type" (as torch 2.13 writes them).
_DTYPE_NAMES = {
    1: ("Bool", "Byte", "Char", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz")
    + ("bool", "unsigned char", "signed char", "c10::Float8_e4m3fn", "c10::Float8_e5m2")
    + ("c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"),
    2: ("Half", "BFloat16", "Short", "UInt16", "c10::Half", "c10::BFloat16", "short int", "short unsigned int"),
    4: ("Float", "Int", "UInt32", "ComplexHalf", "float", "int", "unsigned int", "c10::complex<c10::Half>"),
    8: ("Double", "Long", "UInt64", "ComplexFloat", "double", "long int", "long unsigned int", "c10::complex<float>"),
    16: ("ComplexDouble", "c10::complex<double>"),
}
DTYPE_BYTES = {name: width for width, names in _DTYPE_NAMES.items() for name in names}


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


@dataclass(frozen=True)
class MessageSize:
    """What one CPU event says about the size of the collective it issues or runs.

    ``record_param_comms`` gives both sides; an annotation or op with recorded shapes gives its input
    tensors (``c10d::*`` ops with an (output, input) pair of tensors, such as ``_allgather_base_``, both).
    Which side is *the* size of a collective depends on its kind (see
    :func:`hf_distprof.analysis.bandwidth.message_bytes`).
    """

    in_bytes: int | None
    out_bytes: int | None
    group_size: int | None = None


# An absent shape key: a shared default, recognised by identity.
_NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct, gc=False):
    """The keys of an event's ``args`` that are read; None (``_NO_RAW``) when absent, like ``dict.get``.

    Besides the GPU stream and launch correlation: a collective's size, as ``record_param_comms`` states it
    (element counts, c10::ScalarType name, group size), and the inputs' shapes and types that the profiler
    writes on every op with ``record_shapes``, left undecoded (see :class:`_ChunkDecoder`).
    """

    stream: Any = None
    correlation: Any = None
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


class _Event(msgspec.Struct, gc=False):
    """The keys of a trace event that are read. ``name`` and ``ts`` are ``UNSET`` when absent, so that
    an event without them fails like ``event["name"]`` would (as a malformed event), never silently."""

    cat: Any = None
    name: Any = msgspec.UNSET
    tid: Any = None
    ts: Any = msgspec.UNSET
    dur: Any = None
    # Any JSON value may stand here; only an object is read (the old ``isinstance(args, dict)``).
    args: _Args | list[Any] | str | int | float | bool | None = None


# Events that are not objects decode to plain values so that the "not a trace" check below names them.
_decode_events = msgspec.json.Decoder(list[_Event | list[Any] | str | int | float | bool | None]).decode


class _ChunkDecoder:
    """Decodes one chunk of events; keeps the recorded shapes of collective events only.

    A ``msgspec.Raw`` refers to the buffer it was decoded from, which the reader reuses for the next chunk
    (and cannot while a view of it is held). So before a chunk is handed on, the shapes of the
    ``nccl:*`` / ``gloo:*`` / ``c10d::*`` events are copied and every other event's are dropped. Whether a
    chunk holds any shape at all is known without looking at its events: releasing the view that was
    decoded fails exactly when a ``Raw`` still refers to it.
    """

    def __init__(self) -> None:
        self.sized: list[_Event] = []  # nccl:*, gloo:*, c10d::* events with shapes, any thread

    def __call__(self, data: bytes | bytearray | memoryview) -> list[Any]:
        view = memoryview(data)
        try:
            events = _decode_events(view)
            try:
                view.release()
                return events
            except BufferError:
                pass
            self._keep_collective_shapes(events)
            return events
        finally:
            view.release()

    def _keep_collective_shapes(self, events: list[Any]) -> None:
        no_raw = _NO_RAW
        keep = self.sized.append
        for ev in events:
            if type(ev) is not _Event:
                continue
            args = ev.args
            if type(args) is not _Args or (args.dims is no_raw and args.types is no_raw):
                continue
            name = ev.name
            if type(name) is str and name.startswith(_SIZED_PREFIXES):
                args.dims = args.dims.copy()
                args.types = args.types.copy()
                keep(ev)
            else:
                args.dims = args.types = no_raw


@dataclass
class _Collected:
    """Events gathered in one pass over the file, before the main thread is known."""

    ops: list[_Event] = field(default_factory=list)  # cpu_op events, any thread
    annotations: list[_Event] = field(default_factory=list)  # user_annotation events, any thread
    gpu: GpuEvent = field(default_factory=GpuEvent)
    launches: dict[int, float] = field(default_factory=dict)
    n_events: int = 0


def _collect(path: Path, meta: dict[str, Any], decode: _ChunkDecoder) -> _Collected:
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
                    if type(args) is _Args:
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
                    if dur is None or type(args) is not _Args:
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
            bad = next((ev for ev in chunk if type(ev) is not _Event), None)
            if bad is None:
                raise
            raise TraceReadError(path, f"not a trace: traceEvents holds a {type(bad).__name__}") from None
    return out


def _spans(path: Path, events: list[_Event]) -> list[Span]:
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


def _check_time(path: Path, ev: _Event, ts: Any, dur: Any) -> None:
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


def parse_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Read one trace file into a :class:`ParsedTrace`.

    Args:
        path: A Kineto trace (``.json`` or ``.json.gz``).

    Returns:
        The compact events of that trace.

    Raises:
        TraceReadError: The file cannot be read or parsed, has no rank, has no ``ProfilerStep#N``, or an event
            that the analysis reads has a ``ts`` or ``dur`` that is not a time (a bool, negative duration,
            inf, nan, beyond 1e18 us).
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    decode = _ChunkDecoder()
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
    sized = [ev for ev in got.ops if ev.name == RECORD_PARAM_COMMS]
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


def _message_sizes(path: Path, events: list[_Event]) -> dict[Span, MessageSize]:
    """The size each of ``events`` records, keyed by its span; events that record none are left out."""
    out: dict[Span, MessageSize] = {}
    for ev in events:
        args = ev.args
        if type(args) is not _Args or ev.dur is None:
            continue
        if ev.name == RECORD_PARAM_COMMS:
            width = DTYPE_BYTES.get(args.dtype) if isinstance(args.dtype, str) else None
            n_in, n_out = _as_int(args.in_nelems), _as_int(args.out_nelems)
            if width is None or (n_in is None and n_out is None):
                continue
            size = MessageSize(
                None if n_in is None else n_in * width,
                None if n_out is None else n_out * width,
                _as_int(args.group_size),
            )
        else:
            tensors = _tensor_bytes(args)
            if not tensors:
                continue
            if ev.name.startswith("c10d::"):
                # (output, input) when the first two arguments are tensors (_allgather_base_ ...); an op on
                # tensor lists records no dtype.
                if len(tensors) < 2 or tensors[0] is None or tensors[1] is None:
                    continue
                size = MessageSize(tensors[1], tensors[0])
            else:
                # nccl:* and gloo:* annotations record the collective's input tensors.
                if any(t is None for t in tensors):
                    continue
                size = MessageSize(sum(t or 0 for t in tensors), None)
        _check_time(path, ev, ev.ts, ev.dur)
        out[(ev.ts, ev.ts + ev.dur, sys.intern(ev.name))] = size
    return out


def _tensor_bytes(args: _Args) -> list[int | None]:
    """Bytes of each leading tensor argument, from the recorded shapes; None for a tensor (list) of
    unknown dtype, such as the ``TensorList`` of ``c10d::allreduce_``.

    The list stops at the first argument that is not a tensor. Empty when the shapes are absent or
    malformed: they size a table, so a shape that cannot be read leaves that collective without a size.
    """
    try:
        dims = msgspec.json.decode(args.dims) if args.dims else None
        types = msgspec.json.decode(args.types) if args.types else None
    except msgspec.DecodeError:
        return []
    if not isinstance(dims, list) or not isinstance(types, list):
        return []
    out: list[int | None] = []
    for shape, dtype in zip(dims, types):
        flat = isinstance(shape, list) and all(type(d) is int for d in shape)
        width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if width is not None and flat:
            out.append(math.prod(shape) * width)  # a 0-d tensor has shape [] and one element
        elif dtype == "TensorList" or (flat and shape):
            out.append(None)
        else:
            break
    return out


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
