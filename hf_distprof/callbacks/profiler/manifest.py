"""The run manifest while training runs: who ran where, each rank's clock against rank 0's, every window and why.

Owned by the profiler callback on every rank (profiled or not). Collectives happen at train start only (one
gather of every rank's host and versions, the clock measurement between rank 0 and one rank per host, one
broadcast of its result) and once at train end (rank 0 gathers the parts for ``manifest.json``); nothing
happens on ordinary steps. Each rank's part is rewritten atomically at start and after each of its windows,
so a run stopped by SIGTERM or a rank lost to SIGKILL still leaves a manifest that readers assemble from the
parts (:func:`hf_distprof.analysis.read.manifest.load_manifest`).

Clock offsets: ranks on one host read one clock, so one rank per host (its lowest) measures against rank 0 by
NTP-style ping-pong over the process group (gloo, CPU tensors: no device queue in the timing) and the others
on that host take its result. Each round gives the offset ``((t1 - t0) + (t2 - t3)) / 2`` and the round trip
``(t3 - t0) - (t2 - t1)``; the round with the shortest trip is kept, and half that trip bounds the error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import torch
import torch.distributed as torch_dist

from hf_distprof import dist, paths
from hf_distprof.analysis.read.manifest import (
    FINISHED,
    PART_FORMAT,
    RUNNING,
    SCHEDULE,
    VERSION,
    assemble,
    read_rank_choices,
)
from hf_distprof.callbacks.profiler.capture import Window
from hf_distprof.config import ProfilingArguments
from hf_distprof.core import job
from hf_distprof.core.clock import ntp_offset
from hf_distprof.core.names import (
    FLIGHT_RECORDER_NAME,
    HANG_DUMP_NAME,
    MANIFEST_NAME,
    MANIFEST_PART_NAME,
    MEMORY_LOG_NAME,
    MEMORY_STATS_NAME,
    PARALLELISM_NAME,
    RANK_LOG_NAME,
    TIMING_LOG_NAME,
    TRACE_SUFFIX,
)
from hf_distprof.core.versions import library_versions

logger = dist.get_logger(__name__)

# Ping-pong rounds per host: the shortest of them sets the offset (a few suffice on a quiet network).
CLOCK_ROUNDS = 8
# Per-rank files (besides the windows' own) that a rank's part lists when they exist at train end.
_RANK_FILES = (RANK_LOG_NAME, MEMORY_LOG_NAME, TIMING_LOG_NAME, MEMORY_STATS_NAME, HANG_DUMP_NAME,
               FLIGHT_RECORDER_NAME)


@dataclass(frozen=True)
class ClockOffset:
    """One clock against the reference's: ``offset_us`` (peer minus reference), within ``uncertainty_us``."""

    offset_us: float
    uncertainty_us: float
    rounds: int


def ntp_estimate(samples: Sequence[tuple[int, int, int, int]]) -> ClockOffset:
    """The offset from ping-pong rounds, each ``(t0, t1, t2, t3)`` in nanoseconds, in microseconds.

    :func:`hf_distprof.core.clock.ntp_offset` takes the round of the shortest trip; half that trip (the time on
    the wire) bounds the error.

    Raises:
        ValueError: No sample.
    """
    offset, trip = ntp_offset(samples)
    return ClockOffset(offset / 1e3, max(trip, 0) / 2e3, len(samples))


class Transport(Protocol):
    """Two integers at a time to and from one peer, in order."""

    def send(self, values: list[int]) -> None: ...

    def recv(self) -> list[int]: ...


def ping(transport: Transport, now: Callable[[], int] = time.time_ns, rounds: int = CLOCK_ROUNDS) -> ClockOffset:
    """The reference's side of the measurement: ``rounds`` round trips to the peer running :func:`pong`."""
    samples = []
    for _ in range(rounds):
        t0 = now()
        transport.send([t0, 0])
        t1, t2 = transport.recv()
        samples.append((t0, t1, t2, now()))
    return ntp_estimate(samples)


def pong(transport: Transport, now: Callable[[], int] = time.time_ns, rounds: int = CLOCK_ROUNDS) -> None:
    """The peer's side: answer each of ``rounds`` pings with the time it arrived and the time of the reply."""
    for _ in range(rounds):
        transport.recv()
        t1 = now()
        transport.send([t1, now()])


class _ProcessGroupTransport:
    """:class:`Transport` over ``torch.distributed`` send/recv of a CPU int64 tensor."""

    def __init__(self, peer: int, group: Any) -> None:
        self.peer, self.group = peer, group
        self.buffer = torch.zeros(2, dtype=torch.int64)

    def send(self, values: list[int]) -> None:
        torch_dist.send(torch.tensor(values, dtype=torch.int64), dst=self.peer, group=self.group)

    def recv(self) -> list[int]:
        torch_dist.recv(self.buffer, src=self.peer, group=self.group)
        return [int(v) for v in self.buffer.tolist()]


def host_leaders(hosts: Sequence[str]) -> dict[str, int]:
    """The lowest rank of each host (``hosts[r]`` is rank r's host), the one that measures its host's clock."""
    leaders: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        leaders.setdefault(host, rank)
    return leaders


def rank_clocks(hosts: Sequence[str], measured: Mapping[int, ClockOffset]) -> list[dict[str, Any]]:
    """Every rank's clock entry: its host leader's measurement; 0 exactly on rank 0's host (the same clock).

    Args:
        hosts: Each rank's host, by rank.
        measured: The measurement of each host leader that is not on rank 0's host.
    """
    leaders = host_leaders(hosts)
    out: list[dict[str, Any]] = []
    for host in hosts:
        leader = leaders[host]
        if host == hosts[0]:
            out.append({"offset_us": 0.0, "uncertainty_us": 0.0, "measured_on_rank": 0, "rounds": 0})
        elif leader in measured:
            m = measured[leader]
            out.append({"offset_us": m.offset_us, "uncertainty_us": m.uncertainty_us, "measured_on_rank": leader,
                        "rounds": m.rounds})
        else:
            out.append({"offset_us": None, "uncertainty_us": None, "measured_on_rank": None, "rounds": 0})
    return out


def measure_clocks(hosts: Sequence[str], rounds: int = CLOCK_ROUNDS) -> list[dict[str, Any]]:
    """Every rank's clock against rank 0's; on every rank, at the same point (collective).

    Rank 0 ping-pongs with each other host's leader in turn, then broadcasts the result. On a backend other
    than gloo the pings go over a gloo group of the leaders (CPU timing, no device queue).
    """
    rank = dist.get_rank()
    leaders = sorted(set(host_leaders(hosts).values()))
    measured: dict[int, ClockOffset] = {}
    if len(leaders) > 1 and dist.is_distributed():
        group = None if torch_dist.get_backend() == "gloo" else torch_dist.new_group(ranks=leaders, backend="gloo")
        for leader in leaders[1:]:
            # A failed exchange leaves that host unmeasured; every rank still reaches the broadcast below, or
            # the ranks' later collectives would pair wrongly.
            try:
                with dist.ours("clock offsets"):
                    if rank == 0:
                        measured[leader] = ping(_ProcessGroupTransport(leader, group), rounds=rounds)
                    elif rank == leader:
                        pong(_ProcessGroupTransport(0, group), rounds=rounds)
            except Exception as err:  # noqa: BLE001 - a clock measurement must not stop training
                logger.warning(f"clock offset of rank {leader} against rank 0 not measured: {err!r}")
    measured = dist.broadcast_object(measured)
    return rank_clocks(hosts, measured)


def window_reasons(first: int, scheduled: bool, extra: Sequence[Window]) -> tuple[list[str], str]:
    """Why the window whose first recorded step is ``first`` was taken, and the capture's own words.

    Args:
        first: The window's first recorded step.
        scheduled: Whether the flags' schedule records that step.
        extra: The windows opened on demand or on anomaly (:attr:`~.capture.CapturePlan.windows`).
    """
    if scheduled:
        return [SCHEDULE], ""
    for w in extra:
        if w.first_recorded <= first <= w.last:
            return list(w.causes), w.reason
    return [], ""


class RunManifest:
    """This rank's part of the run manifest; rank 0 also writes the combined manifest at train end.

    Build it with :meth:`start` on every rank at the same point. Writes never raise: a failure is one warning.

    Args:
        run_dir: The run folder; None writes nothing (the collectives still happen, so ranks stay in step).
        args: The profiling flags.
        hosts: Every rank's host, by rank.
        clocks: Every rank's clock entry (:func:`rank_clocks`).
    """

    def __init__(self, run_dir: Path | None, args: ProfilingArguments, hosts: Sequence[str],
                 clocks: Sequence[Mapping[str, Any]], versions: Mapping[str, Any]) -> None:
        self.run_dir = run_dir
        self.rank = dist.get_rank()
        self.host = hosts[self.rank] if self.rank < len(hosts) else dist.get_hostname()
        self.part: dict[str, Any] = {
            "format": PART_FORMAT, "version": VERSION, "rank": self.rank, "world_size": dist.get_world_size(),
            "host": self.host, "local_rank": _local_rank(), "pid": os.getpid(),
            "run_name": run_dir.name if run_dir is not None else None,
            "profile_ranks": str(args.profile_ranks), "versions": dict(versions), "job": job.job_record(),
            "clock": dict(clocks[self.rank]) if self.rank < len(clocks) else {},
            "started_at": time.time(), "updated_at": time.time(), "status": RUNNING,
            "windows": [], "files": [], "failed_exports": 0,
        }
        self._warned = False
        a = args
        self._schedule = (f"--profiler-skip-first {a.profiler_skip_first} --profiler-wait-steps "
                          f"{a.profiler_wait_steps} --profiler-warmup-steps {a.profiler_warmup_steps} "
                          f"--profiler-active-steps {a.profiler_active_steps} --profiler-repeat {a.profiler_repeat}")

    @classmethod
    def start(cls, run_dir: Path | None, args: ProfilingArguments) -> RunManifest:
        """Every rank, at train start: gather hosts and versions, measure clocks, write this rank's part."""
        versions = library_versions()
        everyone = dist.all_gather_object((dist.get_hostname(), versions))
        hosts = [str(h) for h, _ in everyone]
        try:
            clocks = measure_clocks(hosts)
        except Exception as err:  # noqa: BLE001 - a failed measurement costs the offsets, never the training
            logger.warning(f"run manifest: measuring clock offsets failed: {err!r}; merge falls back to collectives")
            clocks = rank_clocks(hosts, {})
        manifest = cls(run_dir, args, hosts, clocks, versions)
        manifest.write_part()
        return manifest

    def planned(self, args: ProfilingArguments, offset: int, max_steps: int) -> None:
        """Record the regular schedule this rank follows (and whether windows may open on request), so that a run
        folder without a trace says why: its first recorded step against the run's last step.

        Args:
            args: The profiling flags.
            offset: ``global_step`` when training (re)started: the schedule counts from there.
            max_steps: The steps the Trainer will run.
        """
        a = args
        self.part["schedule"] = {
            "skip_first": a.profiler_skip_first, "wait": a.profiler_wait_steps, "warmup": a.profiler_warmup_steps,
            "active": a.profiler_active_steps, "repeat": a.profiler_repeat, "offset": offset,
            "first_recorded_step": offset + a.profiler_skip_first + a.profiler_wait_steps + a.profiler_warmup_steps + 1,
            "max_steps": max_steps, "on_demand": bool(a.profile_on_demand), "on_anomaly": bool(a.profile_on_anomaly),
        }
        self.write_part()

    def window_written(self, first: int, last: int, reasons: list[str], detail: str, cut_short: bool) -> None:
        """Add a window this rank wrote (its files are the run folder's ``rank{R}_{host}_step{first}-{last}*``).

        Args:
            first: Its first recorded step.
            last: Its last recorded step.
            reasons: Why it was taken (:func:`window_reasons`).
            detail: The capture's words for a window opened on demand or on anomaly; the schedule's flags otherwise.
            cut_short: Whether training (or a signal) stopped it before its last planned step.
        """
        detail = detail or (self._schedule if reasons == [SCHEDULE] else "")
        self.part["windows"].append({"first": first, "last": last, "reasons": reasons, "detail": detail,
                                     "cut_short": cut_short, "files": self._window_files(first, last)})
        self.write_part()

    def finish(self, failed_exports: int = 0, last_step: int | None = None) -> None:
        """Every rank, at train end: final part, then rank 0 gathers every part and writes ``manifest.json``.

        Args:
            failed_exports: Traces this rank could not write.
            last_step: The last optimizer step the run reached (``global_step``); None when unknown.
        """
        if last_step is not None:
            self.part["last_step"] = last_step
        for w in self.part["windows"]:
            w["files"] = self._window_files(w["first"], w["last"]) or w["files"]  # files written after the window
        self.part["files"] = self._rank_files()
        self.part["failed_exports"] = failed_exports
        self.part["status"] = FINISHED
        self.write_part()
        parts = dist.all_gather_object(self.part)
        if self.rank != 0 or self.run_dir is None:
            return
        try:
            manifest = assemble([p for p in parts if p], combined=True, rank_choices=read_rank_choices(self.run_dir))
            if (self.run_dir / PARALLELISM_NAME).is_file():
                manifest["files"].append({"name": PARALLELISM_NAME, "rank": 0, "host": self.host, "window": None})
            self._write(self.run_dir / MANIFEST_NAME, manifest)
        except Exception as err:  # noqa: BLE001 - the manifest must never fail the job
            logger.warning(f"run manifest: could not combine the parts: {err!r}; readers assemble them instead")

    def write_part(self) -> None:
        """Rewrite this rank's part (atomically)."""
        if self.run_dir is None:
            return
        self.part["updated_at"] = time.time()
        self._write(self.run_dir / MANIFEST_PART_NAME.format(rank=self.rank, host=self.host), self.part)

    def _write(self, path: Path, doc: Mapping[str, Any]) -> None:
        try:
            with paths.atomic_path(path) as tmp:
                tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        except Exception as err:  # noqa: BLE001 - never let the manifest break training
            if not self._warned:
                self._warned = True
                logger.warning(f"run manifest: could not write {path}: {err!r}; training goes on")

    def _window_files(self, first: int, last: int) -> list[str]:
        if self.run_dir is None:
            return []
        stem = paths.trace_file_name(self.rank, self.host, first, last).removesuffix(TRACE_SUFFIX)
        try:
            names = [p.name for p in self.run_dir.glob(stem + "*")]
        except OSError:
            return []
        # The stem followed by "." or "_": rank1_h_step3-4 must not take rank1_h_step3-45's files.
        return sorted(n for n in names if n[len(stem):len(stem) + 1] in (".", "_"))

    def _rank_files(self) -> list[str]:
        if self.run_dir is None:
            return []
        names = [n.format(rank=self.rank, host=self.host) for n in _RANK_FILES]
        return [n for n in names if (self.run_dir / n).is_file()]


def _local_rank() -> int | None:
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else None
