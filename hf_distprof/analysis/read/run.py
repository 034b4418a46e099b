"""Everything ``analyze`` reads from disk but the traces' events, read once, first: the trace files found, the step
timer's records and summary beside them, the run manifest. The traces are read in the workers
(:mod:`hf_distprof.analysis.rank.workers`), one per rank, each into its own result."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from hf_distprof.analysis.read.manifest import run_summary_beside, why_no_trace
from hf_distprof.analysis.read.timer_records import read_timer_records
from hf_distprof.analysis.read.timing_summary import read_timing_summary
from hf_distprof.analysis.read.trace_io import NoTraceError, discover_trace_files
from hf_distprof.analysis.results.rank import FileError
from hf_distprof.analysis.results.run import RunInput
from hf_distprof.core import names


_OUR_TRACE = re.compile(r"^rank(\d+)_.+_step\d+-\d+\.pt\.trace\.json(?:\.gz)?$")


class SeveralRunsError(ValueError):
    """The paths hold the traces of more than one run: one rank's traces in two folders."""


def one_run(files: list[str], given: list[str]) -> None:
    """Refuse traces of several runs: the step timer's records and summaries are read from the traces' folders, so
    two runs' would be mixed (one run's traces judged against the other's records). Two folders holding a trace of
    the same rank (this project's names say the rank) are two runs; folders holding different ranks (the nodes of one
    run, copied apart) are one.

    Raises:
        SeveralRunsError: Naming the folders and a rank found in more than one.
    """
    folders: dict[int, set[Path]] = {}
    for f in files:
        found = _OUR_TRACE.match(Path(f).name)
        if found:
            folders.setdefault(int(found.group(1)), set()).add(Path(f).parent)
    shared = sorted(rank for rank, where in folders.items() if len(where) > 1)
    if not shared:
        return
    runs = sorted({str(folder) for rank in shared for folder in folders[rank]})
    raise SeveralRunsError(
        f"{', '.join(given)} hold{'s' if len(given) == 1 else ''} the traces of {len(runs)} runs ({', '.join(runs)}: "
        f"rank {shared[0]} in each); give one run folder at a time (hf-distprof compare sets runs side by side)")


def _manifest_in(folder: Path) -> bool:
    """Whether the profiler wrote its run manifest (or a rank's part of it) into ``folder``."""
    return (folder / names.MANIFEST_NAME).is_file() or next(
        folder.glob(names.MANIFEST_PART_NAME.format(rank="*", host="*")), None) is not None


def read_run(paths: Iterable[str | os.PathLike[str]]) -> RunInput:
    """The trace files under ``paths`` and the run's other files beside them.

    Args:
        paths: Folders (searched recursively for ``*.pt.trace.json[.gz]``, or for any ``*.json`` / ``*.json.gz`` when
            a folder holds none) and/or trace files.

    Returns:
        The files, the step timer's records and summary, the manifest's account and the manifests that could not be
        read.

    Raises:
        FileNotFoundError: A path does not exist, or a folder holds no trace (with the manifest's word on why, when
            the folder is a run folder whose manifest says).
        SeveralRunsError: The paths hold the traces of more than one run (:func:`one_run`).
    """
    given = [str(p) for p in paths]
    try:
        files = [str(p) for p in discover_trace_files(given)]
    except NoTraceError as exc:
        why = why_no_trace(exc.folder) if exc.run_folder else None
        if why is None and exc.run_folder and not _manifest_in(exc.folder):
            # The step timer's (or the memory logger's) files alone: a run without the profiler (trial T).
            why = ("it has no run manifest either: the run was not profiled (no --enable-profiling), or it ended "
                   "before the profiler started; its step timer's records are read by hf-distprof compare")
        if why is None:
            raise
        raise FileNotFoundError(f"{exc}: {why}") from None  # the run's manifest says why no window was taken
    one_run(files, given)
    run, errors, foreign = run_summary_beside(files)  # hosts, windows and why, files lost since; others' traces
    left_out = {path for path, _ in foreign}
    files = [f for f in files if f not in left_out]
    records = read_timer_records(files)
    return RunInput(files=files, records=records, summary=read_timing_summary(files), run=run,
                    errors=[FileError(path, reason) for path, reason in errors + foreign + records.skipped])
