"""A rank that dies leaves its stack: ``faulthandler`` writes every thread's Python stack into ``rank{R}_crash.txt``
in the run folder when the process gets a fatal signal (SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL), and the file is
removed at a clean exit when nothing was written. ``hf-distprof hang-report RUN_FOLDER`` reads these files beside the
hang dumps and says which rank died, of what, where (:mod:`hf_distprof.runs.hang_report`).

Armed on every rank of a run with any hf_distprof flag, as soon as its run folder exists
(:func:`hf_distprof.paths.run_dir`). A script that enabled ``faulthandler`` itself (``python -X faulthandler``,
``PYTHONFAULTHANDLER``) keeps it where it pointed it: this module then leaves it alone.
"""

from __future__ import annotations

import atexit
import faulthandler
from pathlib import Path
from typing import IO

from hf_distprof import dist
from hf_distprof.core import signals
from hf_distprof.core.names import CRASH_NAME

logger = dist.get_logger(__name__)

_FILE: IO[str] | None = None
_PATH: Path | None = None


def record_crashes(run_dir: Path, rank: int) -> Path | None:
    """Have ``faulthandler`` write this process's stacks into ``run_dir / rank{R}_crash.txt`` on a fatal signal.

    A later run folder in the same process takes the file over (the earlier one is closed, and removed when empty).

    Returns:
        The file, or None when the script enabled ``faulthandler`` itself or the file cannot be opened (one line in
        the log).
    """
    global _FILE, _PATH
    path = run_dir / CRASH_NAME.format(rank=rank)
    if _PATH == path:
        return path
    if _FILE is None and faulthandler.is_enabled():
        return None  # the script's own: it points where the user asked
    finish()
    try:
        handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to its descriptor
    except OSError as err:
        logger.warning(f"cannot write {path}: {err!r}; a crash of this rank would leave no stack")
        return None
    faulthandler.enable(file=handle, all_threads=True)
    _FILE, _PATH = handle, path
    return path


def finish() -> None:
    """Stop recording (a clean exit, or a new run folder): the file is closed, and removed when it is empty."""
    global _FILE, _PATH
    if _FILE is None or _PATH is None:
        return
    faulthandler.disable()
    handle, path = _FILE, _PATH
    _FILE = _PATH = None
    try:
        handle.close()
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:  # the folder is gone or read-only now: nothing to tidy
        pass


def current() -> Path | None:
    """The crash file this process writes into, if any."""
    return _PATH


atexit.register(finish)  # a clean exit (dist.finish runs the atexit handlers too) leaves no empty file
signals.at_default_death(finish)  # so does a rank stopped by SIGTERM through our handlers: stopped, not crashed
