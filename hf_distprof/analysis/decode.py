"""The msgspec schema of trace events, and the decoder of one chunk of them.

Events are decoded into :class:`Event` structs that declare only the keys the analysis reads; msgspec skips
every other key (``args`` of CPU ops, flow ids ...) without building a Python object. With
``record_shapes`` every op also carries ``Input Dims`` / ``Input type``: :class:`ShapedEvent` keeps them
undecoded, for the few collective events that size a collective (:mod:`hf_distprof.analysis.message_sizes`),
at ~25% more parse time, so it is used only when those sizes are wanted.
"""

from __future__ import annotations

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


# Events that are not objects decode to plain values, so that the reader's "not a trace" check names them.
decode_events = msgspec.json.Decoder(list[Event | list[Any] | str | int | float | bool | None]).decode
decode_shaped_events = msgspec.json.Decoder(
    list[ShapedEvent | list[Any] | str | int | float | bool | None]
).decode


class ChunkDecoder:
    """Decodes one chunk of events, with or without the recorded shapes; keeps collective events' shapes.

    A ``msgspec.Raw`` refers to the buffer it was decoded from, which the reader reuses for the next chunk
    (and cannot while a view of it is held). So before a chunk is handed on, the shapes of the
    ``nccl:*`` / ``gloo:*`` / ``c10d::*`` events are copied and every other event's are dropped. Whether a
    chunk holds any shape at all is known without looking at its events: releasing the view that was
    decoded fails exactly when a ``Raw`` still refers to it.
    """

    def __init__(self, shapes: bool) -> None:
        self.event_type: type[Event] = ShapedEvent if shapes else Event
        self.args_type: type[Args] = ShapedArgs if shapes else Args
        self.sized: list[ShapedEvent] = []  # nccl:*, gloo:*, c10d::* events with shapes, any thread

    def __call__(self, data: bytes | bytearray | memoryview) -> list[Any]:
        if self.event_type is Event:
            return decode_events(data)
        view = memoryview(data)
        try:
            events = decode_shaped_events(view)
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
            if type(ev) is not ShapedEvent:
                continue
            args = ev.args
            if type(args) is not ShapedArgs or (args.dims is no_raw and args.types is no_raw):
                continue
            name = ev.name
            if type(name) is str and name.startswith(SIZED_PREFIXES):
                args.dims = args.dims.copy()
                args.types = args.types.copy()
                keep(ev)
            else:
                args.dims = args.types = no_raw
