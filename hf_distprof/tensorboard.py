"""One TensorBoard writer per log folder, shared by the callbacks of a process (rank 0 only).

The writer is :class:`EventWriter`, not ``torch.utils.tensorboard.SummaryWriter``: it writes each event in the calling
thread, in one ``write`` to its file, where ``SummaryWriter`` hands it to a thread of its own that frames it and
checksums it in Python (tensorboard's CRC-32C without TensorFlow is a loop over every byte). That thread's 0.1-0.2 ms
of Python per event was paid by the training thread, waiting for the interpreter lock at its next release of it (a
tensor freed, a system call), at the step after each logging step; here an event of 20 scalars costs tens of
microseconds, once.
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_distprof import dist

_WRITERS: dict[Path, EventWriter] = {}
_FAILED: set[Path] = set()  # folders whose writer could not be created: warned once, not retried

logger = dist.get_logger(__name__)


def tensorboard_dir(output_dir: str | None, run_dir: Path | None) -> Path:
    """Where our scalars go: the Trainer's TensorBoard folder when it is fixed by ``TENSORBOARD_LOGGING_DIR``.

    Without that variable transformers picks ``<output_dir>/runs/<date>_<host>`` itself at train start,
    a name we cannot know for sure, so ours go beside it as ``<output_dir>/runs/hf_distprof_<run>``:
    ``tensorboard --logdir <output_dir>/runs`` shows both. ``train_modernBERT.py`` sets the variable, so
    there loss and memory share one run.

    Args:
        output_dir: ``TrainingArguments.output_dir``.
        run_dir: This run's profiler folder (its name names the TensorBoard run); None when it could not
            be created.
    """
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if env:
        return Path(env).expanduser()
    name = run_dir.name if run_dir is not None else "run"
    return Path(output_dir or ".") / "runs" / f"hf_distprof_{name}"


def get_writer(log_dir: Path) -> EventWriter | None:
    """The shared writer for ``log_dir`` on rank 0; None on every other rank (only rank 0 writes)."""
    if dist.get_rank() != 0:
        return None
    log_dir = log_dir.absolute()
    if log_dir in _FAILED:
        return None
    writer = _WRITERS.get(log_dir)
    if writer is None:
        try:
            writer = EventWriter(log_dir)
        except OSError as err:
            _FAILED.add(log_dir)
            logger.warning(f"cannot write TensorBoard events to {log_dir}: {err}; scalars are not logged")
            return None
        _WRITERS[log_dir] = writer
        if len(_WRITERS) == 1:
            atexit.register(close_writers)
    return writer


def add_scalars(writer: Any, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
    """Write ``{tag: value}`` at ``step`` as one TensorBoard event; TensorBoard shows one series per tag.

    ``SummaryWriter.add_scalar`` makes one event per value, and its writer thread checksums each event in
    Python while its queue holds only 10: measured here, 21 ``add_scalar`` calls took 3.4 ms of the calling
    thread, one event with the same 21 values 0.3 ms. Each value is a 32-bit ``simple_value``, as
    ``add_scalar`` writes it.

    Args:
        writer: An :class:`EventWriter`, or a ``torch.utils.tensorboard.SummaryWriter`` (anything else with
            ``add_scalar`` gets one call per value).
        values: Tags and values, written in this order.
        step: The step they belong to (the Trainer's ``global_step``).
        walltime: When they were measured (``time.time()``); now when None.
    """
    if not values:
        return
    if isinstance(writer, EventWriter):
        writer.add_scalars(values, step, walltime)
        return
    file_writer = getattr(writer, "_get_file_writer", None)
    if file_writer is None:
        for tag, value in values.items():
            writer.add_scalar(tag, value, step, walltime=walltime)
        return
    file_writer().add_summary(_summary(values), step, walltime)


def add_scalar_events(writer: Any, events: Sequence[tuple[Mapping[str, float], int, float | None]]) -> None:
    """Several :func:`add_scalars` events, ``(values, step, walltime)`` each: in one write to an :class:`EventWriter`'s
    file (the memory logger publishes its samples since the last gather at once: ten with memory logged every step)."""
    if isinstance(writer, EventWriter):
        writer.add_scalar_events(events)
        return
    for values, step, walltime in events:
        add_scalars(writer, values, step, walltime)


def _summary(values: Mapping[str, float]) -> Any:
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])


_DOUBLE = struct.Struct("<d").pack
_FLOAT = struct.Struct("<f").pack
_LENGTH = struct.Struct("<Q").pack
_CRC = struct.Struct("<I").pack
_UIDS = itertools.count()
MAX_TAGS = 4096  # tags whose encoding is kept (a run has a few dozen)


def _varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _crc32c() -> Any:
    """CRC-32C of bytes: google-crc32c's C code, else tensorboard's own (Python, ~0.1 ms per event)."""
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            return google_crc32c.value
    except ImportError:
        pass
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    return crc32c


def masked_crc(data: bytes, crc32c: Any) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventWriter:
    """A TensorBoard event file, written in the calling thread: each event is one ``write`` of one TFRecord (its
    length, the length's masked CRC-32C, the ``Event`` bytes, their masked CRC-32C) to the file, opened for appending.

    Scalars are encoded by hand (an ``Event`` holding a ``Summary`` of ``Value(tag, simple_value)``: the bytes
    ``SerializeToString`` gives, each tag's part kept from its first use); text and the custom-scalars layout are rare
    and go through the protobuf classes. The file is named as ``SummaryWriter`` names its own, with ``.hf_distprof``
    after it. A failed write is one warning, then nothing more is written.

    Args:
        log_dir: The folder (created when missing).

    Raises:
        OSError: The folder or the file cannot be created.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_UIDS)}"
        self.path = self.log_dir / f"{name}.hf_distprof"
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._crc32c = _crc32c()
        self._tags: dict[str, bytes] = {}
        from tensorboard.compat.proto.event_pb2 import Event, SourceMetadata

        self._event = Event
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2",
                          source_metadata=SourceMetadata(writer="hf_distprof")).SerializeToString())

    def add_scalars(self, values: Mapping[str, float], step: int, walltime: float | None = None) -> None:
        """One event holding every ``{tag: value}`` at ``step``, 32-bit values as ``add_scalar`` writes them."""
        self.add_scalar_events([(values, step, walltime)])

    def add_scalar_events(self, events: Sequence[tuple[Mapping[str, float], int, float | None]]) -> None:
        """One event per ``(values, step, walltime)`` (as :meth:`add_scalars`), all in one write. An event that cannot
        be encoded (a value that is no number) raises, after the events before it are written."""
        records: list[bytes] = []
        try:
            for values, step, walltime in events:
                if values:
                    records.append(self._record(self._scalar_event(values, step, walltime)))
        finally:
            if records:
                self._write_records(b"".join(records))

    def _scalar_event(self, values: Mapping[str, float], step: int, walltime: float | None) -> bytes:
        try:
            parts = [self._tag(tag) + _FLOAT(float(v)) for tag, v in values.items()]
        except OverflowError:  # beyond a 32-bit float: protobuf writes it as an infinity
            return self._summary_event(_summary(values), step, walltime)
        summary = b"".join(parts)
        return (b"\x09" + _DOUBLE(time.time() if walltime is None else float(walltime)) + self._step(step)
                + b"\x2a" + _varint(len(summary)) + summary)

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        """One value (``SummaryWriter.add_scalar``)."""
        self.add_scalars({tag: value}, step, walltime)

    def add_text(self, tag: str, text: str, step: int | None = None, walltime: float | None = None) -> None:
        """Text under ``tag`` (``SummaryWriter.add_text``)."""
        from torch.utils.tensorboard.summary import text as text_summary

        self._add_summary(text_summary(tag, text), step, walltime)

    def add_custom_scalars(self, layout: dict[str, Any]) -> None:
        """The custom-scalars plugin's layout (``SummaryWriter.add_custom_scalars``)."""
        from torch.utils.tensorboard.summary import custom_scalars

        self._add_summary(custom_scalars(layout), None, None)

    def flush(self) -> None:
        """Nothing to do: each event is written when added."""

    def close(self) -> None:
        """Close the file; later events are dropped (no file is opened again)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _tag(self, tag: str) -> bytes:
        """A ``Summary.value`` entry up to its float: field 1 (the ``Value``), its length, the tag, field 2's key."""
        part = self._tags.get(tag)
        if part is None:
            raw = tag.encode()
            value = b"\x0a" + _varint(len(raw)) + raw + b"\x15"
            part = b"\x0a" + _varint(len(value) + 4) + value
            if len(self._tags) < MAX_TAGS:
                self._tags[tag] = part
        return part

    def _step(self, step: int | None) -> bytes:
        step = int(step) if step is not None else 0
        if 0 < step < 2**63:
            return b"\x10" + _varint(step)
        return b"" if step == 0 else bytes(self._event(step=step).SerializeToString())  # (protobuf refuses >= 2**63)

    def _add_summary(self, summary: Any, step: int | None, walltime: float | None) -> None:
        self._write_records(self._record(self._summary_event(summary, step, walltime)))

    def _summary_event(self, summary: Any, step: int | None, walltime: float | None) -> bytes:
        event = self._event(summary=summary, wall_time=time.time() if walltime is None else walltime)
        if step is not None:
            event.step = int(step)
        return bytes(event.SerializeToString())

    def _record(self, data: bytes) -> bytes:
        """``data`` framed as a TFRecord: its length, the length's masked CRC-32C, the bytes, their masked CRC-32C."""
        length = _LENGTH(len(data))
        return length + _CRC(masked_crc(length, self._crc32c)) + data + _CRC(masked_crc(data, self._crc32c))

    def _write(self, data: bytes) -> None:
        self._write_records(self._record(data))

    def _write_records(self, records: bytes) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                view = memoryview(records)
                while view:  # a regular file takes it whole but on a full disk, where the rest fails
                    written = os.write(self._fd, view)
                    if written <= 0:
                        raise OSError(f"wrote {written} of {len(view)} bytes")
                    view = view[written:]
            except OSError as err:
                logger.warning(f"cannot write TensorBoard events to {self.path}: {err!r}; scalars are no longer logged")
                fd, self._fd = self._fd, None
                try:
                    os.close(fd)
                except OSError:
                    pass


def open_folders() -> list[Path]:
    """The folders this process writes TensorBoard events to (rank 0; empty elsewhere)."""
    return list(_WRITERS)


def close_writers() -> None:
    """Flush and close every shared writer."""
    for writer in _WRITERS.values():
        writer.close()
    _WRITERS.clear()
