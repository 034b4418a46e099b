"""The run: every rank works through the checks in order, bounded, and rank 0 judges, prints and writes them.

Nothing may hang. Each rank posts its result of a check to the board (:mod:`hf_distprof.doctor.board`); rank 0
waits for them until the check's deadline (``--timeout`` after it started, plus :data:`GRACE_S`), names the
ranks whose result never came, then posts a verdict that the other ranks wait for before the next check. Every
collective is started asynchronously and waited for with the time left to the deadline. After a rank went
silent or a collective failed, the group is in an unknown state, so the later checks that use it are skipped.
A watchdog thread on every rank is the backstop for a call that ignores its timeout: it prints the check's name
and ends the process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from hf_distprof.core.files import atomic_write_text
from hf_distprof.core.text import format_ranks
from hf_distprof.doctor.board import Board, NoVerdict, Unreachable
from hf_distprof.doctor.checks import (
    CHECKS,
    GROUP_CHECKS,
    INJECT_ENV,
    INJECTABLE,
    LOCAL,
    PAYLOAD_NUMEL,
    describe,
)
from hf_distprof.doctor.judge import JUDGE, Outcome

GRACE_S = 2.0  # how much longer than --timeout rank 0 waits for results, the others for a verdict


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


class Watchdog:
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
        self._board: Board | None = None
        self.broken: str | None = None  # why the process group can no longer be trusted
        self.silent: set[int] = set()  # rank 0: ranks that missed a deadline; not waited for again
        self.outcomes: list[Outcome] = []
        self.watchdog = Watchdog(self.rank)

    @property
    def board(self) -> Board:
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
        except Unreachable as exc:
            print(f"[RANK {self.rank}] hf-distprof doctor: ✗ init: {exc}", file=sys.stderr, flush=True)
            return 1
        except NoVerdict as exc:
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
            return LOCAL[name](self, deadline)
        except (RuntimeError, TimeoutError) as exc:
            return {"error": describe(exc)}

    def _conclude(self, name: str, skip: str | None, start: float, deadline: float) -> Outcome:
        """Rank 0: gather every rank's result of ``name`` and judge it."""
        if skip is not None:
            return Outcome(name, "skip", skip)
        per_rank = self.board.collect(name, set(range(self.world)) - self.silent, deadline)
        outcome = JUDGE[name](self, per_rank)
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
            Unreachable: The store cannot be reached within ``--timeout``.
        """
        from torch.distributed import HashStore
        from torch.distributed.rendezvous import rendezvous

        if self.launched:
            try:
                self.store, _, _ = next(rendezvous("env://", timeout=timedelta(seconds=self.timeout)))
            except (ValueError, RuntimeError) as exc:
                where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
                raise Unreachable(f"cannot reach the rendezvous store at {where}: {describe(exc)}") from exc
        else:
            self.store = HashStore()
        self._board = Board(self.store, self.rank, self.world)

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
        except RuntimeError as exc:
            if timed_out(exc):
                if self.backend == "nccl":  # its watchdog aborts the communicators: the checks after this one fail too
                    late = TimeoutError(f"{late}; NCCL aborted its communicators, so the checks after this one cannot "
                                        "run on this process group")
                raise late from exc
            raise
        # A wait with a timeout blocks this thread until the work is done (NCCL's too); the device's event is polled in
        # case the backend returned before the device finished.
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            while not done.query():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not finished on the device within --timeout {self.timeout:g} s")
                time.sleep(0.0005)


def timed_out(exc: BaseException) -> bool:
    """Whether a backend's error is its timeout: gloo says "Operation timed out!" (or names the op it timed out in),
    NCCL's watchdog "Watchdog caught collective operation timeout: ... ran for N milliseconds before timing out"."""
    text = str(exc).lower()
    return any(word in text for word in ("timed out", "timeout", "timing out"))


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
    problem = _before_the_checks(args)
    if problem is not None:  # said before the checks run, not after them (their minutes lost with the answer)
        tag = f"[RANK {os.environ['RANK']}] " if "RANK" in os.environ else ""
        print(f"hf-distprof doctor: error: {tag}{problem}", file=sys.stderr)
        return 2
    return Doctor(args, injection).run()


def _before_the_checks(args: argparse.Namespace) -> str | None:
    """What makes the asked-for run impossible, said before any check: nccl without a CUDA device (it failed with a
    traceback in the init check), on rank 0 a ``--json`` path that cannot be written (found only after every check
    ran)."""
    import torch

    if args.backend == "nccl" and not torch.cuda.is_available():
        return "--backend nccl needs CUDA GPUs, and this machine has none (torch sees no CUDA device): use gloo"
    if args.json and int(os.environ.get("RANK", "0")) == 0:  # (rank 0 writes it: another node may not have the folder)
        from pathlib import Path

        out = Path(args.json)
        why = "Is a directory" if out.is_dir() else None if out.parent.is_dir() else "No such directory"
        if why is not None:
            return f"--json {args.json}: {why}"
    return None
