"""Timestamps for phase boundaries that never block the step.

A clock hands out opaque *marks* and later turns pairs of marks into seconds. On CPU a mark is a
``time.perf_counter()`` float and reading it costs nothing. On GPU a mark is a CUDA event recorded on
the current stream: recording is asynchronous, so the step never waits for the device, and the events
are only read (``elapsed_time``, after one ``synchronize`` of the newest event) on logging steps.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

Mark = Any  # a float (CPU) or a torch.cuda.Event (GPU); only the clock that made it can read it


class Clock(Protocol):
    """Source of phase-boundary marks."""

    #: Whether a mark is so cheap that it may be taken on every gradient hook call (a plain number, which a recorder
    #: may drop without giving it back through :meth:`release`).
    cheap_marks: bool

    def mark(self) -> Mark:
        """Take a timestamp now (on GPU: in stream order)."""
        ...

    def elapsed(self, start: Mark, end: Mark) -> float:
        """Seconds from ``start`` to ``end``; only called after ``wait`` on a later mark."""
        ...

    def wait(self, mark: Mark) -> None:
        """Block until ``mark`` can be read (a no-op on CPU). Called on logging steps only."""
        ...

    def ready(self, mark: Mark) -> bool:
        """Whether ``mark`` can be read now without waiting."""
        ...

    def release(self, marks: list[Mark]) -> None:
        """Give read marks back for reuse."""
        ...


class CpuClock:
    """``time.perf_counter`` marks: the host timeline, which is the step timeline on CPU."""

    cheap_marks = True

    # Take a timestamp now: ``perf_counter`` itself, no Python frame around it (a mark is taken at every phase).
    mark = staticmethod(time.perf_counter)

    def elapsed(self, start: float, end: float) -> float:
        """Seconds between two marks."""
        return end - start

    def wait(self, mark: float) -> None:
        """Nothing to wait for on the host."""

    def ready(self, mark: float) -> bool:
        """A host timestamp is always readable."""
        return True

    def release(self, marks: list[Mark]) -> None:
        """Floats need no recycling."""


class CudaEventClock:
    """CUDA-event marks on the current stream, pooled so that steady-state steps allocate nothing.

    The current stream is asked for by its id (a C call) and its ``Stream`` object built only when the id changes:
    ``torch.cuda.current_stream()``, which ``Event.record()`` calls when given none, builds a new one per call.

    Args:
        device: The CUDA device whose current stream is timed.
        event_factory: Builds one timing event; tests pass a fake. Defaults to
            ``torch.cuda.Event(enable_timing=True)``.
        current_stream: Returns the current stream to record on; tests pass a fake. Defaults to the cached lookup
            above (with a fake ``event_factory``: None, recorded as ``event.record()``).
    """

    # Recording an event is a driver call of a few microseconds: fine per phase, too much per parameter.
    cheap_marks = False

    def __init__(self, device: Any = None, event_factory: Any = None, current_stream: Any = None) -> None:
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

            if current_stream is None:
                current_stream = _StreamCache(device)
        self._device = device
        self._factory = event_factory
        self._stream = current_stream
        self._pool: list[Any] = []

    def mark(self) -> Any:
        """Record an event on the current stream; returns at once."""
        event = self._pool.pop() if self._pool else self._factory()
        if self._stream is None:
            event.record()
        else:
            event.record(self._stream())
        return event

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds of device time between two recorded (and completed) events."""
        return float(start.elapsed_time(end)) / 1000.0

    def wait(self, mark: Any) -> None:
        """Block until ``mark`` and every earlier event on the stream have completed."""
        mark.synchronize()

    def ready(self, mark: Any) -> bool:
        """Whether the event has completed (``query``: no wait)."""
        return bool(mark.query())

    def release(self, marks: list[Any]) -> None:
        """Return events to the pool."""
        self._pool.extend(m for m in marks if m is not None)


class _StreamCache:
    """The current CUDA stream of a device, its ``Stream`` object rebuilt only when the stream changes."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self._index: int | None = getattr(device, "index", None)
        self._id: int | None = None
        self._stream: Any = None

    def __call__(self) -> Any:
        torch = self._torch
        if self._index is None:
            self._index = torch.cuda.current_device()
        sid, index, kind = torch._C._cuda_getCurrentStream(self._index)
        if sid != self._id:
            self._stream = torch.cuda.Stream(stream_id=sid, device_index=index, device_type=kind)
            self._id = sid
        return self._stream


def training_device(args: Any, params: list[Any]) -> Any:
    """The device the training computes on: the Trainer's CUDA device (``TrainingArguments.device``) when it has one,
    else the first parameter's device.

    Not the parameters' device alone: with CPU offload (FSDP1's ``CPUOffload(offload_params=True)``, FSDP2's
    ``CPUOffloadPolicy``) the sharded parameters the callbacks see live on the host while every kernel runs on the
    GPU, and a CPU clock there would time kernel launches, not the steps."""
    import torch

    try:
        device = args.device
    except Exception:  # noqa: BLE001 - arguments without a device (a test's, a user's own object): the parameters'
        device = None
    if isinstance(device, torch.device) and device.type == "cuda":
        return device
    return params[0].device if params else torch.device("cpu")


def default_clock(device: Any) -> Clock:
    """The clock for ``device``: CUDA events on a CUDA device, ``perf_counter`` otherwise."""
    if getattr(device, "type", str(device)) == "cuda":
        return CudaEventClock(device)
    return CpuClock()
