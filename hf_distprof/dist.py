"""Rank, world and host identity, valid before and after the process group is initialised."""

from __future__ import annotations

import atexit
import logging
import json
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from hf_distprof.core.files import get_hostname  # noqa: F401 (the host name of file names, torch-free)

import orjson
import torch
import torch.distributed as dist


def is_distributed() -> bool:
    """Whether a default process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank: the process group's, else the launcher's ``RANK``, else 0."""
    if is_distributed():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    """World size: the process group's, else the launcher's ``WORLD_SIZE``, else 1."""
    if is_distributed():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


OURS_PREFIX = "hf_distprof/ours"
"""The name that starts every profiler range around a collective hf_distprof issues itself (its capture agreements,
the gathers of its own figures, the run manifest's): ``hf-distprof analyze`` leaves the collectives issued inside one
out of the user's communication. The analysis spells it too (:data:`hf_distprof.analysis.rank.cpu.OURS_PREFIX`, which
never imports torch); a test checks that the two agree."""


def ours(what: str) -> AbstractContextManager[Any]:
    """A profiler range (``record_function``: a ``user_annotation`` on the calling thread) that marks the collectives
    issued inside it as hf_distprof's own, ``hf_distprof/ours <what>``. Costs a few microseconds without a profiler;
    used around every collective of ours, none of which is in the step loop's hot path."""
    return torch.profiler.record_function(f"{OURS_PREFIX} {what}")


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Broadcast one picklable object from ``src`` to every rank; a no-op without a process group.

    Used once at train start (never in the step loop) so that all ranks agree on a run folder.
    """
    if not is_distributed() or get_world_size() == 1:
        return obj
    holder = [obj]
    with ours("broadcast_object"):
        dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Gather one picklable object from every rank; ``[obj]`` without a process group.

    Callers use it on logging steps only: it is a collective.
    """
    if not is_distributed() or get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * get_world_size()
    with ours("all_gather_object"):
        dist.all_gather_object(out, obj)
    _let_gloo_workers_finish()
    return out


GLOO_SETTLE_S = 0.02
"""How long :func:`_let_gloo_workers_finish` gives a gloo worker thread the interpreter lock."""


def _let_gloo_workers_finish() -> None:
    """On gloo, release the interpreter lock for a moment after a collective whose tensors were Python's.

    The gloo worker that ran the collective destroys its work object just after waking the waiting thread; by then
    Python has dropped the tensors, so that destruction takes the interpreter lock to free them. Our collectives at
    train end are the run's last: a rank with little left to do (rank 1) went on to the script's end, where the DDP
    model's destruction tears the process group down while holding the lock and joins that worker, which waits for
    the lock: the rank hung for good after training (1 run in 3 with ``--profile-on-anomaly`` and checkpoints;
    ``~ProcessGroupGloo`` in ``std::thread::join``, the worker in ``~AsyncAllgatherWork`` acquiring the lock).
    Sleeping releases the lock; the callers run a few times per run (train begin and end)."""
    if "gloo" in str(dist.get_backend()):
        import time

        time.sleep(GLOO_SETTLE_S)


class PendingGather:
    """A started all-gather of one tensor per rank; ``result()`` waits for it (by then usually long finished).

    Args:
        work: The collective's work handle; None when there is nothing to wait for.
        out: One tensor per rank, read by :meth:`result` (on NCCL: pinned host copies).
        ready: On NCCL, a CUDA event recorded after the copies to the host; None elsewhere.
    """

    def __init__(self, work: Any, out: list[torch.Tensor], ready: Any = None) -> None:
        self._work, self._out, self._ready = work, out, ready

    def done(self) -> bool:
        """Whether the result is there to read; never waits (``Work.is_completed``, ``Event.query``)."""
        if self._ready is not None:
            return bool(self._ready.query())
        return self._work is None or bool(self._work.is_completed())

    def tensors(self) -> list[torch.Tensor]:
        """Each rank's tensor, in rank order, on the host."""
        if self._work is not None:
            with ours("wait"):  # usually long finished; if not, the wait is ours too
                self._work.wait()
            self._work = None
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        return self._out

    def result(self) -> list[list[float]]:
        """Each rank's values, in rank order."""
        return [t.tolist() for t in self.tensors()]


def _all_gather_async(local: torch.Tensor, what: str) -> PendingGather:
    """Start gathering ``local`` (a host tensor, the same shape on every rank) from every rank, without waiting.

    On NCCL the tensor travels on the current CUDA device, and nothing makes the host wait for the GPU: the
    upload is from pinned memory, the current stream waits for the gather (``Work.wait`` on NCCL holds the
    stream, not the host), the results are copied to pinned host tensors on that stream, and an event
    recorded after them says when they are there (:meth:`PendingGather.done`). A plain ``.to(device)`` and
    ``.tolist()`` would each wait for every kernel the step had queued.
    """
    if not is_distributed() or get_world_size() == 1:
        return PendingGather(None, [local])
    backend = str(dist.get_backend())
    if "gloo" in backend:  # "gloo", or a group with a CPU backend beside the device's ("cpu:gloo,cuda:nccl")
        out = [torch.empty_like(local) for _ in range(get_world_size())]
        with ours(what):
            work = dist.all_gather(out, local, async_op=True)
            if torch._C._autograd._profiler_enabled():
                # Started while this rank's profiler records: finished while it still does. A gloo gather started
                # in the last step of a window and waited for after the profiler stopped and exported it killed
                # its rank with SIGSEGV inside Work.wait() (1 of 22 4-rank --profile-ranks auto runs,
                # benchmarks/bench_crashes.py; docs/measurements.md): no work of ours outlives a recording now.
                work.wait()
                work = None
            return PendingGather(work, out)
    if backend != "nccl":  # another accelerator's backend (xccl, hccl): torch's own, blocking, object gather
        return PendingGather(None, [t.cpu() for t in all_gather_object(local)])
    with ours(what):
        device = torch.device("cuda", torch.cuda.current_device())
        on_gpu = local.pin_memory().to(device, non_blocking=True)
        gathered = [torch.empty_like(on_gpu) for _ in range(get_world_size())]
        dist.all_gather(gathered, on_gpu, async_op=True).wait()
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in gathered]
        for dst, src in zip(host, gathered, strict=True):
            dst.copy_(src, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
    return PendingGather(None, host, ready)


def all_gather_floats_async(values: Sequence[float]) -> PendingGather:
    """Start gathering a fixed-length list of floats from every rank, in one collective, without waiting.

    ``all_gather_object`` would take two collectives and pickling, and waiting on the spot would add a
    synchronisation point to the step: instead the caller collects the result later (the next logging
    step, or train end). Every rank must call this at the same points with the same number of values.
    On NCCL nothing makes the host wait for the GPU (see :func:`_all_gather_async`).
    """
    return _all_gather_async(torch.tensor(list(values), dtype=torch.float64), "all_gather_floats_async")


OBJECT_HEADER = 8  # bytes: each rank's encoded length, little-endian, before its bytes
OBJECT_CAP_MIN = 16 * 1024


class PendingJson:
    """A started all-gather of one JSON object per rank (:func:`all_gather_json_async`).

    Args:
        payload: This rank's object as JSON, UTF-8.
        gather: The started gather of every rank's fixed-size buffer; None without a process group.
        cap: The bytes each buffer holds after its header.
    """

    def __init__(self, payload: bytes, gather: PendingGather | None, cap: int) -> None:
        self._payload, self._gather, self.cap = payload, gather, cap
        self._result: list[Any] | None = None
        self.max_len = len(payload)

    def done(self) -> bool:
        """Whether the buffers are there to read; never waits. (An object larger than ``cap`` on some rank still
        takes one more, blocking, gather in :meth:`result`.)"""
        return self._gather is None or self._gather.done()

    def result(self) -> list[Any]:
        """Each rank's object, decoded from JSON (also without a process group: one behaviour at every world size),
        in rank order. Every rank must call it at the same point: when some rank's object did not fit its buffer
        (every rank reads every length), every rank gathers buffers of the largest length once more, waiting."""
        if self._result is not None:
            return self._result
        if self._gather is None:
            self._result = [_json_load(self._payload)]
            return self._result
        buffers = [t.numpy().tobytes() for t in self._gather.tensors()]
        lengths = [int.from_bytes(b[:OBJECT_HEADER], "little") for b in buffers]
        self.max_len = max(lengths)
        if self.max_len > self.cap:
            again = _all_gather_async(_framed(self._payload, self.max_len), "all_gather_json_async (larger)")
            buffers = [t.numpy().tobytes() for t in again.tensors()]
        self._result = [_json_load(b[OBJECT_HEADER:OBJECT_HEADER + n]) for b, n in zip(buffers, lengths, strict=True)]
        return self._result

    @property
    def next_cap(self) -> int:
        """The buffer size for the next gather of objects like these: the power of two at or above 1.5 times the
        largest encoded object (every rank derives the same from the same lengths), at least ``OBJECT_CAP_MIN``."""
        need = max(OBJECT_CAP_MIN, int(1.5 * self.max_len))
        return 1 << (need - 1).bit_length()


def _framed(payload: bytes, cap: int) -> torch.Tensor:
    """``payload``'s length (8 bytes, little-endian), then the payload when it fits, in a buffer of ``8 + cap``."""
    buffer = bytearray(OBJECT_HEADER + cap)
    buffer[:OBJECT_HEADER] = len(payload).to_bytes(OBJECT_HEADER, "little")
    if len(payload) <= cap:
        buffer[OBJECT_HEADER:OBJECT_HEADER + len(payload)] = payload
    return torch.frombuffer(buffer, dtype=torch.uint8)


def json_cap(rows: int) -> int:
    """A first buffer size for objects carrying ``rows`` per-step rows of a few floats (the step timer's): 80 bytes
    per row and 4 KiB besides, to the power of two, at least ``OBJECT_CAP_MIN``."""
    need = max(OBJECT_CAP_MIN, 4096 + 80 * max(0, rows))
    return 1 << (need - 1).bit_length()


_WARNED_JSON = False


def _scalar(value: Any) -> Any:
    """A numpy or torch scalar as the Python number JSON can write; anything else is an error."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json_bytes(obj: Any) -> bytes:
    """``obj`` as JSON: orjson's (several times faster), or ``json``'s for what orjson refuses and ``json`` writes (an
    integer beyond 64 bits, nesting deeper than 254 levels, a lone surrogate)."""
    try:
        return orjson.dumps(obj, default=_scalar, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError as err:
        if isinstance(err.__cause__, TypeError):  # what ``_scalar`` refused: json would refuse it too
            raise
        return json.dumps(obj, separators=(",", ":"), default=_scalar, allow_nan=False).encode()


def _json_load(data: bytes) -> Any:
    """What :func:`_json_bytes` wrote: orjson reads it, or ``json`` where orjson refuses (a lone surrogate)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def all_gather_json_async(obj: Any, cap: int = OBJECT_CAP_MIN) -> PendingJson:
    """Start gathering one JSON-serialisable object (dicts, lists, numbers, strings, None; tuples come back as
    lists, integer keys as strings, a NaN or an infinity as None, an integer beyond 64 bits as a float: strict JSON,
    by orjson, or by ``json`` for what orjson refuses) from every rank, in one collective, without waiting.

    Each rank sends a buffer of ``cap`` bytes after an 8-byte length (the same size on every rank, as an
    all-gather needs); :meth:`PendingJson.result` decodes them, or, when one did not fit, gathers buffers of
    the largest length once more (blocking). JSON, not pickle: nothing received is ever executed (no module of
    ours unpickles; ``tests/unit/test_hostile_input.py``). Every rank must call this at the same points with
    the same ``cap``: pass the previous gather's :attr:`PendingJson.next_cap` to keep it fitting. On NCCL
    nothing makes the host wait for the GPU (see :func:`_all_gather_async`).
    """
    global _WARNED_JSON
    try:
        payload = _json_bytes(obj)
    except Exception as err:  # noqa: BLE001  # every rank must still take part (it sends null), whatever failed
        err = err.__cause__ or err  # what ``_scalar`` said, rather than orjson's wrapper of it
        if not _WARNED_JSON:
            _WARNED_JSON = True
            logging.getLogger(__name__).warning(f"cannot send a {type(obj).__name__} to the other ranks: {err!r}; "
                                                "sent null instead (said once)")
        payload = b"null"
    if not is_distributed() or get_world_size() == 1:
        return PendingJson(payload, None, cap)
    return PendingJson(payload, _all_gather_async(_framed(payload, cap), "all_gather_json_async"), cap)


def barrier() -> None:
    """Wait for every rank; a no-op without a process group. Only used at train end."""
    if is_distributed() and get_world_size() > 1:
        with ours("barrier"):
            dist.barrier()


def finish(code: int = 0, exit_process: Any = os._exit) -> None:
    """End a training process that has finished: destroy the process group, run the ``atexit`` handlers
    (logging's flush among them), flush stdout/stderr, then leave without the interpreter's C++ teardown.

    Even after ``destroy_process_group()``, about 1 FSDP2 run in 4 on gloo (and, more rarely, DDP) died at
    that teardown with SIGABRT ("terminate called without an active exception": a joinable C++ thread
    destroyed), turning a finished run into a failed job for the launcher. Call it only once training and
    every file are done (a training script's last line); never from a library.

    Args:
        code: The exit status.
        exit_process: What leaves (``os._exit``; a stand-in in tests).
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    exit_process(code)


_EXIT_DESTROY_REGISTERED = False
_TRAINING_ENDED = False  # a train() call of ours ended cleanly (on_train_end): the group may go at exit


def training_ended(done: bool = True) -> None:
    """Say that training ended cleanly (the run-summary callback's ``on_train_end``), or began again (False)."""
    global _TRAINING_ENDED
    _TRAINING_ENDED = done


def destroy_group_at_exit() -> None:
    """At this process's exit, destroy the default process group if the script left it (most do: the Trainer never
    destroys it), before the interpreter's C++ teardown destroys gloo's threads while they are still joinable.

    Left to that teardown, a finished 2- or 4-rank CPU run died of SIGABRT ("terminate called without an active
    exception") in 3 of 45 runs without hf_distprof (``benchmarks/bench_crashes.py``; FACTS.md: about 1 in 14), and
    the launcher marked the job failed. Registered once, when our callbacks are built (before the process group and
    before any exit handler of theirs), so that it runs after every handler registered later (ours, which flush files
    and still read the rank; a tracker's) and before logging's. Only after a clean end of training
    (:func:`training_ended`): after an exception a gather may still be in flight, and destroying the group would wait
    for it. :func:`finish` destroys the group itself.
    """
    global _EXIT_DESTROY_REGISTERED
    if not _EXIT_DESTROY_REGISTERED:
        _EXIT_DESTROY_REGISTERED = True
        atexit.register(_destroy_left_group)


def _destroy_left_group() -> None:
    try:
        if _TRAINING_ENDED and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001, S110 - exiting anyway: a group that cannot be destroyed is torch's to tear down
        pass


class RankPrefixAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with ``[RANK n]`` so interleaved multi-rank logs stay readable."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[RANK {get_rank()}] {msg}", kwargs


def get_logger(name: str) -> RankPrefixAdapter:
    """A module logger whose messages carry the rank."""
    return RankPrefixAdapter(logging.getLogger(name), {})
