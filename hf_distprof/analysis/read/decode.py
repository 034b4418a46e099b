"""The msgspec schema of trace events, and the decoder of one chunk of them.

Events are decoded into :class:`Event` structs that declare only the keys the analysis reads; msgspec skips
every other key (``args`` of CPU ops, flow ids ...) without building a Python object. With
``record_shapes`` every op also carries ``Input Dims`` / ``Input type``: :class:`ShapedEvent` keeps them
undecoded, for the few collective events that size a collective (:mod:`hf_distprof.analysis.read.message_sizes`),
at ~25% more parse time, so it is used only when those sizes are wanted. Likewise the keys of ``[memory]``
events (``profile_memory``) are declared only on the types used for a trace whose header says it holds them
(:class:`MemoryArgs`), so that other traces' decoding does not look for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

# Events whose recorded input shapes can size a collective.
SIZED_PREFIXES = ("nccl:", "gloo:", "c10d::")


class Args(msgspec.Struct, gc=False):
    """The keys of an event's ``args`` that are read; None when absent, like ``dict.get``.

    Besides the GPU stream and launch correlation: a collective's size as ``record_param_comms`` states it
    (element counts, c10::ScalarType name, group size), present on those few events only.
    """

    stream: Any = None
    correlation: Any = None
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")


# An absent shape key: a shared default, recognised by identity.
_NO_RAW = msgspec.Raw()


class ShapedArgs(Args, gc=False):
    """:class:`Args` and the inputs' shapes and types, which ``record_shapes`` writes on every op, left
    undecoded (see :class:`ChunkDecoder`)."""

    dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


class MemoryArgs(Args, gc=False):
    """:class:`Args` and the keys of a ``[memory]`` event: bytes allocated (> 0) or freed (< 0), the device's
    allocated total after it, and the device."""

    bytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class ShapedMemoryArgs(ShapedArgs, gc=False):
    """:class:`ShapedArgs` and :class:`MemoryArgs`' keys (msgspec structs cannot inherit fields from both)."""

    bytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    """The keys of a trace event that are read. ``name`` and ``ts`` are ``UNSET`` when absent, so that
    an event without them fails like ``event["name"]`` would (as a malformed event), never silently."""

    cat: Any = None
    name: Any = msgspec.UNSET
    tid: Any = None
    ts: Any = msgspec.UNSET
    dur: Any = None
    # Any JSON value may stand here; only an object is read (the old ``isinstance(args, dict)``).
    args: Args | list[Any] | str | int | float | bool | None = None


class ShapedEvent(Event, gc=False):
    """:class:`Event` with the recorded shapes in its ``args``."""

    args: ShapedArgs | list[Any] | str | int | float | bool | None = None


class MemoryEvent(Event, gc=False):
    """:class:`Event` with the keys of ``[memory]`` events in its ``args``."""

    args: MemoryArgs | list[Any] | str | int | float | bool | None = None


class ShapedMemoryEvent(ShapedEvent, gc=False):
    """:class:`ShapedEvent` with the keys of ``[memory]`` events in its ``args``."""

    args: ShapedMemoryArgs | list[Any] | str | int | float | bool | None = None


# Parses the bytes of a JSON array of events into a list.
_Decode = Callable[[bytes | bytearray | memoryview], list[Any]]


def _decoder(event_type: type[Event]) -> _Decode:
    # Events that are not objects decode to plain values, so that the reader's "not a trace" check names them.
    schema = list[event_type | list[Any] | str | int | float | bool | None]  # type: ignore[valid-type]
    decode = msgspec.json.Decoder(schema).decode

    def decode_bounded(data: bytes | bytearray | memoryview) -> list[Any]:
        try:
            return decode(data)
        except RecursionError:
            # Nesting deeper than the interpreter allows: invalid for a trace, reported like other bad JSON.
            raise ValueError("JSON nested too deeply") from None

    return decode_bounded


# (shapes, memory) -> the event type, its args type, and the decoder of a chunk of such events.
_SCHEMAS: dict[tuple[bool, bool], tuple[type[Event], type[Args], _Decode]] = {
    (False, False): (Event, Args, _decoder(Event)),
    (True, False): (ShapedEvent, ShapedArgs, _decoder(ShapedEvent)),
    (False, True): (MemoryEvent, MemoryArgs, _decoder(MemoryEvent)),
    (True, True): (ShapedMemoryEvent, ShapedMemoryArgs, _decoder(ShapedMemoryEvent)),
}


class ChunkDecoder:
    """Decodes one chunk of events, with or without the recorded shapes and the keys of ``[memory]`` events;
    keeps collective events' shapes.

    A ``msgspec.Raw`` refers to the buffer it was decoded from, which the reader reuses for the next chunk
    (and cannot while a view of it is held). So before a chunk is handed on, the shapes of the
    ``nccl:*`` / ``gloo:*`` / ``c10d::*`` events are copied and every other event's are dropped. Whether a
    chunk holds any shape at all is known without looking at its events: releasing the view that was
    decoded fails exactly when a ``Raw`` still refers to it.

    Args:
        shapes: Decode the recorded input shapes.
        memory: Decode the keys of ``[memory]`` events (:class:`MemoryArgs`).
    """

    def __init__(self, shapes: bool, memory: bool = False) -> None:
        self.shapes = shapes
        self.memory = memory
        self.event_type, self.args_type, self._decode = _SCHEMAS[(shapes, memory)]
        self.sized: list[ShapedEvent] = []  # nccl:*, gloo:*, c10d::* events with shapes, any thread

    def __call__(self, data: bytes | bytearray | memoryview) -> list[Any]:
        if not self.shapes:
            return self._decode(data)
        view = memoryview(data)
        try:
            events = self._decode(view)
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
            if not isinstance(ev, ShapedEvent):
                continue
            args = ev.args
            if not isinstance(args, ShapedArgs) or (args.dims is no_raw and args.types is no_raw):
                continue
            name = ev.name
            if type(name) is str and name.startswith(SIZED_PREFIXES):
                args.dims = args.dims.copy()
                args.types = args.types.copy()
                keep(ev)
            else:
                args.dims = args.types = no_raw
