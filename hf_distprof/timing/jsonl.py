"""A rank's JSON-lines file (``timing_rank{R}.jsonl``, ``memory_rank{R}.jsonl``), open for the whole run.

A file that cannot be opened, written or closed (a full disk, a folder gone) is one warning; training, and the
collectives every rank must reach after a write, go on.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from hf_distprof import dist

logger = dist.get_logger(__name__)


class JsonlFile:
    """Lines appended to ``path``, each write flushed.

    Args:
        path: The file (appended to: a run resumed into its folder adds to it).
        lost: What the warning says becomes of the figures when the file is given up ("step timing goes to the logs
            only").
    """

    def __init__(self, path: Path, lost: str) -> None:
        self.path = path
        self._lost = lost
        self.file: IO[str] | None = None
        try:
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115  # open for the whole run
        except OSError as err:
            logger.warning(f"cannot write {path}: {err!r}; {lost}")

    def write(self, text: str) -> None:
        """Append ``text`` (whole lines) and flush it; a failure is one warning, and the file is given up."""
        if self.file is None:
            return
        try:
            self.file.write(text)
            self.file.flush()
        except OSError as err:
            logger.warning(f"cannot write {self.path}: {err!r}; {self._lost}")
            self.close()

    def close(self) -> None:
        """Close the file; a close that fails (flushing onto a full disk) is one warning. Safe to call twice."""
        file, self.file = self.file, None
        if file is None:
            return
        try:
            file.close()
        except OSError as err:
            logger.warning(f"cannot close {self.path}: {err!r}; its last lines may be missing")
