"""Everything ``analyze`` reads from disk but the traces' events, read once, first: the trace files found, the step
timer's records and summary beside them, the run manifest. The traces are read in the workers
(:mod:`hf_distprof.analysis.rank.workers`), one per rank, each into its own result."""

from __future__ import annotations

import os
from collections.abc import Iterable

from hf_distprof.analysis.read.manifest import run_summary_beside, why_no_trace
from hf_distprof.analysis.read.timer_records import read_timer_records
from hf_distprof.analysis.read.timing_summary import read_timing_summary
from hf_distprof.analysis.read.trace_io import NoTraceError, discover_trace_files
from hf_distprof.analysis.results.rank import FileError
from hf_distprof.analysis.results.run import RunInput


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
    """
    try:
        files = [str(p) for p in discover_trace_files(paths)]
    except NoTraceError as exc:
        why = why_no_trace(exc.folder) if exc.run_folder else None
        if why is None:
            raise
        raise FileNotFoundError(f"{exc}: {why}") from None  # the run's manifest says why no window was taken
    run, errors = run_summary_beside(files)  # hosts, windows and why, files lost since
    return RunInput(files=files, records=read_timer_records(files), summary=read_timing_summary(files), run=run,
                    errors=[FileError(path, reason) for path, reason in errors])
