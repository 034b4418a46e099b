"""Trace file I/O: finding trace files, naming their rank, and reading their events in bounded chunks.

A Kineto trace is one JSON object whose ``traceEvents`` array holds nearly all of the bytes. Parsing the
whole file at once costs several times its size in Python objects (the reason HTA needs ~2.5x the trace
size in RAM); here the file is decompressed in blocks and the array is cut into runs of whole events that
``orjson`` parses one run at a time, so the peak memory is one block's worth of events whatever the file
size. Everything outside the array (``distributedInfo``, ``baseTimeNanoseconds`` ...) is the metadata.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from hf_distprof.core import names

try:  # zlib-ng inflates the same bytes 2.5x faster than the standard zlib (a 74 MB trace: 37 ms against 94 ms)
    from zlib_ng import zlib_ng as zlib
except ImportError:  # a platform without its wheel: the same API, slower
    import zlib  # type: ignore[no-redef]

# How many decompressed bytes are parsed per chunk: large enough that orjson's per-call cost vanishes,
# small enough that one chunk's Python objects (~10x its bytes) stay well under 100 MB.
CHUNK_BYTES = 4 << 20
TRACE_SUFFIXES = (".json", ".json.gz")
# What torch.profiler's tensorboard_trace_handler and this project's callbacks name their traces.
TORCH_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
# rank3_host_step4-5.pt.trace.json.gz (this project), worker3_step_12...json (HTA, PARAM), rank-3.json.gz
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_EVENTS_KEY = b'"traceEvents"'
# Bounds that keep a hostile or broken file (a gzip bomb, one endless string) from holding unbounded memory: the
# metadata before the events array, and the bytes of one run of events, are never this large in a real trace.
MAX_HEAD_BYTES = 64 << 20
MAX_PENDING_BYTES = 256 << 20
# A gzip bomb made of valid events passes both bounds above, and every event it holds is kept: the inflated size is
# bounded too. Kineto traces inflate 12-18x (this repository's and HTA's test traces); deflate's limit is ~1000x.
# A file inflating beyond MAX_GZIP_RATIO times its size, and beyond MIN_INFLATED_BOUND, is refused.
MAX_GZIP_RATIO = 100
MIN_INFLATED_BOUND = 64 << 20


class NoTraceError(FileNotFoundError):
    """A folder without a trace file; ``run_folder`` is True when it is a run folder of this project (a run manifest
    or step timer files), whose manifest can say why."""

    def __init__(self, folder: Path, run_folder: bool) -> None:
        self.folder = folder
        self.run_folder = run_folder
        what = "no profiler trace (*.pt.trace.json[.gz]) in this run folder" if run_folder else (
            "no trace file (*.json, *.json.gz) in this folder")
        super().__init__(f"{folder}: {what}")


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds this project's run files (a run manifest, its parts, or step timer records)."""
    return (folder / names.MANIFEST_NAME).is_file() or any(
        next(folder.glob(pattern), None) is not None
        for pattern in (names.MANIFEST_PART_NAME.format(rank="*", host="*"), names.TIMING_LOG_NAME.format(rank="*")))


class TraceReadError(ValueError):
    """A trace file that cannot be analysed; the message names the file and what is wrong with it."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def discover_trace_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand folders into the trace files they hold (recursively), keeping explicit files as given.

    Hidden files (the temporary names of a trace being written atomically) are skipped in folders. When
    a folder holds any PyTorch profiler trace (``*.pt.trace.json[.gz]``), or is one of this project's run folders,
    only those are taken, so that other JSON written next to them (``timing_summary.json``, ``manifest.json``) is
    not mistaken for a trace; otherwise every ``*.json`` / ``*.json.gz`` is. Explicit files are always taken as
    given.

    Args:
        paths: Folders and/or ``.json`` / ``.json.gz`` files.

    Returns:
        The trace files, sorted within each folder, without duplicates.

    Raises:
        FileNotFoundError: A path does not exist (:class:`NoTraceError`: a folder holds no trace file).
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.name.endswith(TRACE_SUFFIXES) and not p.name.startswith(".")
            )
            torch_traces = [p for p in inside if p.name.endswith(TORCH_TRACE_SUFFIXES)]
            run_folder = not torch_traces and is_run_folder(path)
            if torch_traces or run_folder:
                inside = torch_traces
            if not inside:
                raise NoTraceError(path, run_folder)
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    unique: dict[Path, None] = dict.fromkeys(p.resolve() for p in found)
    return list(unique)


def rank_from_file_name(path: str | os.PathLike[str]) -> int | None:
    """Return the rank written in a file name (``rank3_...``, ``worker3_...``, ``rank-3.json``), or None."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def _decompressed_blocks(path: Path) -> Iterator[bytes]:
    """Yield the file's bytes in blocks, gunzipping when the file starts with the gzip magic."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head != b"\x1f\x8b":
            while block := fh.read(CHUNK_BYTES):
                yield block
            return
        # wbits=47: gzip or zlib header, so the gzip magic check above is the only sniffing needed.
        inflater = zlib.decompressobj(wbits=47)
        bound = max(MIN_INFLATED_BOUND, MAX_GZIP_RATIO * os.fstat(fh.fileno()).st_size)
        inflated = 0
        while True:
            data = inflater.unconsumed_tail or fh.read(CHUNK_BYTES // 8)
            if not data:
                break
            try:
                # max_length bounds each output block even for highly compressible traces.
                out = inflater.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                raise TraceReadError(path, f"corrupt gzip data ({exc})") from None
            inflated += len(out)
            if inflated > bound:
                raise TraceReadError(
                    path,
                    f"inflates to more than {MAX_GZIP_RATIO}x its size ({inflated >> 20} MB read, {bound >> 20} MB "
                    "allowed; traces inflate 12-18x): a gzip bomb, not a trace",
                )
            if out:
                yield out
            # A gzip file may hold several members (``cat a.gz b.gz``); continue into the next one.
            if inflater.eof and inflater.unused_data:
                rest = inflater.unused_data
                inflater = zlib.decompressobj(wbits=47)
                out = inflater.decompress(rest, CHUNK_BYTES)
                inflated += len(out)
                if out:
                    yield out
        if not inflater.eof:
            raise TraceReadError(path, "truncated gzip file (the stream ends before its end marker)")


# Turns the bytes of a JSON array of events into a list; raises a ValueError subclass on invalid JSON.
Decoder = Callable[[bytes | bytearray | memoryview], list[Any]]


class _ChunkedTrace:
    """State of one streaming read: metadata bytes around the array, and the unparsed tail of events."""

    def __init__(self, path: Path, decode: Decoder) -> None:
        self.path = path
        self.decode = decode
        self.head = bytearray()  # bytes before the events array (metadata), until the array is found
        self.in_array = False
        self.pending = bytearray()  # events bytes not parsed yet

    def feed(self, block: bytes) -> list[Any]:
        """Consume one decompressed block; return the events completed by it."""
        if not self.in_array:
            self.head += block
            key = self.head.find(_EVENTS_KEY)
            if key < 0:
                if len(self.head) > MAX_HEAD_BYTES:
                    raise TraceReadError(
                        self.path, f"not a trace: no traceEvents array in the first {MAX_HEAD_BYTES >> 20} MB"
                    )
                return []
            bracket = self.head.find(b"[", key)
            if bracket < 0:
                return []
            # ``pending`` always starts with "[", so that a run of events plus a "]" is a JSON array.
            self.pending = self.head[bracket:]
            del self.head[key:]
            self.in_array = True
            return self._drain(final=False)
        self.pending += block
        return self._drain(final=False)

    def _decode_prefix(self, stop: int) -> list[Any]:
        """Decode ``pending[:stop] + "]"`` in place, without copying the megabytes of the prefix."""
        buf = self.pending
        saved = buf[stop]
        buf[stop] = 0x5D  # "]"; the byte was whitespace or the "," after the last event of the run
        view = memoryview(buf)[: stop + 1]
        try:
            return self.decode(view)
        finally:
            view.release()  # a bytearray with a live view cannot be resized
            buf[stop] = saved

    def _drain(self, final: bool) -> list[Any]:
        """Parse the longest prefix of ``pending`` that is a run of whole events."""
        buf = self.pending
        if not final and len(buf) < CHUNK_BYTES:
            return []
        # Candidate cut points are "}" "," "{" with optional whitespace between; one inside a string or a
        # nested object makes the prefix invalid JSON, in which case the previous candidate is tried.
        end = len(buf)
        last_error: ValueError | None = None
        for _ in range(64):
            cut = buf.rfind(b"}", 0, end)
            if cut < 1:
                break
            nxt = _skip_ws(buf, cut + 1)
            if nxt < len(buf) and buf[nxt] == 0x2C:  # ","
                after = _skip_ws(buf, nxt + 1)
                if after < len(buf) and buf[after] == 0x7B:  # "{"
                    try:
                        events = self._decode_prefix(cut + 1)
                    except ValueError as exc:  # orjson's and msgspec's decode errors are ValueErrors
                        last_error = exc
                        end = cut
                        continue
                    # Keep the "," as the new first byte, turned into "[" (cheap: CPython's bytearray
                    # drops a prefix by moving its start, not by copying the rest).
                    del buf[:nxt]
                    buf[0] = 0x5B
                    return events
            end = cut
        # No valid run although the buffer holds several chunks' worth of bytes: the events are not
        # valid JSON. Failing now, rather than at end of file, keeps a corrupt file from costing O(n^2).
        if last_error is not None and len(buf) > 3 * CHUNK_BYTES:
            raise TraceReadError(self.path, f"invalid JSON in traceEvents ({last_error})")
        if len(buf) > MAX_PENDING_BYTES:
            raise TraceReadError(
                self.path, f"no complete event in {len(buf) >> 20} MB of traceEvents: not a profiler trace"
            )
        return []  # no complete event yet: wait for more bytes

    def finish(self) -> tuple[dict[str, Any], list[Any]]:
        """Parse what is left at end of file; return (metadata, last events)."""
        if not self.in_array:
            return self._metadata_only(), []
        buf = self.pending
        # A whole document ends with the "}" of its top-level object; anything else was cut short.
        if not bytes(buf[-64:]).rstrip().endswith(b"}"):
            raise TraceReadError(
                self.path, "truncated JSON: the file ends in the middle of the traceEvents array"
            )
        close, events = _closing_bracket(buf, self.decode)
        if close < 0:
            raise TraceReadError(self.path, "invalid JSON in traceEvents (no valid end of the array found)")
        tail = bytes(buf[close + 1 :])
        meta = self._metadata(tail)
        return meta, events

    def _metadata_only(self) -> dict[str, Any]:
        if not self.head.strip():
            raise TraceReadError(self.path, "empty file")
        try:
            doc = orjson.loads(bytes(self.head))
        except orjson.JSONDecodeError as exc:
            raise TraceReadError(self.path, f"invalid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise TraceReadError(self.path, "not a trace: top level is not a JSON object")
        raise TraceReadError(self.path, "not a trace: no traceEvents array")

    def _metadata(self, tail: bytes) -> dict[str, Any]:
        # Re-assemble the document without the events: head + "[]" + what followed the array.
        doc_bytes = bytes(self.head) + b'"traceEvents": []' + tail
        try:
            doc = orjson.loads(doc_bytes)
        except orjson.JSONDecodeError as exc:
            raise TraceReadError(self.path, f"invalid JSON outside traceEvents ({exc})") from None
        if not isinstance(doc, dict):
            raise TraceReadError(self.path, "not a trace: top level is not a JSON object")
        doc.pop("traceEvents", None)
        return doc


def _skip_ws(buf: bytearray, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in b" \t\r\n":
        i += 1
    return i


def _skip_ws_back(buf: bytearray, i: int) -> int:
    while i > 0 and buf[i] in b" \t\r\n":
        i -= 1
    return i


def _closing_bracket(buf: bytearray, decode: Decoder) -> tuple[int, list[Any]]:
    """Index of the "]" closing the events array in the final bytes (which start with its "["), and
    the events before it.

    Returns (-1, []) when no "]" closes a valid run of events.
    """
    # Metadata after the array may hold "]" too, so try the last "]" preceded by an event's "}" (or
    # by nothing: an empty array), verifying by parsing; keep the parsed events to not parse twice.
    end = len(buf)
    for _ in range(64):
        close = buf.rfind(b"]", 0, end)
        if close < 1:
            return -1, []
        last = _skip_ws_back(buf, close - 1)
        if last == 0:  # only the "[" before it: an empty array
            return close, []
        if buf[last] == 0x7D:  # "}"
            view = memoryview(buf)[: close + 1]
            try:
                return close, decode(view)
            except ValueError:
                pass
            finally:
                view.release()
        end = close
    return -1, []


def iter_trace_events(path: str | os.PathLike[str], meta_out: dict[str, Any]) -> Iterator[list[Any]]:
    """Yield a trace's events in chunks of whole events, reading the file once with bounded memory.

    Args:
        path: A ``.json`` or ``.json.gz`` Kineto/Chrome trace.
        meta_out: Filled, once the file is read to the end, with the trace's top-level keys other than
            ``traceEvents`` (``distributedInfo``, ``baseTimeNanoseconds`` ...).

    Yields:
        Lists of event dicts, in file order.

    Raises:
        TraceReadError: The file is empty, truncated, not gzip/JSON, or not a trace object.
    """
    return iter_decoded_events(path, meta_out, orjson.loads)


def iter_decoded_events(
    path: str | os.PathLike[str], meta_out: dict[str, Any], decode: Decoder
) -> Iterator[list[Any]]:
    """:func:`iter_trace_events` with another decoder for the events (the metadata is always dicts).

    Args:
        path: A ``.json`` or ``.json.gz`` Kineto/Chrome trace.
        meta_out: Filled at end of file with the top-level keys other than ``traceEvents``.
        decode: Parses the bytes of a JSON array of events (``b"[{...},{...}]"``) into a list. It must
            raise a ``ValueError`` (as orjson's and msgspec's errors are) on invalid JSON: a chunk is cut
            where ``},{`` appears, which may be inside a string, and the error is what rejects that cut.

    Yields:
        Lists of decoded events, in file order.

    Raises:
        TraceReadError: The file is empty, truncated, not gzip/JSON, or not a trace object.
    """
    path = Path(path)
    state = _ChunkedTrace(path, decode)
    try:
        for block in _decompressed_blocks(path):
            events = state.feed(block)
            if events:
                yield events
    except OSError as exc:
        raise TraceReadError(path, f"cannot read ({exc.strerror or exc})") from None
    meta, events = state.finish()
    if events:
        yield events
    meta_out.update(meta)


def trace_rank(path: str | os.PathLike[str], meta: dict[str, Any]) -> int:
    """The rank of a trace: ``distributedInfo.rank``, else the number in the file name.

    Raises:
        TraceReadError: Neither gives a rank.
    """
    info = meta.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:  # JSON true is a Python int too
        return rank
    rank = rank_from_file_name(path)
    if rank is None:
        raise TraceReadError(
            path,
            "cannot tell the rank: no distributedInfo.rank in the trace and no rank in the file name "
            "(name it like rank3_... or worker3_...)",
        )
    return rank


_NAMED_STEPS = re.compile(r"_step(\d+)-(\d+)(?:\.pt)?\.trace\.json(?:\.gz)?$")


def steps_named(path: str | os.PathLike[str], steps: list[Any]) -> tuple[list[Any], list[tuple[float, float]]]:
    """``steps`` (each with a ``number``, ``start`` and ``end``) less those outside the optimizer steps a trace's name
    says it holds (``..._step8-8.pt.trace.json.gz``, the profiler callback's name), and the time they held (from a
    step after the named ones to the trace's end). A window cut short by an exception or a signal ends after
    ``prof.step()`` opened the next step, which never ran: its ``ProfilerStep#9`` lasts until the trace was stopped
    (read as a step it was a 1.5 ms "median step", or a 633 ms wait in a collective for a dead peer). All of ``steps``
    when the name says no steps or none of them is inside."""
    found = _NAMED_STEPS.search(os.fspath(path))
    if found is None:
        return steps, []
    first, last = int(found.group(1)), int(found.group(2))
    inside = [s for s in steps if first <= s.number <= last]
    if not inside or len(inside) == len(steps):
        return steps, []
    return inside, [(s.start, s.end if s.number < first else math.inf) for s in steps if not first <= s.number <= last]
