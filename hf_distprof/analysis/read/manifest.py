"""The run manifest: reading it, assembling it from its per-rank parts, and what ``analyze`` and ``merge`` take from it.

Every rank of a profiled run writes its part, ``manifest_rank{R}_{host}.json``, at train start (its host, its
clock offset against rank 0, the library versions) and again after each profiler window it writes (the window,
why it was taken, its files). At train end rank 0 gathers the parts and writes the combined ``manifest.json``.
A run stopped early (SIGTERM, a rank killed) has no combined file: :func:`load_manifest` then assembles the
parts it finds, so the manifest is as complete as the files that survived, and says so (``complete`` false,
the ranks that never finished, the ranks without a part).

Pure code over JSON documents and file names: the runtime side (the clock measurement, the writes) is
:mod:`hf_distprof.callbacks.profiler.manifest`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_distprof.analysis.results.run import RankClock, RunSummary, WindowInfo
from hf_distprof.core.job import COUNT_KEYS, ID_KEYS
from hf_distprof.core.names import (  # noqa: F401 (ANOMALY, ON_DEMAND: the other reasons, re-exported)
    ANOMALY,
    COMPACT_SUFFIX,
    CRASH_NAME,
    EXCEPTION_NAME,
    MANIFEST_NAME,
    MANIFEST_PART_NAME,
    ON_DEMAND,
    PROFILE_RANKS_NAME,
    STOPPED_NAME,
)
from hf_distprof.core.stats import finite
from hf_distprof.core.text import format_ranks

FORMAT = "hf_distprof.manifest"
PART_FORMAT = "hf_distprof.manifest.part"
VERSION = 1

# Why a window was taken (a window's "reasons"; a window opened by a request and an anomaly at the same
# agreement step has both). The capture's own words are in its "detail".
SCHEDULE = "schedule"
# The ranks of the window were chosen by --profile-ranks auto (its record is the window's "rank_choice").
AUTO_RANKS = "auto_ranks"
# Part "status": still training (or stopped before train end), or past train end.
RUNNING = "running"
FINISHED = "finished"


class ManifestError(ValueError):
    """A manifest file that cannot be read; the message names the file and what is wrong with it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def part_glob() -> str:
    """The glob that finds every rank's part in a run folder."""
    return MANIFEST_PART_NAME.format(rank="*", host="*")


def assemble(parts: Sequence[Mapping[str, Any]], combined: bool = False,
             rank_choices: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The run manifest from the ranks' parts (any order, any subset of the ranks).

    Args:
        parts: Per-rank part documents (as written by :class:`hf_distprof.callbacks.profiler.manifest.RunManifest`).
        combined: Whether rank 0 gathered the parts at train end (True) or a reader found them on disk.
        rank_choices: ``--profile-ranks auto``'s records (``profile_ranks.json``'s ``windows``): each window takes
            the record whose ``window_first`` is the latest at or before its first recorded step and after the
            previous window, as ``rank_choice``, and ``auto_ranks`` among its reasons (neither without one).

    Returns:
        The manifest document: run-wide fields, ``hosts``, ``ranks``, ``windows`` and ``files``, sorted by rank
        and step.

    Raises:
        ValueError: ``parts`` is empty, or two parts claim the same rank.
    """
    if not parts:
        raise ValueError("no manifest part to assemble")
    by_rank: dict[int, Mapping[str, Any]] = {}
    for part in parts:
        rank = int(part["rank"])
        if rank in by_rank:
            raise ValueError(f"two manifest parts for rank {rank} (hosts {by_rank[rank]['host']} and {part['host']})")
        by_rank[rank] = part
    ranks = sorted(by_rank)
    first = by_rank[ranks[0]]
    world = max(int(p.get("world_size") or 0) for p in parts) or ranks[-1] + 1
    hosts: dict[str, list[int]] = {}
    for rank in ranks:
        hosts.setdefault(str(by_rank[rank]["host"]), []).append(rank)
    reference = by_rank.get(0, first).get("versions") or {}
    windows: dict[tuple[int, int], dict[str, Any]] = {}
    files: list[dict[str, Any]] = []
    rows = [_rank_row(rank, by_rank[rank]) for rank in ranks]
    for rank in ranks:
        part = by_rank[rank]
        for w in part.get("windows") or []:
            key = (int(w["first"]), int(w["last"]))
            row = windows.setdefault(key, {
                "first": key[0], "last": key[1], "reasons": list(w.get("reasons") or []),
                "detail": str(w.get("detail") or ""), "ranks": [], "cut_short_ranks": [], "rank_choice": None,
            })
            row["ranks"].append(rank)
            if w.get("cut_short"):
                row["cut_short_ranks"].append(rank)
            files += _file_rows(w.get("files"), rank, part["host"], list(key))
        files += _file_rows(part.get("files"), rank, part["host"], None)
    _match_rank_choices([windows[k] for k in sorted(windows)], rank_choices)
    return {
        "format": FORMAT,
        "version": VERSION,
        "complete": combined and len(ranks) == world and all(r["status"] == FINISHED for r in rows),
        "source": "combined by rank 0 at train end" if combined else f"assembled from {len(ranks)} part(s)",
        "run_name": first.get("run_name"),
        "world_size": world,
        "profile_ranks": first.get("profile_ranks"),
        "started_at": by_rank.get(0, first).get("started_at"),
        # Rank 0's launcher, job id and attempt (absent from parts written before hf_distprof recorded them).
        "job": by_rank.get(0, first).get("job"),
        "versions": dict(reference),
        "versions_differ": [{"rank": r, "versions": by_rank[r]["versions"]} for r in ranks
                            if by_rank[r].get("versions") and by_rank[r]["versions"] != reference],
        "hosts": [{"host": host, "ranks": members} for host, members in sorted(hosts.items(), key=lambda h: h[1][0])],
        "ranks": rows,
        "absent_ranks": [r for r in range(world) if r not in by_rank],
        "unfinished_ranks": [r["rank"] for r in rows if r["status"] != FINISHED],
        "windows": [windows[k] for k in sorted(windows)],
        "files": sorted(files, key=lambda f: (f["rank"], f["window"] or [0, 0], f["name"])),
        # The schedule rank 0 followed and the last step any rank reached: why a run has no window (older parts:
        # absent).
        "schedule": by_rank.get(0, first).get("schedule"),
        "last_step": max((int(p["last_step"]) for p in parts if isinstance(p.get("last_step"), int)), default=None),
    }


def _match_rank_choices(windows: list[dict[str, Any]], records: Sequence[Mapping[str, Any]]) -> None:
    previous_last = 0
    for w in windows:
        fits = [r for r in records if previous_last < int(r.get("window_first") or 0) <= w["first"]]
        if fits:
            w["rank_choice"] = dict(max(fits, key=lambda r: int(r["window_first"])))
            w["reasons"].append(AUTO_RANKS)
        previous_last = w["last"]


def read_rank_choices(folder: Path) -> list[dict[str, Any]]:
    """``--profile-ranks auto``'s records in ``folder`` (``profile_ranks.json``); [] without the file.

    Raises:
        ManifestError: The file is there but unreadable or not the records.
    """
    path = folder / PROFILE_RANKS_NAME
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))["windows"]
        return [dict(r) for r in records if isinstance(r, dict)]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise ManifestError(path, f"not --profile-ranks auto's records ({err!r})") from err


def _rank_row(rank: int, part: Mapping[str, Any]) -> dict[str, Any]:
    clock = part.get("clock") or {}
    job = part.get("job") or {}
    return {
        "rank": rank, "host": part["host"], "local_rank": part.get("local_rank"), "pid": part.get("pid"),
        "status": part.get("status", RUNNING), "clock_offset_us": clock.get("offset_us"),
        "clock_uncertainty_us": clock.get("uncertainty_us"), "clock_measured_on_rank": clock.get("measured_on_rank"),
        "windows": len(part.get("windows") or []), "failed_exports": int(part.get("failed_exports") or 0),
        "slurm_node_id": job.get("slurm_node_id"), "slurm_proc_id": job.get("slurm_proc_id"),
    }


def _file_rows(names: Sequence[str] | None, rank: int, host: str, window: list[int] | None) -> list[dict[str, Any]]:
    return [{"name": name, "rank": rank, "host": host, "window": window} for name in names or []]


def _read_json(path: Path, expected_format: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ManifestError(path, f"cannot read it ({err.strerror or err})") from err
    except (UnicodeDecodeError, ValueError) as err:
        raise ManifestError(path, f"not valid JSON ({err})") from err
    except RecursionError as err:
        raise ManifestError(path, "not valid JSON (nested too deeply)") from err
    if not isinstance(doc, dict) or doc.get("format") != expected_format:
        raise ManifestError(path, f"not a {expected_format} document (its \"format\" must be {expected_format!r})")
    version = doc.get("version") or 0
    if isinstance(version, bool) or not isinstance(version, int):
        raise ManifestError(path, f"its \"version\" must be an integer, got {version!r}")
    if version > VERSION:
        raise ManifestError(path, f"version {version} is newer than this hf_distprof reads ({VERSION})")
    return doc


def load_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The run manifest of a run folder: ``manifest.json``, else assembled from the parts there; None without either.

    Raises:
        ManifestError: A manifest file there is unreadable, not JSON or not a manifest (the error names it).
    """
    folder = Path(folder)
    combined = folder / MANIFEST_NAME
    if combined.is_file():
        return _read_json(combined, FORMAT)
    parts = [_read_json(p, PART_FORMAT) for p in sorted(folder.glob(part_glob())) if not p.name.startswith(".")]
    if not parts:
        return None
    try:
        return assemble(parts, rank_choices=read_rank_choices(folder))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as err:
        raise ManifestError(folder / part_glob(), f"the parts do not assemble ({err!r})") from err








def missing_files(manifest: Mapping[str, Any], folder: Path, others: Sequence[Path] = ()) -> list[str]:
    """One sentence per file that ``manifest`` lists and neither ``folder`` nor ``others`` holds (the other folders
    given with it: the nodes' node-local folders of one run, analysed where they lie).

    Raises:
        TypeError: A listed file's name is not a string.
    """
    out = []
    for f in manifest.get("files") or []:
        if not isinstance(f["name"], str):
            raise TypeError(f"a file name must be a string, got {f['name']!r}")
        if any((where / f["name"]).exists() for where in (folder, *others)) or f["name"].endswith(COMPACT_SUFFIX):
            continue  # (a compact file is a cache of its trace, made again from it: none lost without the trace)
        where = f"rank {f['rank']} on host {f['host']}"
        if f.get("window"):
            where += f", steps {f['window'][0]}-{f['window'][1]}"
        trace = f.get("window") and str(f["name"]).endswith((".json.gz", ".json"))  # (parallelism.json is no trace)
        what = "a lost trace" if trace else "a lost file"
        held = f"{folder} does not hold it" if not others else "none of the folders given holds it"
        out.append(f"the run manifest lists {f['name']} ({where}) but {held}: {what} "
                   "(or one left in another host's node-local folder)")
    return out


def summarize(manifest: Mapping[str, Any], folder: Path, others: Sequence[Path] = ()) -> RunSummary:
    """The manifest of the run in ``folder`` as ``analyze`` reports it, with the files it lists and lacks.

    Every field read is checked for its type here, so that printing the summary cannot fail on a manifest
    someone edited or wrote by hand.

    Raises:
        ManifestError: A field read is missing or has the wrong type (the error names the manifest).
    """
    combined = folder / MANIFEST_NAME
    path = combined if combined.is_file() else folder / part_glob()
    try:
        return RunSummary(
            path=str(path),
            complete=bool(manifest.get("complete")),
            world_size=_int(manifest.get("world_size") or 0),
            hosts=[{**h, "host": _str(h["host"]), "ranks": _ints(h["ranks"])} for h in _list(manifest.get("hosts"))],
            clocks=[RankClock(_int(r["rank"]), _str(r["host"]), _number(r.get("clock_offset_us")),
                              _number(r.get("clock_uncertainty_us")))
                    for r in _list(manifest.get("ranks"))],
            windows=[WindowInfo(_int(w["first"]), _int(w["last"]), [_str(x) for x in _list(w.get("reasons"))],
                                _str(w.get("detail") or ""), _ints(w.get("ranks")), _ints(w.get("cut_short_ranks")))
                     for w in _list(manifest.get("windows"))],
            missing_files=missing_files(manifest, folder, others),
            unfinished_ranks=_ints(manifest.get("unfinished_ranks")),
            absent_ranks=_ints(manifest.get("absent_ranks")),
            profile_ranks=_optional_str(manifest.get("profile_ranks")),
            crashed_ranks=_crashed(folder, others),
            raised_ranks=_crashed(folder, others, EXCEPTION_NAME),
            stopped_ranks=_crashed(folder, others, STOPPED_NAME),
            job=_job(manifest.get("job")),
        )
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as err:
        raise ManifestError(path, f"a field is missing or of the wrong type ({err!r})") from err


def _optional_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _crashed(folder: Path, others: Sequence[Path], name: str = CRASH_NAME) -> list[int]:
    """The ranks whose crash file (or exception file: ``name``) is in the run's folders and holds a stack
    (:mod:`hf_distprof.crash`)."""
    ranks = set()
    for where in (folder, *others):
        for crash in where.glob(name.format(rank="*")):
            rank = crash.name.split("_", 1)[0].removeprefix("rank")
            try:
                if rank.isdigit() and crash.stat().st_size > 0:
                    ranks.add(int(rank))
            except OSError:
                continue
    return sorted(ranks)


def _job(value: Any) -> dict[str, Any] | None:
    """The job record with each field's type checked (ids: strings, counts: integers, either may be null)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected the job record, got {value!r}")
    out: dict[str, Any] = {"launcher": _str(value.get("launcher") or "none")}
    for key in ID_KEYS:
        out[key] = None if value.get(key) is None else _str(value[key])
    for key in COUNT_KEYS:
        out[key] = None if value.get(key) is None else _int(value[key])
    return out


def _list(value: Any) -> list[Any]:
    """A manifest list (absent or null: empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _ints(value: Any) -> list[int]:
    return [_int(v) for v in _list(value)]


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _number(value: Any) -> float | None:
    """A finite number, or None where the manifest has none."""
    number = finite(value)
    if number is None and value is not None:
        raise TypeError(f"expected a finite number, got {value!r}")
    return number


_TRACE_STEPS = re.compile(r"^rank(?P<rank>\d+)_.+_step(?P<first>\d+)-(?P<last>\d+)\.pt\.trace\.json(?:\.gz)?$")


def foreign_traces(manifest: Mapping[str, Any], files: Sequence[str | Path]) -> list[tuple[str, str]]:
    """``(file, reason)`` for each trace in ``files`` that is another run's: the manifest does not list it, and lists
    a trace of the same rank over some of its steps (a node-local folder that held an earlier run of the name, files
    copied together from two jobs), or, when the manifest is complete (it then lists every trace the run wrote), does
    not list it at all. Against an incomplete manifest, a trace it lists nothing against (a window whose part never
    reached the manifest) is not judged."""
    listed: dict[int, list[tuple[int, int, str]]] = {}
    names = set()
    for f in manifest.get("files") or []:
        found = _TRACE_STEPS.match(str(f.get("name", "")))
        if found:
            names.add(found.string.removesuffix(".gz"))  # (a trace gunzipped in place is the same trace)
            listed.setdefault(int(found["rank"]), []).append((int(found["first"]), int(found["last"]), found.string))
    out = []
    complete, world = manifest.get("complete") is True, manifest.get("world_size")
    for path in files:
        found = _TRACE_STEPS.match(Path(path).name)
        if found is None or found.string.removesuffix(".gz") in names:
            continue
        rank, first, last = int(found["rank"]), int(found["first"]), int(found["last"])
        theirs = next((name for a, b, name in listed.get(rank, []) if a <= last and first <= b), None)
        if theirs is not None:
            out.append((str(path), f"another run's trace: the run's manifest lists {theirs} for rank {rank}'s steps "
                                   f"{first}-{last}, not this file (a node-local folder that held an earlier run of "
                                   "the name, or files copied in from another job); left out"))
        elif complete and isinstance(world, int) and rank < world:
            # A complete manifest (every rank past train end, combined by rank 0) lists every trace the run wrote: a
            # trace of its ranks it does not list is another run's (a trial named rank 0's trace of one run and rank
            # 1's of its resumed continuation, and read them as one run).
            mine = ", ".join(f"{a}-{b}" for a, b, _ in sorted(listed.get(rank, []))) or "none"
            out.append((str(path), f"another run's trace: the run's manifest, complete, lists no trace of rank {rank} "
                                   f"over steps {first}-{last} (its traces of rank {rank}: steps {mine}); left out"))
    return out


def run_summary_beside(
    files: Sequence[str | Path]
) -> tuple[RunSummary | None, list[tuple[str, str]], list[tuple[str, str]]]:
    """The manifest of the run folder the trace files are in (the first folder with one, in name order).

    Returns:
        The summary (None when no folder holds a manifest), ``(file, reason)`` for each manifest that could not be
        read, and ``(file, reason)`` for each trace that is another run's (:func:`foreign_traces`).
    """
    errors: list[tuple[str, str]] = []
    folders = sorted({Path(f).parent for f in files})
    for folder in folders:
        try:
            manifest = load_manifest(folder)
        except ManifestError as err:
            errors.append((err.path, err.reason))
            continue
        if manifest is None:
            continue
        try:
            return summarize(manifest, folder, [f for f in folders if f != folder]), errors, foreign_traces(
                manifest, files)
        except ManifestError as err:
            errors.append((err.path, err.reason))
    return None, errors, []


def _profiles_nobody(manifest: dict[str, Any]) -> str | None:
    """Why no rank traced when ``--profile-ranks`` named only ranks the run did not have; None otherwise."""
    spec, world = manifest.get("profile_ranks"), manifest.get("world_size")
    if not isinstance(spec, str) or not isinstance(world, int) or world < 1 or spec in ("all", "auto"):
        return None
    try:
        named = sorted({int(r) for r in spec.split(",")})
    except ValueError:
        return None
    if not named or any(r < world for r in named):
        return None
    return (f"the profiler took no window: --profile-ranks {spec} names no rank of this {world}-rank run "
            f"({format_ranks(list(range(world)))}); name ranks below {world}, or leave the flag out to trace every "
            "rank")


def why_no_trace(folder: str | Path) -> str | None:
    """Why a run folder holds no trace, from its run manifest; None when it has none.

    The manifest records the schedule each rank followed and the last step the run reached, so a run that ended
    before its first recorded step says so, with the flags that place that step.
    """
    try:
        manifest = load_manifest(folder)
    except ManifestError as err:
        return f"its run manifest cannot be read ({err.reason})"
    if manifest is None:
        return None
    windows = [w for w in _list(manifest.get("windows")) if isinstance(w, dict)]
    if windows:
        steps = ", ".join(f"{w.get('first')}-{w.get('last')}" for w in windows)
        return (f"the run manifest lists {len(windows)} window(s) (steps {steps}) whose traces are not in this folder: "
                "lost, or written to another host's node-local folder")
    nobody = _profiles_nobody(manifest)
    if nobody is not None:
        return nobody
    schedule, last = manifest.get("schedule"), manifest.get("last_step")
    first = schedule.get("first_recorded_step") if isinstance(schedule, dict) else None
    if isinstance(first, int) and isinstance(last, int) and isinstance(schedule, dict):
        if last < first:
            offset = schedule.get("offset") or 0
            on_request = ("; no window was requested on demand or opened on anomaly either"
                          if schedule.get("on_demand") or schedule.get("on_anomaly") else "")
            return (f"the profiler took no window: training ended at step {last}, before the schedule's first recorded "
                    f"step {first} (--profiler-skip-first {schedule.get('skip_first')} + --profiler-wait-steps "
                    f"{schedule.get('wait')} + --profiler-warmup-steps {schedule.get('warmup')} + 1"
                    + (f", counted from step {offset}, where training resumed" if offset else "")
                    + f"); lower those flags or run more steps{on_request}")
        return (f"the profiler took no window although training reached step {last}, past the schedule's first "
                f"recorded step {first}: it could not start or write on any rank (see rank{{R}}.log)")
    if not manifest.get("complete"):
        return "the run manifest lists no window, and the run stopped before train end (it is incomplete)"
    return "the run manifest lists no profiler window (it was written without the schedule, by an older hf_distprof)"
