"""Memory counters of this process, read from the host without a device sync.

One place owns the peak counters, because reading a peak *per window* means resetting it
(``torch.cuda.reset_peak_memory_stats``; on Linux, writing ``5`` to ``/proc/self/clear_refs`` resets the
process's peak RSS, ``VmHWM``, which ``getrusage`` reports too). :func:`window_peak_bytes` reads and resets;
:func:`lifetime_peak_bytes` stays the peak of the whole run for every caller, resets or not.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import psutil
import torch

MB = 1024 * 1024

_PROCESS: psutil.Process | None = None
# The highest peak read before a reset, per device key ("cpu" for the process RSS, "cuda:N").
_PEAK_BEFORE_RESET: dict[str, int] = {}
_CLEAR_REFS = "/proc/self/clear_refs"


def this_process() -> psutil.Process:
    """This process's psutil handle, made once per pid (a forked child gets its own)."""
    global _PROCESS
    if _PROCESS is None or _PROCESS.pid != os.getpid():
        _PROCESS = psutil.Process()
    return _PROCESS


# (pid, file descriptor) of /proc/self/statm, kept open by the process that opened it; fd -1: not readable here.
_STATM: tuple[int, int] | None = None
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _statm_pages() -> tuple[int, int] | None:
    """(virtual size, resident size) in pages from Linux's ``/proc/self/statm``, or None where it cannot be read.

    One ``pread`` of a descriptor kept open (~1 us): psutil's ``memory_info()`` reads the same two numbers from
    the same file through a stack of Python wrappers, 12 us warm and 120-170 us at a training step's end, when a
    step's work has left the caches cold. A forked child opens its own (``/proc/self`` was the parent's).
    """
    global _STATM
    pid = os.getpid()
    if _STATM is None or _STATM[0] != pid:
        try:
            _STATM = (pid, os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except OSError:
            _STATM = (pid, -1)
    if _STATM[1] < 0:
        return None
    try:
        size, resident = os.pread(_STATM[1], 128, 0).split()[:2]
        return int(size), int(resident)
    except (OSError, ValueError):
        return None


def host_rss_bytes() -> int:
    """The process's resident set size in bytes (``/proc/self/statm``; psutil elsewhere)."""
    pages = _statm_pages()
    return pages[1] * _PAGE_BYTES if pages is not None else int(this_process().memory_info().rss)


def host_memory() -> dict[str, float]:
    """The process's resident and virtual size in MiB: ``{"rss_mb", "vms_mb"}`` (``/proc/self/statm``, as psutil
    reads them, in one syscall; psutil where that file is missing)."""
    pages = _statm_pages()
    if pages is not None:
        return {"rss_mb": pages[1] * _PAGE_BYTES / MB, "vms_mb": pages[0] * _PAGE_BYTES / MB}
    info = this_process().memory_info()
    return {"rss_mb": info.rss / MB, "vms_mb": info.vms / MB}


def _key(device: torch.device) -> str:
    return "cpu" if device.type != "cuda" else f"cuda:{device.index if device.index is not None else 0}"


# (device key, the caller's step) -> the allocator's (allocated, reserved, peak allocated) bytes read at that step:
# the memory logger's sample and the step timer's logging-step figures share one read. Cleared by a peak reset.
_COUNTERS: dict[str, tuple[int, tuple[int, int, int]]] = {}


def forget_counters() -> None:
    """Drop the shared allocator reads (a new ``train()`` call: its step numbers start again)."""
    _COUNTERS.clear()


def cuda_counters(device: torch.device, step: int | None = None) -> tuple[int, int, int]:
    """The caching allocator's allocated, reserved and peak-allocated bytes on ``device``, in one read of its raw
    counters (host memory, no sync).

    ``torch.cuda.memory_allocated``, ``memory_reserved`` and ``max_memory_allocated`` each build and flatten the whole
    ``memory_stats()`` dict (120 keys); the nested one the allocator returns is read here instead, where torch has it.
    With ``step``, a read already taken at that step (by another callback) is returned again.
    """
    key = _key(device)
    if step is not None:
        cached = _COUNTERS.get(key)
        if cached is not None and cached[0] == step:
            return cached[1]
    values: tuple[int, int, int] | None = None
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None and torch.cuda.is_initialized():
        try:
            nested = raw(device.index if device.index is not None else torch.cuda.current_device())
            values = (int(nested["allocated_bytes"]["all"]["current"]), int(nested["reserved_bytes"]["all"]["current"]),
                      int(nested["allocated_bytes"]["all"]["peak"]))
        except (KeyError, TypeError, RuntimeError):
            values = None
    if values is None:
        stats = torch.cuda.memory_stats(device)
        values = (int(stats.get("allocated_bytes.all.current", 0)), int(stats.get("reserved_bytes.all.current", 0)),
                  int(stats.get("allocated_bytes.all.peak", 0)))
    if step is not None:
        _COUNTERS[key] = (step, values)
    return values


def current_peak_bytes(device: torch.device, cuda_peak: int | None = None, step: int | None = None) -> int:
    """The peak since the last reset: CUDA peak allocated on a GPU (``cuda_peak`` when the caller has just read
    the allocator's counters; else :func:`cuda_counters` at ``step``), peak RSS of the process on CPU."""
    if device.type == "cuda":
        return int(cuda_peak if cuda_peak is not None else cuda_counters(device, step)[2])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


def lifetime_peak_bytes(device: torch.device, step: int | None = None) -> int:
    """The peak of the whole run so far, window resets included (``step``: as for :func:`cuda_counters`)."""
    return max(current_peak_bytes(device, step=step), _PEAK_BEFORE_RESET.get(_key(device), 0))


def note_peak(device: torch.device, peak: int) -> None:
    """Count ``peak`` (bytes, a peak a sample reported) in the run's: the sample may report more than the counter it
    read (:func:`hf_distprof.callbacks.memory.logger.read_memory` keeps a peak at or above the resident size it read
    beside it), and the run's peak must be at least every peak reported before it."""
    key = _key(device)
    _PEAK_BEFORE_RESET[key] = max(_PEAK_BEFORE_RESET.get(key, 0), peak)


def window_peak_bytes(device: torch.device, cuda_peak: int | None = None) -> int:
    """The peak since the previous call (or the start), then reset, so that the next window has its own.

    On CPU the reset needs Linux's ``/proc/self/clear_refs``; where it cannot be written, the value is the
    peak since the process started (and :func:`peak_resets` says so). ``cuda_peak``: as for
    :func:`current_peak_bytes`.
    """
    peak = current_peak_bytes(device, cuda_peak)
    key = _key(device)
    _PEAK_BEFORE_RESET[key] = max(_PEAK_BEFORE_RESET.get(key, 0), peak)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        _COUNTERS.pop(key, None)  # a read from before the reset no longer holds the peak
    else:
        _reset_peak_rss()
    return peak


_RSS_RESET_WORKS: bool | None = None
# (pid, file descriptor) of /proc/self/clear_refs, kept open by the process that opened it: each write of "5" resets
# the peak (the kernel reads the value written, not a position), without an open and a close per sample.
_CLEAR_REFS_FD: tuple[int, int] | None = None


def _reset_peak_rss() -> None:
    global _RSS_RESET_WORKS, _CLEAR_REFS_FD
    if _RSS_RESET_WORKS is False:
        return
    pid = os.getpid()
    try:
        if _CLEAR_REFS_FD is None or _CLEAR_REFS_FD[0] != pid:
            _CLEAR_REFS_FD = (pid, os.open(_CLEAR_REFS, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)))
        os.write(_CLEAR_REFS_FD[1], b"5")
        _RSS_RESET_WORKS = True
    except OSError:
        _RSS_RESET_WORKS = False


def peak_resets(device: torch.device) -> bool:
    """Whether :func:`window_peak_bytes` really resets on this device (always on CUDA)."""
    return device.type == "cuda" or _RSS_RESET_WORKS is not False


def cuda_memory_stats(device: torch.device) -> dict[str, Any]:
    """The caching allocator's full ``memory_stats()`` plus ``fragmentation_bytes`` (reserved - allocated).

    Host counters only (no sync). Keys are the allocator's own (``allocated_bytes.all.current``,
    ``num_ooms``, ``num_alloc_retries``, ...).
    """
    stats = dict(torch.cuda.memory_stats(device))
    allocated = int(stats.get("allocated_bytes.all.current", 0))
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    stats["fragmentation_bytes"] = reserved - allocated
    return stats
