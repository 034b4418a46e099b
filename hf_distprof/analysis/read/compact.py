"""Compact summaries of traces: the parsed events the analyzers read, in a small columnar file beside each trace.

Parsing a trace's JSON is nearly all of the cost of analysing it. What the analyzers read from it
(:class:`~hf_distprof.analysis.read.events.ParsedTrace`: steps, main-thread ops, collective spans, GPU activity,
launches, message sizes, ``[memory]`` events) is a few percent of its bytes, so it is written once, as
columns, next to the trace (``<trace file name>.compact.msgpack``), and re-analysing a run reads that instead.

Format: one msgpack map (``msgspec``; no pickle, nothing executable), ``format`` and ``version`` first. Every
event list is stored as columns (one list of numbers per field, names as indices into one string table), so
loading builds no per-event object but the tuples the analyzers take. msgpack keeps ints and floats apart,
so every number comes back with the type it had in the JSON and the analysis is exactly the same.

A compact file is used only for the trace it was made from: it records the trace's size and a hash of its
first and last 64 KiB. A missing one is silently skipped; a stale, foreign, corrupt or unreadable one, or one
of another format version, is one log line naming it, and the trace's JSON is read instead.

Recorded shapes are always read when a compact file is built (``parse_trace(shapes=True)``); the sizes they
give are dropped on load when the analysis would not have read them, so the result does not depend on
whether it came from the JSON or from the compact file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Union

import msgspec

from hf_distprof.analysis.read.events import (
    RECORD_PARAM_COMMS,
    GpuEvent,
    MemoryEvents,
    ParsedTrace,
    Span,
    Step,
    default_shapes,
    parse_trace,
)
from hf_distprof.analysis.read.message_sizes import MessageSize
from hf_distprof.analysis.results.rank import StepAfterPause
from hf_distprof.core.files import atomic_path
from hf_distprof.core.names import COMPACT_SUFFIX

logger = logging.getLogger(__name__)

FORMAT = "hf_distprof.compact"
VERSION = 4
# Bytes hashed at each end of the trace to tie a compact file to it (a trace's head holds its start time and
# host, its tail its last events: two traces that agree on both and on their size are the same trace).
_IDENTITY_BYTES = 1 << 16

Number = Union[int, float]  # noqa: UP007 - msgspec reads the annotation at runtime, also on Python 3.10
# A thread id or a correlation id: whatever JSON value the trace holds (ints in Kineto traces).
Key = Union[int, float, str, bool, None]  # noqa: UP007


class CompactError(ValueError):
    """A compact file that cannot be used; the message says why."""


class OlderCompactError(CompactError):
    """A compact file an older hf_distprof wrote (an earlier format version): replaced when the trace is read."""


class _Spans(msgspec.Struct, array_like=True):
    start: list[Number]
    end: list[Number]
    name: list[int]


class _Gpu(msgspec.Struct, array_like=True):
    start: list[Number]
    end: list[Number]
    name: list[int]
    stream: list[int]
    correlation: list[int]


class _Sizes(msgspec.Struct, array_like=True):
    start: list[Number]
    end: list[Number]
    name: list[int]
    in_bytes: list[Union[int, None]]  # noqa: UP007
    out_bytes: list[Union[int, None]]  # noqa: UP007
    group_size: list[Union[int, None]]  # noqa: UP007


class _Memory(msgspec.Struct, array_like=True):
    ts: list[Number]
    tid: list[Key]
    device: list[int]
    bytes: list[int]
    total_allocated: list[int]
    op_tids: list[Key]
    ops: list[_Spans]


class _File(msgspec.Struct):
    format: str
    version: int
    trace_size: int
    trace_digest: str
    shapes_by_default: bool  # what parse_trace(shapes=None) reads on this trace
    rank: int
    world_size: Union[int, None]  # noqa: UP007
    backend: Union[str, None]  # noqa: UP007
    host: Union[str, None]  # noqa: UP007
    base_time_ns: int
    n_events: int
    main_tid: Key
    strings: list[str]
    steps: tuple[list[int], list[Number], list[Number]]
    main_ops: _Spans
    c10d_ops: _Spans  # the c10d::* ops of main_ops: stored, as filtering main_ops by name costs more than reading
    comm_spans: _Spans
    nccl_ops: _Spans
    fsdp_spans: _Spans
    gpu: _Gpu
    launch_ids: list[Key]
    launch_ts: list[Number]
    sizes: _Sizes
    after_pause: tuple[list[int], list[Number], list[Number], list[bool], list[str]]  # read.pauses' StepAfterPause
    memory: Union[_Memory, None] = None  # noqa: UP007


class _Head(msgspec.Struct):
    """The first keys alone, to name the format and version of a file the full schema rejects."""

    format: Any = None
    version: Any = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_File)
_HEAD_DECODER = msgspec.msgpack.Decoder(_Head)


def compact_path(trace: str | os.PathLike[str]) -> Path:
    """The compact file of ``trace``: beside it, its name plus :data:`~hf_distprof.core.names.COMPACT_SUFFIX`."""
    trace = Path(trace)
    return trace.with_name(trace.name + COMPACT_SUFFIX)


def trace_identity(trace: str | os.PathLike[str]) -> tuple[int, str]:
    """The trace's size and a hash of its first and last 64 KiB (a copy of the trace keeps both).

    Raises:
        OSError: The trace cannot be read.
    """
    with open(trace, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest = hashlib.blake2b(fh.read(_IDENTITY_BYTES), digest_size=16)
        fh.seek(max(0, size - _IDENTITY_BYTES))
        digest.update(fh.read(_IDENTITY_BYTES))
    return size, digest.hexdigest()


class _Strings:
    """The string table: each distinct name once, events refer to it by index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def ids(self, names: list[str]) -> list[int]:
        index = self.index
        return [index.setdefault(name, len(index)) for name in names]


def _spans_out(spans: list[Span], strings: _Strings) -> _Spans:
    return _Spans([s[0] for s in spans], [s[1] for s in spans], strings.ids([s[2] for s in spans]))


def _spans_in(cols: _Spans, table: list[str]) -> list[Span]:
    if not len(cols.start) == len(cols.end) == len(cols.name):
        raise CompactError("span columns of different lengths")
    return list(zip(cols.start, cols.end, map(table.__getitem__, cols.name)))


def encode(trace: ParsedTrace, identity: tuple[int, str], shapes_by_default: bool) -> bytes:
    """The compact file's bytes for a trace parsed with ``shapes=True``.

    Args:
        trace: The parsed trace.
        identity: :func:`trace_identity` of its file.
        shapes_by_default: Whether ``parse_trace(shapes=None)`` reads recorded shapes on this trace.

    Raises:
        OverflowError: A number does not fit msgpack's 64 bits (a stream id from a string, say).
        TypeError: A value that no trace holds.
    """
    strings = _Strings()
    gpu = trace.gpu
    sizes = list(trace.message_sizes.items())
    memory = None
    if trace.memory is not None:
        mem = trace.memory
        memory = _Memory(
            ts=mem.ts,
            tid=mem.tid,
            device=strings.ids(mem.device),
            bytes=mem.bytes,
            total_allocated=mem.total_allocated,
            op_tids=list(mem.ops),
            ops=[_spans_out(spans, strings) for spans in mem.ops.values()],
        )
    out = _File(
        format=FORMAT,
        version=VERSION,
        trace_size=identity[0],
        trace_digest=identity[1],
        shapes_by_default=shapes_by_default,
        rank=trace.rank,
        world_size=trace.world_size,
        backend=trace.backend,
        host=trace.host,
        base_time_ns=trace.base_time_ns,
        n_events=trace.n_events,
        main_tid=trace.main_tid,
        strings=[],
        steps=([s.number for s in trace.steps], [s.start for s in trace.steps], [s.end for s in trace.steps]),
        main_ops=_spans_out(trace.main_ops, strings),
        c10d_ops=_spans_out(trace.c10d_ops, strings),
        comm_spans=_spans_out(trace.comm_spans, strings),
        nccl_ops=_spans_out(trace.nccl_ops, strings),
        fsdp_spans=_spans_out(trace.fsdp_spans, strings),
        gpu=_Gpu(gpu.start, gpu.end, strings.ids(gpu.name), gpu.stream, gpu.correlation),
        launch_ids=list(trace.launches),
        launch_ts=list(trace.launches.values()),
        sizes=_Sizes(
            [span[0] for span, _ in sizes],
            [span[1] for span, _ in sizes],
            strings.ids([span[2] for span, _ in sizes]),
            [size.in_bytes for _, size in sizes],
            [size.out_bytes for _, size in sizes],
            [size.group_size for _, size in sizes],
        ),
        memory=memory,
        after_pause=([p.step for p in trace.steps_after_pause], [p.pause_us for p in trace.steps_after_pause],
                     [p.rest_us for p in trace.steps_after_pause], [p.kept for p in trace.steps_after_pause],
                     [p.what for p in trace.steps_after_pause]),
    )
    out.strings = list(strings.index)
    return _ENCODER.encode(out)


def decode(
    data: bytes, trace: str | os.PathLike[str], shapes: bool | None, identity: tuple[int, str] | None = None
) -> ParsedTrace:
    """The :class:`ParsedTrace` that ``parse_trace(trace, shapes)`` gives, from a compact file's bytes.

    Args:
        data: The compact file's bytes.
        trace: The trace it stands for (the parsed trace's ``path``).
        shapes: As for :func:`~hf_distprof.analysis.read.events.parse_trace`.
        identity: :func:`trace_identity` of ``trace``, checked against the one recorded; None: not checked.

    Raises:
        CompactError: The bytes are not a compact file of this version, are inconsistent, or were made from
            another trace than ``identity``'s.
    """
    try:
        f = _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        try:
            head = _HEAD_DECODER.decode(data)
        except (msgspec.DecodeError, RecursionError):
            head = None
        if head is not None and (head.format != FORMAT or head.version != VERSION):
            older = head.format == FORMAT and isinstance(head.version, int) and head.version < VERSION
            raise (OlderCompactError if older else CompactError)(
                f"format {head.format!r} version {head.version!r}, not {FORMAT!r} version {VERSION}"
            ) from None
        raise CompactError(f"corrupt ({exc})") from None
    if f.format != FORMAT or f.version != VERSION:
        raise (OlderCompactError if f.format == FORMAT and f.version < VERSION else CompactError)(
            f"format {f.format!r} version {f.version!r}, not {FORMAT!r} version {VERSION}")
    if identity is not None and (f.trace_size, f.trace_digest) != identity:
        raise CompactError("made from another trace, or from this one before it changed")
    try:
        return _parsed(f, str(Path(trace)), f.shapes_by_default if shapes is None else shapes)
    except (IndexError, ValueError) as exc:  # an index beyond the string table, columns of unequal lengths
        raise CompactError(f"corrupt ({exc})") from None


def _parsed(f: _File, path: str, shapes: bool) -> ParsedTrace:
    table = [sys.intern(s) for s in f.strings]
    numbers, starts, ends = f.steps
    steps = [Step(n, s, e) for n, s, e in zip(numbers, starts, ends, strict=True)]
    main_ops = _spans_in(f.main_ops, table)
    g = f.gpu
    if not len(g.start) == len(g.end) == len(g.name) == len(g.stream) == len(g.correlation):
        raise CompactError("GPU columns of different lengths")
    gpu = GpuEvent(g.start, g.end, list(map(table.__getitem__, g.name)), g.stream, g.correlation)
    s = f.sizes
    keys = zip(s.start, s.end, map(table.__getitem__, s.name), strict=True)
    values = zip(s.in_bytes, s.out_bytes, s.group_size, strict=True)
    # Sizes from recorded shapes are on nccl:*, gloo:* and c10d::* spans, never on record_param_comms.
    message_sizes = {
        key: MessageSize(*value) for key, value in zip(keys, values) if shapes or key[2] == RECORD_PARAM_COMMS
    }
    # Correlation ids are whatever the trace holds (ints in Kineto's), as parse_trace keeps them.
    launches: dict[Any, Any] = dict(zip(f.launch_ids, f.launch_ts, strict=True))
    memory = None
    if f.memory is not None:
        m = f.memory
        memory = MemoryEvents(
            ts=m.ts,
            tid=m.tid,
            device=list(map(table.__getitem__, m.device)),
            bytes=m.bytes,
            total_allocated=m.total_allocated,
            ops={tid: _spans_in(spans, table) for tid, spans in zip(m.op_tids, m.ops, strict=True)},
        )
        if not len(m.ts) == len(m.tid) == len(m.device) == len(m.bytes) == len(m.total_allocated):
            raise CompactError("memory columns of different lengths")
    return ParsedTrace(
        path=path,
        rank=f.rank,
        world_size=f.world_size,
        backend=f.backend,
        host=f.host,
        base_time_ns=f.base_time_ns,
        steps=steps,
        main_tid=f.main_tid,
        main_ops=main_ops,
        comm_spans=_spans_in(f.comm_spans, table),
        c10d_ops=_spans_in(f.c10d_ops, table),
        nccl_ops=_spans_in(f.nccl_ops, table),
        fsdp_spans=_spans_in(f.fsdp_spans, table),
        gpu=gpu,
        launches=launches,
        n_events=f.n_events,
        message_sizes=message_sizes,
        memory=memory,
        main_op_columns=(f.main_ops.start, f.main_ops.end, f.main_ops.name, table),
        steps_after_pause=[StepAfterPause(*p) for p in zip(*f.after_pause, strict=True)],
    )


def restrict_sizes(trace: ParsedTrace, shapes: bool | None) -> ParsedTrace:
    """``trace`` (parsed with ``shapes=True``) as ``parse_trace(shapes=shapes)`` gives it: without the sizes
    read from recorded shapes when those would not have been read."""
    if shapes is None:
        shapes = default_shapes(trace.path)
    if not shapes:
        trace.message_sizes = {k: v for k, v in trace.message_sizes.items() if k[2] == RECORD_PARAM_COMMS}
    return trace


def write_compact(trace: str | os.PathLike[str], parsed: ParsedTrace | None = None) -> Path:
    """Write the compact file of ``trace`` beside it, atomically.

    Args:
        trace: The trace file.
        parsed: ``parse_trace(trace, shapes=True)``, when the caller has it; parsed here otherwise.

    Returns:
        The compact file.

    Raises:
        TraceReadError: The trace cannot be parsed.
        OSError: The file cannot be written.
        OverflowError, TypeError: A value the format cannot hold (the trace still analyses from its JSON).
    """

    trace = Path(trace)
    identity = trace_identity(trace)
    if parsed is None:
        parsed = parse_trace(trace, shapes=True)
    data = encode(parsed, identity, default_shapes(trace))
    out = compact_path(trace)
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
    return out


def load_compact(trace: str | os.PathLike[str], shapes: bool | None = None) -> ParsedTrace | None:
    """The parsed trace from ``trace``'s compact file, or None to read the JSON instead.

    None without a compact file (silently; also for a hidden trace, a temporary file being written), and for
    one that cannot be used: stale (the trace changed since), foreign, corrupt, unreadable or of another format
    version, which is said in one log line naming the file (an older hf_distprof's: at INFO, as
    :func:`load_trace` replaces it).

    Args:
        trace: The trace file.
        shapes: As for :func:`~hf_distprof.analysis.read.events.parse_trace`.
    """
    return _load_compact(trace, shapes)[0]


def _load_compact(trace: str | os.PathLike[str], shapes: bool | None) -> tuple[ParsedTrace | None, bool]:
    """:func:`load_compact`, and whether the file there is an older hf_distprof's."""
    trace = Path(trace)
    compact = compact_path(trace)
    if trace.name.startswith(".") or not compact.is_file():
        return None, False
    try:
        return decode(compact.read_bytes(), trace, shapes, trace_identity(trace)), False
    except OlderCompactError as exc:
        logger.info(f"hf_distprof: compact file {compact} is an older hf_distprof's ({exc}): reading the trace's "
                    "JSON, and writing it anew")
        return None, True
    except (OSError, CompactError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        logger.warning(f"hf_distprof: not using compact file {compact}: {reason}; reading the trace's JSON instead")
        return None, False


def load_trace(
    trace: str | os.PathLike[str], shapes: bool | None = None, read: bool = True, write: bool = False
) -> ParsedTrace:
    """``parse_trace(trace, shapes)``, from the trace's compact file when there is a usable one.

    Args:
        trace: The trace file.
        shapes: As for :func:`~hf_distprof.analysis.read.events.parse_trace`.
        read: Use the compact file when there is a usable one.
        write: Without a usable compact file (or with ``read=False``), write one from the JSON; a failed write
            is one log line and the analysis goes on. An older hf_distprof's compact file is replaced without it
            (quietly when that cannot be done: a read-only folder), so that an upgrade does not read the JSON for
            ever after.

    Raises:
        TraceReadError: The trace cannot be parsed.
    """
    older = False
    if read:
        parsed, older = _load_compact(trace, shapes)
        if parsed is not None:
            return parsed
    if not write and not older:
        return parse_trace(trace, shapes=shapes)
    parsed = parse_trace(trace, shapes=True)
    try:
        write_compact(trace, parsed)
    except (OSError, OverflowError, TypeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        (logger.warning if write else logger.info)(
            f"hf_distprof: could not write compact file {compact_path(trace)}: {reason}")
    return restrict_sizes(parsed, shapes)
