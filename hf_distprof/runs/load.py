"""Read a run folder (what the step timer, the memory logger and the profiler wrote) into plain data.

The one place that knows the files of a run folder for ``compare`` and ``scaling``: ``timing_rank{R}.jsonl``
(required), ``timing_summary.json``, ``memory_rank{R}.jsonl``, ``memory_summary.json``, the traces'
file names (their step windows) and ``analysis.json`` (the trace analysis, per traced step). No torch, no
transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_distprof.core import names
from hf_distprof.core.records import RecordsError, read_records
from hf_distprof.core.records import is_number as _is_number

WARMUP_STEPS = 1
"""Steps left out at the start when ``timing_summary.json`` does not say (the step timer's own default)."""

TIMING_RE = names.TIMING_RE
"""A step timer file's name; group 1 is the rank."""
_MEMORY_RE = re.compile(re.escape(names.MEMORY_LOG_NAME).replace(r"\{rank\}", r"(\d+)") + "$")
_TRACE_WINDOW_RE = re.compile(r"^rank\d+_.*_step(\d+)-(\d+)" + re.escape(names.TRACE_SUFFIX) + "$")


class RunFolderError(ValueError):
    """A run folder that cannot be read: missing, without timing files, or with a malformed file."""


@dataclass
class RunData:
    """Everything ``compare`` and ``scaling`` read from one run folder.

    Attributes:
        path: The run folder.
        steps: rank -> its ``timing_rank{R}.jsonl`` records (one dict per optimizer step), in file order.
        summary: ``timing_summary.json``, when rank 0 wrote it.
        memory: rank -> its ``memory_rank{R}.jsonl`` records (one per memory logging step).
        memory_summary: ``memory_summary.json``, when present.
        traced_steps: Optimizer steps inside a profiler window (from the trace files' names): the profiler
            slows them down, so they are left out of the comparisons.
        trace_steps: rank -> per traced step, ``{"step", "compute_s", "communication_s", "data_loading_s",
            "gpu_wait_s"}``
            from ``analysis.json`` (the trace analysis); empty when the folder has none.
        warmup_steps: Steps left out at the start of every rank's records.
    """

    path: Path
    steps: dict[int, list[dict[str, Any]]]
    summary: dict[str, Any] | None = None
    memory: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    memory_summary: dict[str, Any] | None = None
    traced_steps: set[int] = field(default_factory=set)
    trace_steps: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    warmup_steps: int = WARMUP_STEPS

    @property
    def ranks(self) -> list[int]:
        return sorted(self.steps)

    def counted(self, rank: int) -> list[dict[str, Any]]:
        """The rank's step records used in comparisons: warm-up and profiled steps left out (also those the step
        timer marked as the profiler's: traced, or overlapped by a trace's compact summary being written), and the
        step after a checkpoint, an evaluation or a window's export (it waits for the slowest rank's)."""
        records = self.steps.get(rank, [])
        first = min((int(r["step"]) for r in records), default=0)
        return [
            r for r in records
            if int(r["step"]) >= first + self.warmup_steps and int(r["step"]) not in self.traced_steps
            and r.get("traced") is not True and r.get("profiler_busy") is not True and r.get("after_pause") is not True
        ]


def find_run_dir(path: str | Path) -> Path:
    """The run folder at ``path``: ``path`` itself when it holds timing files, else its only such subfolder.

    So both ``<profiler-output-dir>/<run-name>`` and a ``--profiler-output-dir`` holding one run are accepted.

    Raises:
        RunFolderError: ``path`` does not exist, or neither it nor exactly one subfolder holds timing files.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: {'a file, not a run folder' if folder.exists() else 'no such folder'}")
    if _timing_files(folder):
        return folder
    try:
        subfolders = [p for p in folder.iterdir() if p.is_dir()]
    except OSError as err:
        raise RunFolderError(f"{folder}: cannot be read ({err.strerror or err})") from err
    candidates = sorted(p for p in subfolders if _timing_files(p))
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        listed = ", ".join(p.name for p in candidates)
        raise RunFolderError(f"{folder}: holds several run folders ({listed}); name one of them")
    raise RunFolderError(
        f"{folder}: no {names.TIMING_LOG_NAME.format(rank='*')} files here or in a subfolder: not a run folder of "
        "the step timer (train with --enable-step-timing or --enable-profiling)"
    )


def _timing_files(folder: Path) -> dict[int, Path]:
    out: dict[int, Path] = {}
    try:
        entries = list(folder.iterdir())
    except OSError:  # a subfolder we may not read is not a run folder
        return out
    for p in entries:
        m = TIMING_RE.match(p.name)
        if m and p.is_file():
            out[int(m.group(1))] = p
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return read_records(path)
    except RecordsError as err:
        raise RunFolderError(str(err)) from err


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: not UTF-8, not JSON
        raise RunFolderError(f"{path}: not readable JSON ({err})") from err
    except RecursionError as err:
        raise RunFolderError(f"{path}: not readable JSON (nested too deeply)") from err
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    return data


def _wrong(path: Path, where: str, value: Any, expected: str) -> RunFolderError:
    return RunFolderError(f"{path}: {where} is {value!r}, not {expected}")


def _check_rows(path: Path, data: dict[str, Any], numbers: tuple[str, ...]) -> None:
    """``per_rank`` is a list of objects whose ``rank`` is an integer and whose ``numbers`` are numbers or null."""
    rows = data.get("per_rank")
    if rows is None:
        return
    if not isinstance(rows, list):
        raise _wrong(path, "'per_rank'", rows, "a list")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _wrong(path, f"per_rank[{i}]", row, "an object")
        if "rank" in row and not _is_number(row["rank"], integer=True):
            raise _wrong(path, f"per_rank[{i}].rank", row["rank"], "an integer")
        for key in numbers:
            if row.get(key) is not None and not _is_number(row[key]):
                raise _wrong(path, f"per_rank[{i}].{key}", row[key], "a number")


def _check_object(path: Path, data: dict[str, Any], key: str, numbers: tuple[str, ...]) -> None:
    """``data[key]``, when present and not null, is an object whose ``numbers`` are numbers or null."""
    value = data.get(key)
    if value is None:
        return
    if not isinstance(value, dict):
        raise _wrong(path, repr(key), value, "an object")
    for name in numbers:
        if value.get(name) is not None and not _is_number(value[name]):
            raise _wrong(path, f"{key}.{name}", value[name], "a number")


def _check_timing_summary(path: Path, data: dict[str, Any]) -> None:
    """The fields of ``timing_summary.json`` that compare and scaling read, checked so that a file edited by hand
    or written by another tool is named in a clear error, never a traceback."""
    warmup = data.get("warmup_steps_excluded")
    if warmup is not None and not (_is_number(warmup, integer=True) and warmup >= 0):
        raise _wrong(path, "'warmup_steps_excluded'", warmup, "an integer >= 0")
    _check_rows(path, data, ("peak_memory_bytes",))
    _check_object(path, data, "profiler_slowdown", ("steps_inside",))
    _check_object(path, data, "comm_overhead", ("overhead_pct",))


def _check_memory_summary(path: Path, data: dict[str, Any]) -> None:
    """``memory_summary.json``: ``peak_basis`` names a numeric field of its ``per_rank`` rows."""
    basis = data.get("peak_basis")
    if basis is not None and not isinstance(basis, str):
        raise _wrong(path, "'peak_basis'", basis, "a string")
    _check_rows(path, data, (basis,) if basis else ())


def _trace_steps(analysis: dict[str, Any]) -> dict[int, list[dict[str, float]]]:
    """Per rank and traced step, the CPU-side breakdown of the trace analysis, in seconds."""
    out: dict[int, list[dict[str, float]]] = {}
    for rank in analysis.get("ranks") or []:
        rows = []
        for step in rank.get("steps") or []:
            cpu = step.get("cpu") or {}
            rows.append({
                "step": float(step.get("step", 0)),
                "compute_s": float(cpu.get("compute_us", 0.0)) / 1e6,
                "communication_s": float(cpu.get("communication_us", 0.0)) / 1e6,
                "data_loading_s": float(cpu.get("data_loading_us", 0.0)) / 1e6,
                "gpu_wait_s": float(cpu.get("gpu_wait_us", 0.0)) / 1e6,
            })
        if rows:
            out[int(rank.get("rank", len(out)))] = rows
    return out


def _profiler_warmup(traced: set[int], summary: dict[str, Any] | None) -> set[int]:
    """The profiler's warm-up steps before a single traced window: it runs over them too, without writing them.

    The trace file names give the recorded window only; the step timer's ``profiler_slowdown`` counts every step
    the profiler ran over. Only for one contiguous window (a repeating schedule leaves it ambiguous).
    """
    inside = int(((summary or {}).get("profiler_slowdown") or {}).get("steps_inside") or 0)
    if not traced or max(traced) - min(traced) + 1 != len(traced) or inside <= len(traced):
        return set()
    return set(range(max(traced) - inside + 1, min(traced)))


def load_run(
    path: str | Path, warmup_steps: int | None = None, analyze: Callable[[Path], dict[str, Any] | None] | None = None
) -> RunData:
    """Read one run folder.

    Args:
        path: The run folder (or a folder holding exactly one, see :func:`find_run_dir`).
        warmup_steps: Steps to leave out at the start; None: what ``timing_summary.json`` says it left out of
            its means, else :data:`WARMUP_STEPS`.
        analyze: When the folder has traces but no ``analysis.json``, what analyses them (seconds per run) for the
            traced steps' breakdown: the folder -> ``analysis.json``'s document, or None without ranks
            (:func:`hf_distprof.analysis.api.analysis_document`; the caller passes it, so that this module, which
            the analysis reads timer files with, never imports the analysis).

    Returns:
        The run's data.

    Raises:
        RunFolderError: The folder is missing, has no timing files, or a file in it is malformed.
    """
    folder = find_run_dir(path)
    steps = {rank: _read_jsonl(p) for rank, p in sorted(_timing_files(folder).items())}
    if not any(steps.values()):
        raise RunFolderError(f"{folder}: the timing files hold no step")
    summary = _read_json(folder / names.TIMING_SUMMARY_NAME)
    if summary is not None:
        _check_timing_summary(folder / names.TIMING_SUMMARY_NAME, summary)
    memory_summary = _read_json(folder / names.MEMORY_SUMMARY_NAME)
    if memory_summary is not None:
        _check_memory_summary(folder / names.MEMORY_SUMMARY_NAME, memory_summary)
    memory: dict[int, list[dict[str, Any]]] = {}
    traced: set[int] = set()
    for p in folder.iterdir():
        m = _MEMORY_RE.match(p.name)
        if m:
            memory[int(m.group(1))] = _read_jsonl(p)
        w = _TRACE_WINDOW_RE.match(p.name)
        if w:
            traced.update(range(int(w.group(1)), int(w.group(2)) + 1))
    traced |= _profiler_warmup(traced, summary)
    analysis = _read_json(folder / names.ANALYSIS_NAME)
    if analysis is None and traced and analyze is not None:
        try:
            analysis = analyze(folder)
        except (OSError, ValueError) as err:  # ValueError: the folder holds the traces of two runs
            raise RunFolderError(f"{folder}: its traces cannot be analysed ({err})") from err
    if warmup_steps is None:
        warmup_steps = int((summary or {}).get("warmup_steps_excluded", WARMUP_STEPS))
    try:
        trace_steps = _trace_steps(analysis) if analysis else {}
    except (AttributeError, TypeError, ValueError) as err:
        where = folder / names.ANALYSIS_NAME
        raise RunFolderError(f"{where}: a traced step's field has the wrong type ({err})") from err
    return RunData(
        path=folder,
        steps=steps,
        summary=summary,
        memory=memory,
        memory_summary=memory_summary,
        traced_steps=traced,
        trace_steps=trace_steps,
        warmup_steps=warmup_steps,
    )
