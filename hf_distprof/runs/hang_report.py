"""``hf-distprof hang-report``: which rank the others wait for, from the watchdog's per-rank stack dumps, and which rank
died, of what, where.

Reads ``hang_rank{R}_{host}.txt`` (written by ``--hang-timeout``), the GIL-free backstop dumps
(``hang_rank{R}_{host}.faulthandler.txt``) for ranks without one, NCCL flight-recorder dumps
(``flight_recorder_rank{R}_{host}.pkl``) where present, the crash files (``rank{R}_crash.txt``: every thread's
stack when a rank died of a fatal signal, :mod:`hf_distprof.crash`), the exception files (``rank{R}_exception.txt``:
the traceback of an uncaught exception that ended a rank) and the stop files (``rank{R}_stopped.txt``: when a signal
stopped a rank, and where it found it). No torch import.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_distprof.core.files import get_hostname, short_host
from hf_distprof.core.names import CRASH_NAME, MANIFEST_PART_NAME
from hf_distprof.runs.flight_recorder import Recorder, parse_recorder, recorder_lines

_THREAD = re.compile(r"^Thread (?P<name>.*) \(ident (?P<ident>\d+)(?P<main>, main)?\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.*)$')
# faulthandler's format: 'Current thread 0x... (most recent call first):' / '  File "f", line N in func'
_FH_THREAD = re.compile(
    r"^(?:Current thread|Thread) (?P<ident>0x[0-9a-f]+)(?: \[(?P<name>.*)\])? \(most recent call first\):$"
)
_FH_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_RANK = re.compile(r"^hang_rank(?P<rank>\d+)_(?P<host>.+?)(?P<backstop>\.faulthandler)?\.txt$")
_CRASH = re.compile(r"^rank(?P<rank>\d+)_crash\.txt$")
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+?)\s*$")
_RAISED = re.compile(r"^rank(?P<rank>\d+)_exception\.txt$")
_RAISED_HEAD = re.compile(r"^hf_distprof: rank (?P<rank>\d+) on host (?P<host>\S+) ended by an uncaught exception at "
                         r"(?P<stamp>\S+) \(unix (?P<unix>[0-9.]+)\)$")
_STOPPED = re.compile(r"^rank(?P<rank>\d+)_stopped\.txt$")
_STOPPED_HEAD = re.compile(r"^hf_distprof: rank (?P<rank>\d+) on host (?P<host>\S+) stopped by (?P<signal>\S+) at "
                           r"(?P<stamp>\S+) \(unix (?P<unix>[0-9.]+)\)$")
SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Floating point exception": "SIGFPE",
           "Bus error": "SIGBUS", "Illegal instruction": "SIGILL"}
"""faulthandler's words for each fatal signal it handles."""

# Frames that mean "inside a collective, or waiting for one": c10d calls, and autograd's backward, where
# DDP's reducer waits for its gradient all-reduce (and FSDP for its reduce-scatter).
COLLECTIVE_FILES = ("torch/distributed/", "torch/nn/parallel/distributed.py")
COLLECTIVE_FUNCS = ("_engine_run_backward", "run_backward")
# Library code: the innermost frame outside these is "user code" (hf_distprof's own frames too: an editable install's
# are outside site-packages, and a stop that found a rank in our export named our line).
SITE_PARTS = ("site-packages/", "dist-packages/")
STDLIB_PARTS = ("/lib/python3", "<frozen ")
LIBRARY_PARTS = (*SITE_PARTS, *STDLIB_PARTS)
# Frames that only pass a call on (torch's op dispatch, decorators): a functional collective's wait_tensor has torch's
# _ops.py innermost, below torch/distributed/_functional_collectives.py (the review).
DISPATCH_PARTS = ("torch/_ops.py", "torch/utils/_contextlib.py", "torch/_compile.py", "torch/_dynamo/eval_frame.py")
# hf_distprof's own code (an editable install's is outside site-packages): the package's folder followed by one of its
# entries, not a checkout that happens to be named hf_distprof (its scripts are the user's), nor the demo's recipe/.
_OURS = re.compile(r"/hf_distprof/(?:(?:analysis|autorun|callbacks|cli|collectives|core|doctor|runs|timing|trackers)/|"
                   r"(?:__init__|config|crash|dist|logs|paths|tensorboard)\.py$)")


@dataclass
class Frame:
    file: str
    line: int
    func: str
    code: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line} in {self.func}"
        return f"{where}: {self.code}" if self.code else where


@dataclass
class RankDump:
    """One rank's dump: its header and its threads' stacks (innermost frame last)."""

    rank: int
    host: str
    path: Path
    header: dict[str, str] = field(default_factory=dict)
    threads: dict[str, list[Frame]] = field(default_factory=dict)
    main: str | None = None
    backstop: bool = False

    @property
    def main_stack(self) -> list[Frame]:
        if self.main is not None:
            return self.threads.get(self.main, [])
        return next(iter(self.threads.values()), [])

    @property
    def in_collective(self) -> Frame | None:
        """The main thread's innermost frame, when it shows it inside (or waiting for) a collective; None if not.

        Only the innermost frame outside the standard library decides (a wait in ``threading`` under a c10d call is
        the call's): DDP's forward wrapper is on the stack for the whole forward, so a rank stuck in its model's
        compute under it is not in a collective (trial U: it read as one, and the report looked for a mismatch)."""
        for frame in reversed(self.main_stack):
            path = frame.file.replace("\\", "/")
            if (any(part in path for part in STDLIB_PARTS) and not any(part in path for part in SITE_PARTS)) or any(
                    part in path for part in DISPATCH_PARTS):
                continue
            return frame if any(part in path for part in COLLECTIVE_FILES) or frame.func in COLLECTIVE_FUNCS else None
        return None

    @property
    def user_frame(self) -> Frame | None:
        """The main thread's innermost frame of user code (not a library, not the standard library)."""
        for frame in reversed(self.main_stack):
            path = frame.file.replace("\\", "/")
            # (The demo's training code, hf_distprof.recipe, is the user's side of the line, installed or not.)
            library = any(part in path for part in LIBRARY_PARTS) or _OURS.search(path) is not None
            if "/hf_distprof/recipe/" in path or not library:
                return frame
        return self.main_stack[-1] if self.main_stack else None


@dataclass
class Crash:
    """One rank's crash file: what killed it and every thread's stack then (the thread that got the signal first)."""

    rank: int
    path: Path
    fatal: str
    """faulthandler's words ("Segmentation fault", "Aborted" ...)."""
    dump: RankDump

    @property
    def signal(self) -> str:
        return SIGNALS.get(self.fatal, "?")


@dataclass
class Raised:
    """One rank's exception file: the uncaught exception that ended it, when, and the traceback's frames."""

    rank: int
    path: Path
    exception: str
    """Its last line: ``RuntimeError: boom``."""
    stamp: str
    unix: float
    dump: RankDump


@dataclass
class Stopped:
    """One rank's stop file: the signal whose default action ended it, when, and every thread's stack then."""

    rank: int
    path: Path
    signal: str
    """``SIGTERM``, ``SIGINT``."""
    stamp: str
    unix: float
    dump: RankDump


@dataclass
class HangReport:
    folder: Path
    dumps: dict[int, RankDump]
    recorders: dict[int, Recorder]
    world_size: int | None
    culprits: list[int]
    lines: list[str]
    crashes: dict[int, Crash] = field(default_factory=dict)
    raised: dict[int, Raised] = field(default_factory=dict)
    silent: dict[int, str] = field(default_factory=dict)
    """Ranks that ended without a word (:func:`silent_ranks`): rank -> ``killed`` or ``stopped``."""
    stopped: dict[int, Stopped] = field(default_factory=dict)
    """Ranks stopped by a signal that left a stop file (when, by which signal, where each thread was)."""

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _read(path: Path, name: re.Pattern[str], what: str) -> tuple[re.Match[str], str]:
    """The file's name matched against ``name`` and its text; ValueError naming the file when it is not ``what``
    (its name says) or cannot be read."""
    match = name.match(path.name)
    if match is None:
        raise ValueError(f"{path}: not {what}")
    try:
        return match, path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror or err}") from None


def parse_dump(path: Path) -> RankDump:
    """Parse one ``hang_rank{R}_{host}.txt`` (or its ``.faulthandler.txt`` backstop).

    Raises:
        ValueError: The file is not such a dump (the message names it).
    """
    match, text = _read(path, _RANK, "a hang dump (expected hang_rank<R>_<host>.txt)")
    dump = RankDump(int(match["rank"]), match["host"], path, backstop=bool(match["backstop"]))
    lines = text.splitlines()
    if dump.backstop:
        _parse_faulthandler(lines, dump)
        return dump
    if not lines or lines[0] != "hf_distprof hang dump":
        raise ValueError(f"{path}: not a hang dump written by hf_distprof (first line {lines[:1]})")
    _parse_threads(lines, dump)
    return dump


def _parse_threads(lines: list[str], dump: RankDump) -> None:
    """The header's ``key: value`` lines after the first line, then the ``Thread <name> (ident N[, main]):`` sections
    (:func:`hf_distprof.core.stacks.format_stacks`) into ``dump``."""
    current: list[Frame] | None = None
    for i, line in enumerate(lines[1:], start=1):
        if current is None and ": " in line and not line.startswith("Thread "):
            key, value = line.split(": ", 1)
            dump.header[key] = value
            continue
        thread = _THREAD.match(line)
        if thread is not None:
            name = f"{thread['name']} ({thread['ident']})"
            current = dump.threads.setdefault(name, [])
            if thread["main"]:
                dump.main = name
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None:
            code = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
            current.append(Frame(frame["file"], int(frame["line"]), frame["func"], code))


def parse_crash(path: Path) -> Crash | None:
    """One ``rank{R}_crash.txt``; None when it is empty (a rank killed outright, SIGKILL, writes nothing).

    Raises:
        ValueError: The file is not such a file, or holds no fatal error (the message names it).
    """
    match, text = _read(path, _CRASH, "a crash file (expected rank<R>_crash.txt)")
    if not text.strip():
        return None
    lines = text.splitlines()
    fatal = next((m["what"] for m in map(_FATAL.match, lines) if m is not None), None)
    if fatal is None:
        raise ValueError(f"{path}: no 'Fatal Python error' line: not written by faulthandler on a crash")
    dump = RankDump(int(match["rank"]), "", path, backstop=True)
    _parse_faulthandler(lines, dump, current_first=True)
    return Crash(int(match["rank"]), path, fatal, dump)


def parse_exception(path: Path) -> Raised | None:
    """One ``rank{R}_exception.txt``; None when it is empty.

    Raises:
        ValueError: The file is not such a file (the message names it).
    """
    read = _headed(path, _RAISED, "an exception file (expected rank<R>_exception.txt)", _RAISED_HEAD,
                   "'hf_distprof: rank R ... ended by an uncaught exception'")
    if read is None:
        return None
    match, lines, head = read
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    frames: list[Frame] = []
    for line in lines[starts[-1] + 1 if starts else 1:]:  # the last exception's traceback (a chain ends with it)
        frame = _FRAME.match(line)
        if frame is not None:
            frames.append(Frame(frame["file"], int(frame["line"]), frame["func"]))
        elif frames and line.startswith("    ") and not frames[-1].code and line.strip(" ^~"):
            frames[-1].code = line.strip()
    exception = next((line for line in reversed(lines) if line.strip() and not line.startswith(" ")), "?")
    dump = RankDump(int(match["rank"]), head["host"], path, threads={"MainThread": frames}, main="MainThread")
    return Raised(int(match["rank"]), path, exception, head["stamp"], float(head["unix"]), dump)


def _headed(path: Path, name: re.Pattern[str], what: str, head: re.Pattern[str], words: str
            ) -> tuple[re.Match[str], list[str], re.Match[str]] | None:
    """An exception or stop file's name match, its lines and its first line's match; None when it is empty.

    Raises:
        ValueError: The file is not ``what``, or its first line is not ``words`` (the message names it).
    """
    match, text = _read(path, name, what)
    if not text.strip():
        return None
    lines = text.splitlines()
    first = head.match(lines[0])
    if first is None:
        raise ValueError(f"{path}: no {words} first line")
    return match, lines, first


def parse_stopped(path: Path) -> Stopped | None:
    """One ``rank{R}_stopped.txt``; None when it is empty.

    Raises:
        ValueError: The file is not such a file (the message names it).
    """
    read = _headed(path, _STOPPED, "a stop file (expected rank<R>_stopped.txt)", _STOPPED_HEAD,
                   "'hf_distprof: rank R ... stopped by SIGNAL at ...'")
    if read is None:
        return None
    match, lines, head = read
    dump = RankDump(int(match["rank"]), head["host"], path)
    _parse_threads(lines, dump)
    return Stopped(int(match["rank"]), path, head["signal"], head["stamp"], float(head["unix"]), dump)


def _parse_faulthandler(lines: list[str], dump: RankDump, current_first: bool = False) -> None:
    """faulthandler lists frames most recent first; stored innermost last like the others."""
    current: list[Frame] | None = None
    for line in lines:
        thread = _FH_THREAD.match(line)
        if thread is not None:
            name = f"{thread['name'] or 'thread'} ({thread['ident']})"
            current = dump.threads.setdefault(name, [])
            current_thread = line.startswith("Current thread")
            if current_first and current_thread or dump.main is None and (thread["name"] == "MainThread"
                                                                           or current_thread):
                dump.main = name  # on a crash: the thread that got the signal
            continue
        frame = _FH_FRAME.match(line)
        if frame is not None and current is not None:
            current.insert(0, Frame(frame["file"], int(frame["line"]), frame["func"]))


def _empty_backstop(path: Path) -> bool:
    """Whether ``path`` is a faulthandler backstop that was never written (empty): no dump, as an empty crash file is
    no crash (a trial: a rank that segfaulted and one that raised were both "stuck at an empty stack")."""
    try:
        return path.name.endswith(".faulthandler.txt") and path.stat().st_size == 0
    except OSError:
        return False


def hang_report(folder: Path) -> HangReport:
    """Read a run folder's hang dumps and say which rank the others wait for.

    Raises:
        FileNotFoundError: The folder does not exist or holds no hang dump.
        ValueError: No file can be read, and one cannot be parsed (the message names it); one that cannot be read
            beside others that can is named at the report's end.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: {'a file, not a run folder' if folder.exists() else 'no such folder'}")
    unread: list[str] = []  # a file that cannot be read is named; the others are still read (one bad dump of 64)

    def read(pattern: str, parse: Any) -> list[Any]:
        out = []
        for path in sorted(folder.glob(pattern)):
            try:
                out.append(parse(path))
            except ValueError as err:
                unread.append(str(err))
        return out

    dumps: dict[int, RankDump] = {}
    for dump in read("hang_rank*.txt", lambda p: None if _empty_backstop(p) else parse_dump(p)):
        # (None: a backstop armed, never written: a rank that ended another way, a crash, an exception, left it)
        if dump is not None and (dump.rank not in dumps or dumps[dump.rank].backstop):
            dumps[dump.rank] = dump  # the watchdog's own dump wins over the backstop's
    crashes = {c.rank: c for c in read("rank*_crash.txt", parse_crash) if c is not None}
    raised = {r.rank: r for r in read("rank*_exception.txt", parse_exception) if r is not None}
    stopped = {s.rank: s for s in read("rank*_stopped.txt", parse_stopped) if s is not None}
    ended = bool(dumps or crashes or raised or stopped)
    if unread and not ended:
        raise ValueError(unread[0])
    # (Only beside a rank that ended otherwise: a run still going has every part "running" and its crash files armed.)
    silent = silent_ranks(folder, set(dumps) | set(crashes) | set(raised) | set(stopped)) if ended else {}
    if not ended:
        raise FileNotFoundError(f"{folder}: no hang_rank*_*.txt (was --hang-timeout on, and did a step stall?), no "
                                "rank*_crash.txt with a stack (no rank died of a fatal signal), no "
                                "rank*_exception.txt (no rank ended by an uncaught exception) and no rank*_stopped.txt "
                                "(no rank stopped by a signal)")
    unknown = bool(crashes) or _any_killed(silent)  # a rank died at a time nobody knows: no first is named
    if not dumps:
        lines = (_crash_lines(folder, crashes) if crashes else []) + (
            _raised_lines(folder, raised, stopped, unknown) if raised or stopped else [])
        return HangReport(folder, {}, {}, None, [], lines + _silent_lines(folder, silent, bool(lines))
                          + _unread_lines(unread), crashes, raised, silent, stopped)
    recorders = {r.rank: r for r in read("flight_recorder_rank*.pkl", parse_recorder)}
    sizes = {int(d.header["world_size"]) for d in dumps.values() if d.header.get("world_size", "").isdigit()}
    world = max(sizes) if sizes else None
    lines = [f"hang report: {folder} ({len(dumps)} rank(s) dumped" + (f" of {world})" if world else ")")]
    waiting, free = [], []
    for rank in sorted(dumps):
        d = dumps[rank]
        what = f"rank {rank} ({d.host}, last step {d.header.get('last_step', '?')}"
        what += ", faulthandler backstop)" if d.backstop else ")"
        inside = d.in_collective
        if inside is not None:
            waiting.append(rank)
            user = d.user_frame
            lines.append(f"{what}: in a collective or waiting for one at {inside}"
                         + (f" (from {user})" if user is not None else ""))
        else:
            free.append(rank)
            lines.append(f"{what}: NOT in a collective; stuck at {d.user_frame or 'an empty stack'}")
    missing = sorted(set(range(world)) - set(dumps)) if world else []
    if missing:
        lines.append(f"no dump from rank(s) {missing}: dead, or stuck in C code holding the GIL (no backstop dump)")
    culprits = free if waiting and free else []
    if culprits:
        where = "; ".join(f"rank {r} at {dumps[r].user_frame}" for r in culprits)
        lines.append(f"=> the others wait for {where}")
    elif waiting and not free:
        dead = f": {missing}" if missing else ""
        lines.append("=> every rank dumped is inside a collective: look for a rank that called a different "
                     f"collective (or the same with other sizes), or one that died{dead}")
    lines += recorder_lines(recorders)
    if crashes:
        lines += _crash_lines(folder, crashes)[1:]
    if raised or stopped:
        lines += _raised_lines(folder, raised, stopped, unknown, header=False, hung=True)
    lines += _silent_lines(folder, silent, True) + _unread_lines(unread)
    return HangReport(folder, dumps, recorders, world, culprits, lines, crashes, raised, silent, stopped)


def _any_killed(silent: dict[int, str]) -> bool:
    """Whether a rank died at a time nobody knows (the exceptions' order then names no first)."""
    return any(how != STOPPED for how in silent.values())


def _unread_lines(unread: list[str]) -> list[str]:
    """The files that could not be read, each with why (the report stands on the others)."""
    return [f"could not read {len(unread)} file(s), left out of the report above:", *(f"  {u}" for u in unread)] \
        if unread else []


def _raised_lines(folder: Path, raised: dict[int, Raised], stopped: dict[int, Stopped], crashed: bool = False,
                  header: bool = True, hung: bool = False) -> list[str]:
    """Which rank raised, what, where, and which rank a signal stopped, when, in the order they did: the first is the
    cause, the others mostly its effect (a rank that ends fails its peers' collectives; a launcher stops the other
    ranks once one fails). Put in order only when the order holds: no rank that died of a signal (``crashed``: its
    time unknown, so each line gives its time alone), and a first named only on one host (one clock; hosts' clocks
    can differ by more than the gaps). With ``header``, a line naming the report first (none where the hang report is
    above); with ``hung`` (hang dumps above), stops alone get no verdict of their own: they followed the hang."""
    lines = [f"exception report: {folder} ({len(raised)} rank(s) ended by an uncaught exception)"] \
        if raised and header else []
    if stopped and header:
        lines.append(f"stop report: {folder} ({len(stopped)} rank(s) stopped by a signal)")
    events = sorted([*raised.values(), *stopped.values()], key=lambda e: (e.unix, e.rank))
    first = events[0]
    hosts = {e.dump.host for e in events}

    def when(e: Raised | Stopped) -> str:
        if len(events) == 1 or crashed:
            return e.stamp
        clock = "" if len(hosts) == 1 else " by its host's clock"
        if e is first:
            return f"first{clock}, {e.stamp}"
        return f"{e.unix - first.unix:.2f} s after rank {first.rank} {_did(first)}{clock}, {e.stamp}"

    for e in events:
        where = f" at {e.dump.user_frame}" if e.dump.main_stack else ""
        if isinstance(e, Raised):
            lines.append(f"rank {e.rank} raised {e.exception}{where} ({when(e)}); its traceback: {e.path.name}")
        else:
            lines.append(f"rank {e.rank} was stopped by {e.signal}{where} ({when(e)}); every thread's stack then: "
                         f"{e.path.name}")
    if len(events) < 2 or crashed or (hung and not raised):
        return lines
    if not raised:
        span = events[-1].unix - first.unix
        lines.append(f"=> no rank raised: {len(events)} ranks were stopped by a signal within {span:.2f} s"
                     + (f", rank {first.rank} first: the whole job stopped (a scheduler, a user), or rank {first.rank} "
                        "stopped alone and then the launcher stopping the rest" if len(hosts) == 1 else
                        f" by {len(hosts)} hosts' clocks, which can differ by more: the whole job stopped (a "
                        "scheduler, a user), or one rank stopped alone and then the launcher stopping the rest"))
    elif len(hosts) > 1:
        lines.append(f"=> rank {first.rank} {_did(first)} first by its host's clock; the ranks are on {len(hosts)} "
                     "hosts, whose clocks can differ by more than these gaps: read the exceptions, the first cause is "
                     "the one that is not a failed collective")
    elif isinstance(first, Stopped):
        lines.append(f"=> rank {first.rank} was stopped by {first.signal} first: the others' exceptions followed the "
                     "stop (a rank that ends fails its peers' collectives); who sent the signal (a user, the "
                     "scheduler, a launcher) is in their logs")
    else:
        lines.append(f"=> rank {first.rank} raised first: the others' exceptions followed it (a rank that dies fails "
                     "its peers' collectives)" + (" and the launcher stopped the rest" if stopped else ""))
    return lines


def _did(e: Raised | Stopped) -> str:
    return "raised" if isinstance(e, Raised) else "was stopped"


KILLED, KILLED_OR_RUNNING, STOPPED = "killed", "killed or running", "stopped"
"""How a rank that left no word ended (:func:`silent_ranks`)."""


def silent_ranks(folder: Path, told: set[int]) -> dict[int, str]:
    """The ranks that ended without a word: no hang dump, crash stack or exception file (``told``), and no train end.

    rank -> :data:`KILLED`: its crash file is there, empty (armed at train start, removed at train end and before a
    signal's default action: only SIGKILL, which nothing can catch, leaves it: the out-of-memory killer, a launcher's
    or a scheduler's kill), and its process (its manifest part's pid, on this host) is gone; :data:`KILLED_OR_RUNNING`:
    the same file, where the process cannot be checked (another host, or no manifest part: a run without the profiler
    writes none); :data:`STOPPED`: its manifest part never reached train end and no crash file is left (a signal's
    default action, SIGTERM from the launcher once another rank failed or from the scheduler, or ``os._exit``). A rank
    still running on this host is none of them; a part that cannot be read is passed over."""
    out: dict[int, str] = {}
    parted: set[int] = set()
    here = get_hostname()
    for path in sorted(folder.glob(MANIFEST_PART_NAME.format(rank="*", host="*"))):
        try:
            part = json.loads(path.read_text(encoding="utf-8"))
            rank, status = int(part["rank"]), part.get("status")
        except (OSError, ValueError, TypeError, KeyError):
            continue
        parted.add(rank)
        local = short_host(str(part.get("host") or "")) == here
        if rank in told or status == "finished" or (local and _alive(part.get("pid"))):
            continue
        if _armed(folder, rank):
            out[rank] = KILLED if local else KILLED_OR_RUNNING
        else:
            out[rank] = STOPPED
    for path in sorted(folder.glob(CRASH_NAME.format(rank="*"))):
        found = _CRASH.match(path.name)
        rank = int(found["rank"]) if found else None
        if rank is not None and rank not in told and rank not in parted and _armed(folder, rank):
            out[rank] = KILLED_OR_RUNNING
    return out


def _armed(folder: Path, rank: int) -> bool:
    """Whether the rank's crash file is there, empty: armed, never written, never tidied."""
    crash = folder / CRASH_NAME.format(rank=rank)
    try:
        return crash.is_file() and crash.stat().st_size == 0
    except OSError:
        return False


def _alive(pid: Any) -> bool:
    """Whether process ``pid`` runs on this host."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: it exists)
        return True
    return True


_HOW = {
    KILLED: "killed without a chance to write: SIGKILL (the out-of-memory killer, or a launcher's or scheduler's kill; "
            "see dmesg and the launcher's log)",
    KILLED_OR_RUNNING: "its crash file is left empty: killed by SIGKILL (the out-of-memory killer, or a launcher's or "
                       "scheduler's kill), or still running (its process cannot be checked: on another host, or no "
                       "manifest part gives its pid, as in a run without the profiler)",
}


def _silent_lines(folder: Path, silent: dict[int, str], after: bool) -> list[str]:
    """The ranks that ended without a word. A killed one comes first (the others' exceptions can be what its death
    caused); a stopped one was most often stopped by the launcher after another rank failed."""
    if not silent:
        return []
    lines = [] if after else [f"report: {folder} (ranks that ended without an exception or a crash stack)"]
    for rank in sorted(silent):
        how = _HOW.get(silent[rank], "stopped by a signal (SIGTERM: a launcher stops the other ranks once one "
                                     "fails; or the scheduler) or os._exit; its last words are in "
                                     f"rank{rank}.log")
        lines.append(f"rank {rank} never reached train end and left no exception, crash stack or hang dump: {how}")
    killed = sorted(r for r, how in silent.items() if how != STOPPED)
    if killed:
        lines.append(f"=> look at {'rank' if len(killed) == 1 else 'ranks'} {', '.join(map(str, killed))} first: the "
                     "exceptions of the others, if any, can be what followed (a rank that dies fails its peers' "
                     "collectives: \"Connection reset by peer\", \"Connection closed\")")
    return lines


def _crash_lines(folder: Path, crashes: dict[int, Crash]) -> list[str]:
    """Which rank died, of what, where: the innermost frame of user code of the thread that got the signal."""
    lines = [f"crash report: {folder} ({len(crashes)} rank(s) died of a fatal signal)"]
    for rank in sorted(crashes):
        c = crashes[rank]
        stack = c.dump.main_stack
        where = (f"at {c.dump.user_frame}" if stack else
                 "in a thread without Python frames (native code: a C++ thread, a library's own)")
        lines.append(f"rank {rank} died of {c.fatal} ({c.signal}) {where}; every thread's stack: {c.path.name}")
        if stack and stack[-1] is not c.dump.user_frame:
            lines.append(f"  innermost frame: {stack[-1]}")
    return lines
