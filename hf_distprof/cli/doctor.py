"""``hf-distprof doctor``: the distributed-debugging checklist as bounded checks, run on every rank.

Launch it like training (``torchrun --nproc_per_node N $(which hf-distprof) doctor``, or ``accelerate launch
--multi_gpu``), or alone as a world of one. Every rank runs the checks of :data:`CHECKS` in order; rank 0 prints
each as ✓ (passed), ✗ (failed) or - (skipped) with the numbers behind it, then one summary line, and exits 1
when a check failed.

Nothing may hang, so the results do not travel over the process group under test: each rank posts its result
of a check to the launcher's key-value store (the one ``init_process_group`` rendezvouses through), rank 0
waits for them until the check's deadline (``--timeout`` after it started, plus :data:`GRACE_S`) and names the
ranks whose result never came, then posts a verdict that the other ranks wait for before the next check. Every
collective is started asynchronously and waited for with the time left to the deadline. After a rank went
silent or a collective failed, the group is in an unknown state, so the later checks that use it are skipped.
A watchdog thread on every rank is the backstop for a call that ignores its timeout: it prints the check's name
and ends the process.

Test-only fault injection: ``HF_DISTPROF_DOCTOR_INJECT=<check>:<rank>[:hang]`` makes ``<rank>`` see a wrong
result of ``<check>`` (the default mode: data received off by one, or a clock one hour ahead for
``clock_skew``), or never join it (``hang``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

# The order they run in: the store-only checks first, so that a mismatch that explains a failing collective
# is already on the screen when the collective fails.
CHECKS = ("init", "versions", "environment", "memory", "p2p", "all_reduce", "all_gather", "reduce_scatter",
          "broadcast", "barrier", "clock_skew")
# Checks that run over the process group; skipped once it is broken.
GROUP_CHECKS = CHECKS[4:]
INJECT_ENV = "HF_DISTPROF_DOCTOR_INJECT"
INJECTABLE = {"wrong": ("p2p", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "clock_skew"),
              "hang": ("init", *GROUP_CHECKS)}
GRACE_S = 2.0  # how much longer than --timeout rank 0 waits for results, the others for a verdict
PAYLOAD_NUMEL = 1 << 18  # float32 elements: 1 MiB per point-to-point message and per collective buffer
REPEATS = 3  # timed runs of each collective, after one untimed warm-up
SKEW_SAMPLES = 8  # ping-pongs per rank; the one with the shortest round trip gives the offset
ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
ENV_MUST_AGREE = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
_STORE_PREFIX = "hf_distprof_doctor"
_SYMBOL = {"pass": "✓", "fail": "✗", "skip": "-"}


def _at_least(kind: type, low: float, strict: bool = True) -> Callable[[str], Any]:
    """An argparse ``type``: a ``kind`` above ``low`` (or equal to it, unless ``strict``)."""

    what = "an integer" if kind is int else "a number"
    bound = f"{'>' if strict else '>='} {low:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}") from None
        # NaN compares false with everything and infinity overflows the timers: both are refused.
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text}")
        return value

    return parse


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "doctor",
        help="check a distributed setup (run it under torchrun or accelerate launch)",
        description=(
            "Check ranks, versions, environment, memory, point-to-point links, collectives and clock skew on "
            "every rank; rank 0 prints each check as ✓ or ✗. Every check is bounded by --timeout. Exit status "
            f"0 when no check failed, 1 when one did, 2 on bad arguments. Checks, in order: {', '.join(CHECKS)}."
        ),
    )
    parser.add_argument("--timeout", type=_at_least(float, 0), default=30.0, metavar="SECONDS",
                        help="time allowed to each check, on every rank (default: 30)")
    parser.add_argument("--expect-world-size", type=_at_least(int, 0), default=None, metavar="N",
                        help="world size the init check requires (default: $WORLD_SIZE, 1 without a launcher)")
    parser.add_argument("--min-free-gb", type=_at_least(float, 0, strict=False), default=1.0, metavar="GB",
                        help="device memory (host memory on CPU) each rank must have free (default: 1.0)")
    parser.add_argument("--max-skew-ms", type=_at_least(float, 0), default=500.0, metavar="MS",
                        help="largest clock offset of a rank from rank 0 that passes (default: 500)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="process group backend (default: nccl with CUDA, else gloo)")
    parser.add_argument("--json", metavar="PATH", help="rank 0 also writes the results to PATH")
    return parser


@dataclass(frozen=True)
class Injection:
    """A fault to inject, read from :data:`INJECT_ENV` (tests only)."""

    check: str
    rank: int
    mode: str  # "wrong" or "hang"


def parse_injection(value: str, world: int) -> Injection | None:
    """Parse ``<check>:<rank>[:hang]``; None for an empty value.

    Raises:
        ValueError: The value names a check, rank or mode that does not exist, or a mode the check lacks.
    """
    if not value:
        return None
    parts = value.split(":")
    mode = parts[2] if len(parts) == 3 else "wrong"
    if len(parts) not in (2, 3) or not parts[1].isdigit() or mode not in INJECTABLE:
        raise ValueError(f"{INJECT_ENV}={value!r}: expected <check>:<rank>[:hang]")
    if parts[0] not in INJECTABLE[mode]:
        raise ValueError(f"{INJECT_ENV}={value!r}: mode {mode!r} applies to {', '.join(INJECTABLE[mode])}")
    if int(parts[1]) >= world:
        raise ValueError(f"{INJECT_ENV}={value!r}: rank must be in 0..{world - 1}")
    return Injection(parts[0], int(parts[1]), mode)


def round_robin_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Pair ``n`` ranks so every pair meets once and no rank is in two pairs of one round (circle method).

    Ranks that work through their own pairs in round order cannot deadlock: both sides of every round-k pair
    are done with rounds < k. An odd ``n`` gets one idle rank per round.

    Returns:
        One list of ``(low, high)`` pairs per round; empty for fewer than 2 ranks.
    """
    if n < 2:
        return []
    seats: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [(seats[i], seats[-1 - i]) for i in range(half)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def clock_offset(samples: list[tuple[float, float, float]]) -> tuple[float, float]:
    """NTP-style offset of a peer's clock from ours, from ping-pongs ``(sent, peer_time, received)``.

    The sample with the shortest round trip is the least disturbed by queueing; assuming symmetric paths, the
    peer read its clock halfway through it, so the offset is off by at most half that round trip.

    Returns:
        ``(offset_s, round_trip_s)``: positive offset when the peer's clock is ahead.
    """
    sent, peer_time, received = min(samples, key=lambda s: s[2] - s[0])
    return peer_time - (sent + received) / 2, received - sent


def format_ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'ranks 0-2, 5'``; ``[3]`` -> ``'rank 3'``."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


@dataclass
class Outcome:
    """Rank 0's verdict on one check, as printed and written to ``--json``."""

    name: str
    status: str  # "pass", "fail" or "skip"
    summary: str
    details: list[str] = field(default_factory=list)
    bad_ranks: list[int] = field(default_factory=list)  # answered with a wrong result or an error
    silent_ranks: list[int] = field(default_factory=list)  # no answer before the deadline
    seconds: float = 0.0
    per_rank: dict[str, Any] = field(default_factory=dict)  # each rank's raw result

    def lines(self) -> list[str]:
        """The headline and its indented details."""
        return [f"{_SYMBOL[self.status]} {self.name:<15}{self.summary}", *(f"    {d}" for d in self.details)]


def _judge(ok: bool, summary: str, details: list[str] | None = None, bad: list[int] | None = None) -> Outcome:
    """An outcome without name, timing or silent ranks; :meth:`Doctor._conclude` fills those in."""
    return Outcome("", "pass" if ok else "fail", summary, details or [], sorted(bad or []))


def _describe(exc: BaseException) -> str:
    """One line of an exception: the type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def _by_value(values: dict[int, Any]) -> str:
    """``{0: 'a', 1: 'b', 2: 'a'}`` -> ``"'a' on ranks 0, 2; 'b' on rank 1"`` (absent: None)."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(repr(value), []).append(rank)
    return "; ".join(f"{value} on {format_ranks(ranks)}" for value, ranks in groups.items())


def _differences(maps: dict[int, dict[str, Any]]) -> dict[str, dict[int, Any]]:
    """The keys whose value is not the same on every rank (a missing key counts as None), per rank."""
    keys = sorted({k for m in maps.values() for k in m})
    per_key = {k: {r: m.get(k) for r, m in maps.items()} for k in keys}
    return {k: v for k, v in per_key.items() if len(set(v.values())) > 1}


class _Unreachable(Exception):
    """This rank cannot reach the rendezvous store, so it cannot report to rank 0."""


class _NoVerdict(Exception):
    """Rank 0's verdict on a check did not come in time."""


class _Board:
    """Each rank's result of each check, and rank 0's verdicts, in the launcher's key-value store."""

    def __init__(self, store: Any, rank: int, world: int) -> None:
        from torch.distributed import PrefixStore

        self._store, self._rank, self._world = PrefixStore(_STORE_PREFIX, store), rank, world

    def post(self, check: str, result: dict[str, Any]) -> None:
        """Publish this rank's result of ``check``."""
        self._store.set(f"{check}/{self._rank}", json.dumps(result))

    def _wait(self, keys: list[str], deadline: float) -> bool:
        from torch.distributed import DistError

        remaining = deadline - time.monotonic()
        try:
            self._store.wait(keys, timedelta(seconds=max(remaining, 0.001)))
        except DistError:  # a timeout, or the store's host is gone: either way the keys did not come
            return False
        return True

    def collect(self, check: str, waiting: set[int], deadline: float) -> dict[int, dict[str, Any]]:
        """Wait until every rank in ``waiting`` posted ``check`` or ``deadline`` passed; every result posted."""
        self._wait([f"{check}/{r}" for r in sorted(waiting)], deadline)
        keys = {r: f"{check}/{r}" for r in range(self._world)}
        return {r: json.loads(self._store.get(k)) for r, k in keys.items() if self._store.check([k])}

    def decide(self, check: str, verdict: str) -> None:
        """Rank 0: tell the others how to go on after ``check`` ("go", or why the group is unusable)."""
        self._store.set(f"{check}/verdict", verdict)

    def verdict(self, check: str, deadline: float) -> str:
        """Rank 0's verdict on ``check``.

        Raises:
            _NoVerdict: It did not come before ``deadline``.
        """
        key = f"{check}/verdict"
        if not self._wait([key], deadline):
            raise _NoVerdict(check)
        return self._store.get(key).decode()


class _Watchdog:
    """Ends the process when a check outlives its deadline: the backstop for a call that ignores its timeout."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._armed: tuple[str, float, float] | None = None  # (check, started, deadline)
        threading.Thread(target=self._watch, name="hf-distprof-doctor-watchdog", daemon=True).start()

    def arm(self, check: str, seconds: float) -> None:
        """Give ``check`` ``seconds`` from now (replacing the previous check's deadline)."""
        now = time.monotonic()
        self._armed = (check, now, now + seconds)

    def disarm(self) -> None:
        """Stop watching."""
        self._armed = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            armed = self._armed
            if armed is not None and time.monotonic() > armed[2]:
                print(f"[RANK {self._rank}] hf-distprof doctor: ✗ {armed[0]}: still running "
                      f"{time.monotonic() - armed[1]:.1f} s after it started; exiting", file=sys.stderr, flush=True)
                os._exit(1)


def _hang() -> None:
    """The injected hang: never return (the watchdog, or the launcher, ends the process)."""
    while True:
        time.sleep(60)


class Doctor:
    """One rank's run of the checks; rank 0 also judges them, prints them and writes ``--json``."""

    def __init__(self, args: argparse.Namespace, injection: Injection | None) -> None:
        import torch

        self.args, self.injection, self.timeout = args, injection, float(args.timeout)
        self.launched = "RANK" in os.environ  # torchrun and accelerate launch set it; alone: a world of one
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.expected_world = args.expect_world_size or self.world
        self.backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.device = torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self.store: Any = None
        self._board: _Board | None = None
        self.broken: str | None = None  # why the process group can no longer be trusted
        self.silent: set[int] = set()  # rank 0: ranks that missed a deadline; not waited for again
        self.outcomes: list[Outcome] = []
        self.watchdog = _Watchdog(self.rank)

    @property
    def board(self) -> _Board:
        """The results board, opened by the init check before anything is posted."""
        assert self._board is not None, "the init check opens the board first"
        return self._board

    def injected(self, check: str, mode: str) -> bool:
        """Whether the test-only fault ``mode`` applies to ``check`` on this rank."""
        inj = self.injection
        return inj is not None and (inj.check, inj.rank, inj.mode) == (check, self.rank, mode)

    def clock(self) -> float:
        """Wall-clock time, one hour ahead under the injected clock fault."""
        return time.time() + (3600.0 if self.injected("clock_skew", "wrong") else 0.0)

    def run(self) -> int:
        """Run every check, then leave the process group.

        Returns:
            Rank 0: 0 when no check failed, 1 when one did, 2 when ``--json`` cannot be written. Other ranks:
            0, or 1 when rank 0 could not be heard from.
        """
        if self.rank == 0:
            print(f"hf-distprof doctor: {self.world} rank(s), backend {self.backend}, "
                  f"--timeout {self.timeout:g} s per check", flush=True)
        try:
            for name in CHECKS:
                self._step(name)
            return self._finish() if self.rank == 0 else 0  # before leaving: that can be what hangs
        except _Unreachable as exc:
            print(f"[RANK {self.rank}] hf-distprof doctor: ✗ init: {exc}", file=sys.stderr, flush=True)
            return 1
        except _NoVerdict as exc:
            print(f"[RANK {self.rank}] hf-distprof doctor: ✗ {exc}: no answer from rank 0 within "
                  f"{self.timeout + 2 * GRACE_S:g} s", file=sys.stderr, flush=True)
            return 1
        finally:
            self._leave()

    def _step(self, name: str) -> None:
        start = time.monotonic()
        deadline = start + self.timeout
        self.watchdog.arm(name, self.timeout + 3 * GRACE_S)
        skip = self._skip_reason(name)
        if skip is None:
            if self.injected(name, "hang"):
                _hang()
            result = self._local(name, deadline)  # the init check opens the board
            self.board.post(name, result)
        if self.rank == 0:
            outcome = self._conclude(name, skip, start, deadline + GRACE_S)
            self.outcomes.append(outcome)
            print("\n".join(outcome.lines()), flush=True)
            self.board.decide(name, self.broken or "go")
        else:
            verdict = self.board.verdict(name, deadline + 2 * GRACE_S)
            self.broken = None if verdict == "go" else verdict

    def _skip_reason(self, name: str) -> str | None:
        if name in GROUP_CHECKS and self.broken:
            return f"skipped: {self.broken}"
        if name in ("p2p", "clock_skew") and self.world < 2:
            return "skipped: needs 2+ ranks"
        return None

    def _local(self, name: str, deadline: float) -> dict[str, Any]:
        """This rank's part of ``name``; an error of the process group becomes the result's ``error``."""
        try:
            return _LOCAL[name](self, deadline)
        except (RuntimeError, TimeoutError) as exc:
            return {"error": _describe(exc)}

    def _conclude(self, name: str, skip: str | None, start: float, deadline: float) -> Outcome:
        """Rank 0: gather every rank's result of ``name`` and judge it."""
        if skip is not None:
            return Outcome(name, "skip", skip)
        per_rank = self.board.collect(name, set(range(self.world)) - self.silent, deadline)
        outcome = _JUDGE[name](self, per_rank)
        outcome.name, outcome.seconds = name, round(time.monotonic() - start, 3)
        outcome.per_rank = {str(r): v for r, v in sorted(per_rank.items())}
        silent = sorted(set(range(self.world)) - per_rank.keys())
        if silent:
            outcome.status, outcome.silent_ranks = "fail", silent
            earlier = sorted(self.silent & set(silent))
            outcome.summary += f"; no answer from {format_ranks(silent)}" + (
                f" ({format_ranks(earlier)} silent since an earlier check)" if earlier else
                f" within {self.timeout + GRACE_S:g} s")
            self.silent.update(silent)
        if self.broken is None and (silent or any("error" in v for v in per_rank.values())):
            self.broken = f"{name} failed"
        return outcome

    def _finish(self) -> int:
        """Rank 0: print the summary line and write ``--json``."""
        failed = [o.name for o in self.outcomes if o.status == "fail"]
        skipped = [o.name for o in self.outcomes if o.status == "skip"]
        passed = len(self.outcomes) - len(failed) - len(skipped)
        line = f"hf-distprof doctor: {passed} of {len(CHECKS)} checks passed"
        line += f"; FAILED: {', '.join(failed)}" if failed else ""
        line += f"; skipped: {', '.join(skipped)}" if skipped else ""
        print(line, flush=True)
        if self.args.json:
            from pathlib import Path

            from hf_distprof.paths import atomic_write_text

            report = {"ok": not failed, "world_size": self.world, "backend": self.backend,
                      "timeout_s": self.timeout, "failed": failed, "checks": [asdict(o) for o in self.outcomes]}
            try:
                atomic_write_text(Path(self.args.json), json.dumps(report, indent=2) + "\n")
            except OSError as exc:
                print(f"hf-distprof doctor: --json {self.args.json}: {exc.strerror or exc}", file=sys.stderr)
                return 2
        return 1 if failed else 0

    def _leave(self) -> None:
        import torch.distributed as dist

        self.watchdog.arm("destroy_process_group", self.timeout + GRACE_S)
        if dist.is_initialized():
            dist.destroy_process_group()
        self.watchdog.disarm()

    def open_store(self) -> None:
        """Reach the launcher's store (alone: an in-process one) and the results board on it.

        Raises:
            _Unreachable: The store cannot be reached within ``--timeout``.
        """
        from torch.distributed import HashStore
        from torch.distributed.rendezvous import rendezvous

        if self.launched:
            try:
                self.store, _, _ = next(rendezvous("env://", timeout=timedelta(seconds=self.timeout)))
            except (ValueError, RuntimeError) as exc:
                where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
                raise _Unreachable(f"cannot reach the rendezvous store at {where}: {_describe(exc)}") from exc
        else:
            self.store = HashStore()
        self._board = _Board(self.store, self.rank, self.world)

    def init_group(self) -> None:
        """``init_process_group`` over the store, bounded by the group's timeout."""
        import torch
        import torch.distributed as dist

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # NCCL's own watchdog tears the process down when a collective outlives the group's timeout: it gets
        # more time than a check, so that rank 0 has reported the stuck check first. Gloo just fails the
        # collective, which frees its worker thread for destroy_process_group.
        slack = 4 * GRACE_S if self.backend == "nccl" else 0.0
        dist.init_process_group(self.backend, store=dist.PrefixStore("default_pg", self.store), rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=self.timeout + slack),
                                device_id=self.device if self.device.type == "cuda" else None)

    def full(self, value: float, numel: int = PAYLOAD_NUMEL) -> Any:
        """A float32 tensor of ``value`` on this rank's device."""
        import torch

        return torch.full((numel,), float(value), device=self.device)

    def wait(self, work: Any, deadline: float) -> None:
        """Wait for an asynchronous operation until ``deadline``, on the device too.

        Raises:
            TimeoutError: It did not finish in time.
            RuntimeError: The backend reported another failure.
        """
        import torch

        late = TimeoutError(f"not finished within --timeout {self.timeout:g} s")
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0 or work.wait(timeout=timedelta(seconds=remaining)) is False:
                raise late
        except RuntimeError as exc:  # gloo says "Operation timed out!", or names the op it timed out in
            if "timed out" in str(exc).lower():
                raise late from exc
            raise
        if self.device.type == "cuda":  # the CPU-side wait only orders streams: poll, never block unbounded
            done = torch.cuda.Event()
            done.record()
            while not done.query():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not finished on the device within --timeout {self.timeout:g} s")
                time.sleep(0.0005)


# ---- what each rank does for each check (returns a JSON-ready dict) ----

def _local_init(doc: Doctor, deadline: float) -> dict[str, Any]:
    import socket

    doc.open_store()
    started = time.monotonic()
    result: dict[str, Any] = {"host": socket.gethostname(), "local_rank": doc.local_rank, "pid": os.getpid(),
                              "device": str(doc.device)}
    try:
        doc.init_group()
    except (RuntimeError, ValueError) as exc:
        result["error"] = _describe(exc)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _local_versions(doc: Doctor, deadline: float) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import torch.distributed as dist

    result = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "none",
              "nccl": "none"}
    if dist.is_nccl_available() and torch.cuda.is_available():
        result["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for package in ("transformers", "accelerate"):
        try:
            result[package] = version(package)
        except PackageNotFoundError:
            result[package] = "not installed"
    return result


def _local_environment(doc: Doctor, deadline: float) -> dict[str, Any]:
    return {"env": {k: v for k, v in sorted(os.environ.items()) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}}


def _local_memory(doc: Doctor, deadline: float) -> dict[str, Any]:
    import psutil
    import torch

    if doc.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(doc.device)
        kind = f"{doc.device} memory"
    else:
        vm = psutil.virtual_memory()
        free, total, kind = vm.available, vm.total, "host memory"
    return {"kind": kind, "free_gb": round(free / 2**30, 3), "total_gb": round(total / 2**30, 3)}


def _mismatch(got: Any, expected: Any) -> str | None:
    """None when the tensors are equal, else where and how they differ."""
    wrong = (got != expected).nonzero()
    if len(wrong) == 0:
        return None
    i = int(wrong[0])
    return f"element {i} is {got[i].item():g}, expected {expected[i].item():g} ({len(wrong)} of {got.numel()} wrong)"


def _exchange(doc: Doctor, peer: int, deadline: float) -> dict[str, Any]:
    """1 MiB each way with ``peer``: the lower rank sends first; its round trip is the pair's time."""
    import torch.distributed as dist

    outgoing, incoming = doc.full(doc.rank * doc.world + peer), doc.full(-1)
    steps = [(dist.isend, outgoing), (dist.irecv, incoming)]
    started = time.perf_counter()
    try:
        for op, buf in steps if doc.rank < peer else steps[::-1]:
            doc.wait(op(buf, peer), deadline)
    except (RuntimeError, TimeoutError) as exc:
        return {"peer": peer, "error": _describe(exc)}
    result: dict[str, Any] = {"peer": peer, "ms": round((time.perf_counter() - started) * 1e3, 3)}
    if doc.injected("p2p", "wrong"):
        incoming.add_(1)
    wrong = _mismatch(incoming, doc.full(peer * doc.world + doc.rank))
    if wrong:
        result["wrong"] = f"from rank {peer}: {wrong}"
    return result


def _local_p2p(doc: Doctor, deadline: float) -> dict[str, Any]:
    pairs = [pair for rnd in round_robin_rounds(doc.world) for pair in rnd if doc.rank in pair]
    exchanges = [_exchange(doc, b if a == doc.rank else a, deadline) for a, b in pairs]
    errors = [f"with rank {x['peer']}: {x['error']}" for x in exchanges if "error" in x]
    return {"pairs": exchanges, **({"error": errors[0]} if errors else {})}


# (start the operation, its output, the output it must produce); output None: nothing to verify
_Spec = tuple[Callable[[], Any], Any, Any]


def _spec_all_reduce(doc: Doctor) -> _Spec:
    import torch.distributed as dist

    out, expected = doc.full(0), doc.full(doc.world * (doc.world + 1) / 2)
    return lambda: dist.all_reduce(out.fill_(doc.rank + 1), async_op=True), out, expected


def _blocks(doc: Doctor, scale: float) -> tuple[Any, int]:
    """``scale * (i + 1)`` in block i of ``world`` blocks of 1 MiB in all, and the block size."""
    import torch

    block = max(1, PAYLOAD_NUMEL // doc.world)
    values = torch.arange(1, doc.world + 1, dtype=torch.float32, device=doc.device) * scale
    return values.repeat_interleave(block), block


def _spec_all_gather(doc: Doctor) -> _Spec:
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    expected, block = _blocks(doc, 1.0)
    out = doc.full(0, expected.numel())
    return lambda: gather(out, doc.full(doc.rank + 1, block), async_op=True), out, expected


def _spec_reduce_scatter(doc: Doctor) -> _Spec:
    import torch.distributed as dist

    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # as above
    contribution, block = _blocks(doc, doc.rank + 1.0)
    out = doc.full(0, block)
    expected = doc.full((doc.rank + 1) * doc.world * (doc.world + 1) / 2, block)
    return lambda: reduce_scatter(out, contribution, async_op=True), out, expected


def _spec_broadcast(doc: Doctor) -> _Spec:
    import torch
    import torch.distributed as dist

    pattern = (torch.arange(PAYLOAD_NUMEL, device=doc.device) % 251).float()
    out = doc.full(0)
    start = pattern if doc.rank == 0 else doc.full(0)
    return lambda: dist.broadcast(out.copy_(start), 0, async_op=True), out, pattern


def _spec_barrier(doc: Doctor) -> _Spec:
    import torch.distributed as dist

    return lambda: dist.barrier(async_op=True), None, None


_SPECS: dict[str, Callable[[Doctor], _Spec]] = {
    "all_reduce": _spec_all_reduce, "all_gather": _spec_all_gather, "reduce_scatter": _spec_reduce_scatter,
    "broadcast": _spec_broadcast, "barrier": _spec_barrier}
# What a correct result is, in the ✓ line.
_PROMISE = {"all_reduce": "sum of rank+1 = n(n+1)/2", "all_gather": "block i = i+1",
            "reduce_scatter": "block r = (r+1)·n(n+1)/2", "broadcast": "rank 0's pattern everywhere",
            "barrier": "every rank arrived"}


def _local_collective(doc: Doctor, deadline: float, name: str) -> dict[str, Any]:
    """One untimed then :data:`REPEATS` timed runs of a collective; the last result verified."""
    start, out, expected = _SPECS[name](doc)
    times = []
    for run in range(1 + REPEATS):
        started = time.perf_counter()
        try:
            work = start()
        except (RuntimeError, NotImplementedError) as exc:
            if run == 0 and "support" in str(exc).lower():  # refused up front, on every rank alike
                return {"unsupported": _describe(exc)}
            raise
        doc.wait(work, deadline)
        times.append(round((time.perf_counter() - started) * 1e3, 3))
    result: dict[str, Any] = {"ms": times[1:]}
    if out is not None:
        if doc.injected(name, "wrong"):
            out.add_(1)
        wrong = _mismatch(out, expected)
        if wrong:
            result["wrong"] = wrong
    return result


def _ping(doc: Doctor, peer: int, deadline: float) -> tuple[float, float, float]:
    import torch
    import torch.distributed as dist

    buf = torch.zeros(1, dtype=torch.float64, device=doc.device)
    sent = doc.clock()
    doc.wait(dist.isend(buf, peer), deadline)
    doc.wait(dist.irecv(buf, peer), deadline)
    return sent, float(buf.item()), doc.clock()


def _local_clock_skew(doc: Doctor, deadline: float) -> dict[str, Any]:
    """Rank 0 ping-pongs each rank in turn; the others answer with their clock."""
    import torch
    import torch.distributed as dist

    if doc.rank != 0:
        buf = torch.zeros(1, dtype=torch.float64, device=doc.device)
        for _ in range(SKEW_SAMPLES):
            doc.wait(dist.irecv(buf, 0), deadline)
            doc.wait(dist.isend(buf.fill_(doc.clock()), 0), deadline)
        return {}
    peers: list[dict[str, float]] = []
    for peer in range(1, doc.world):
        try:
            offset, rtt = clock_offset([_ping(doc, peer, deadline) for _ in range(SKEW_SAMPLES)])
        except (RuntimeError, TimeoutError) as exc:
            return {"peers": peers, "error": f"rank {peer}: {_describe(exc)}"}
        peers.append({"rank": peer, "offset_ms": round(offset * 1e3, 3), "rtt_ms": round(rtt * 1e3, 3)})
    return {"peers": peers}


_LOCAL: dict[str, Callable[[Doctor, float], dict[str, Any]]] = {
    "init": _local_init, "versions": _local_versions, "environment": _local_environment, "memory": _local_memory,
    "p2p": _local_p2p, "clock_skew": _local_clock_skew,
    **{name: functools.partial(_local_collective, name=name) for name in _SPECS}}


# ---- rank 0: judging every rank's results ----

def _judge_init(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    failed = {r: v["error"] for r, v in per_rank.items() if "error" in v}
    hosts: dict[str, list[str]] = {}
    for r, v in sorted(per_rank.items()):
        hosts.setdefault(v["host"], []).append(f"{r} (local {v['local_rank']})")
    details = [f"{host}: rank {', '.join(ranks)}" for host, ranks in hosts.items()]
    details += [f"rank {r}: {err}" for r, err in sorted(failed.items())]
    slowest = max(v["seconds"] for v in per_rank.values())
    summary = (f"{len(per_rank) - len(failed)}/{doc.world} ranks initialised, world size {doc.world} (expected "
               f"{doc.expected_world}), backend {doc.backend}, {slowest:.2f} s")
    return _judge(not failed and doc.world == doc.expected_world, summary, details, list(failed))


def _odd_ones(differ: dict[str, dict[int, Any]]) -> list[int]:
    """Ranks whose value of some key differs from the lowest rank's."""
    return sorted({r for values in differ.values() for r, v in values.items() if v != values[min(values)]})


def _judge_versions(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    differ = _differences(per_rank)
    if differ:
        details = [f"{k}: {_by_value(v)}" for k, v in differ.items()]
        return _judge(False, f"ranks disagree on {', '.join(differ)}", details, _odd_ones(differ))
    versions = ", ".join(f"{k} {v}" for k, v in per_rank[min(per_rank)].items())
    return _judge(True, f"same on {format_ranks(list(per_rank))}: {versions}")


def _judge_environment(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    envs = {r: v["env"] for r, v in per_rank.items()}
    differ = _differences(envs)
    same = {k: v for k, v in sorted(envs[min(envs)].items()) if k not in differ}
    details = [f"same on {format_ranks(list(envs))}: " + (" ".join(f"{k}={v}" for k, v in same.items()) or "(none)")]
    details += [f"{k}: {_by_value(v)}" for k, v in differ.items()]
    conflicts = {k: differ[k] for k in ENV_MUST_AGREE if k in differ}
    if conflicts:
        return _judge(False, f"ranks disagree on {', '.join(conflicts)}", details, _odd_ones(conflicts))
    agreed = ", ".join(f"{k}={same.get(k, '(unset)')}" for k in ENV_MUST_AGREE)
    return _judge(True, f"{agreed} on {format_ranks(list(envs))}", details)


def _judge_memory(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    limit = doc.args.min_free_gb
    rank, least = min(per_rank.items(), key=lambda kv: kv[1]["free_gb"])
    low = sorted(r for r, v in per_rank.items() if v["free_gb"] < limit)
    summary = (f"least free: {least['free_gb']:.2f} of {least['total_gb']:.2f} GB {least['kind']} on rank {rank} "
               f"(--min-free-gb {limit:g})")
    return _judge(not low, summary, [f"rank {r}: {per_rank[r]['free_gb']:.2f} GB free" for r in low], low)


def _judge_p2p(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    rounds = round_robin_rounds(doc.world)
    problems: dict[tuple[int, int], list[tuple[int, str]]] = {}
    round_trips: dict[tuple[int, int], float] = {}
    for rank, result in sorted(per_rank.items()):
        for x in result["pairs"]:
            pair = (min(rank, x["peer"]), max(rank, x["peer"]))
            trouble = x.get("error") or x.get("wrong")
            if trouble:
                problems.setdefault(pair, []).append((rank, trouble))
            elif rank < x["peer"]:
                round_trips[pair] = x["ms"]
    n_pairs = sum(map(len, rounds))
    summary = f"{n_pairs} pair(s) in {len(rounds)} round(s), 1 MiB each way"
    if round_trips:
        a, b = max(round_trips, key=round_trips.__getitem__)
        summary += (f"; round trip median {statistics.median(round_trips.values()):.2f} ms, slowest {a}<->{b} "
                    f"{round_trips[a, b]:.2f} ms")
    if not problems:
        return _judge(True, summary)
    failed = ", ".join(f"{a}<->{b}" for a, b in sorted(problems))
    reports = [report for _, reports in sorted(problems.items()) for report in reports]
    details = [f"rank {rank}: {trouble}" for rank, trouble in reports]
    bad = sorted({rank for rank, _ in reports})
    return _judge(False, f"{len(problems)} of {n_pairs} pair(s) failed: {failed}; {summary}", details, bad)


def _judge_collective(doc: Doctor, per_rank: dict[int, dict[str, Any]], name: str) -> Outcome:
    if all("unsupported" in v for v in per_rank.values()):
        return Outcome(name, "skip", f"not supported by {doc.backend}", [per_rank[min(per_rank)]["unsupported"]])
    wrong = {r: v["wrong"] for r, v in per_rank.items() if "wrong" in v}
    errors = {r: v.get("error") or v["unsupported"] for r, v in per_rank.items() if "error" in v or "unsupported" in v}
    medians = {r: statistics.median(v["ms"]) for r, v in per_rank.items() if v.get("ms")}
    timing = ""
    if medians:
        slow = max(medians, key=medians.__getitem__)
        size = "" if name == "barrier" else " of 1 MiB"
        timing = (f"median {statistics.median(medians.values()):.2f} ms{size} over {REPEATS} runs, slowest rank "
                  f"{slow} {medians[slow]:.2f} ms")
    if not wrong and not errors:
        return _judge(True, f"{_PROMISE[name]} on {len(per_rank)} rank(s); {timing}")
    parts = [f"wrong result on {format_ranks(list(wrong))}"] if wrong else []
    parts += [f"error on {format_ranks(list(errors))}"] if errors else []
    details = [f"rank {r}: {msg}" for r, msg in sorted({**wrong, **errors}.items())]
    return _judge(False, "; ".join(parts + ([timing] if timing else [])), details, [*wrong, *errors])


def _judge_clock_skew(doc: Doctor, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    limit = doc.args.max_skew_ms
    peers = per_rank.get(0, {}).get("peers", [])
    errors = {r: v["error"] for r, v in per_rank.items() if "error" in v}
    far = [p for p in peers if abs(p["offset_ms"]) > limit]
    summary = "no offset measured"
    if peers:
        worst = max(peers, key=lambda p: abs(p["offset_ms"]))
        summary = (f"largest offset from rank 0: {worst['offset_ms']:+.2f} ms on rank {worst['rank']} "
                   f"(± {worst['rtt_ms'] / 2:.2f} ms, half the best round trip); --max-skew-ms {limit:g}")
    details = [f"rank {p['rank']}: {p['offset_ms']:+.1f} ms" for p in far]
    details += [f"rank {r}: {err}" for r, err in sorted(errors.items())]
    return _judge(not far and not errors, summary, details, [p["rank"] for p in far] + list(errors))


_JUDGE: dict[str, Callable[[Doctor, dict[int, dict[str, Any]]], Outcome]] = {
    "init": _judge_init, "versions": _judge_versions, "environment": _judge_environment, "memory": _judge_memory,
    "p2p": _judge_p2p, "clock_skew": _judge_clock_skew,
    **{name: functools.partial(_judge_collective, name=name) for name in _SPECS}}


def run(args: argparse.Namespace) -> int:
    """Run the checks on this rank (every rank of the launch runs this).

    Returns:
        The exit status: on rank 0, 0 when no check failed, 1 when one did, 2 on a bad
        :data:`INJECT_ENV` or an unwritable ``--json``; on other ranks 0 unless rank 0 went silent.
    """
    try:
        injection = parse_injection(os.environ.get(INJECT_ENV, ""), int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as exc:
        print(f"hf-distprof doctor: error: {exc}", file=sys.stderr)
        return 2
    return Doctor(args, injection).run()
