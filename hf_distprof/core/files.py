"""Files written whole or not at all, and the host name that goes into file names: torch-free, so that the analysis,
the comparison and the benchmarks write their files without importing torch.

:func:`atomic_path` writes beside the final name and renames on success; SIGTERM and SIGINT wait for the rename
(:func:`hf_distprof.core.signals.deferred`). A killed writer's temporary file carries its pid and host, so the next
run removes it (:func:`remove_stale_temp_files`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hf_distprof.core import signals

_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def get_hostname() -> str:
    """Short host name, safe to put in a file name."""
    return short_host(socket.gethostname())


def short_host(name: str) -> str:
    """``name`` as :func:`get_hostname` writes it: before its first dot, safe in a file name."""
    return _HOST_UNSAFE.sub("-", name.split(".")[0] or "host")


# In the name of every temporary file atomic_path makes: ".<final name>.~<pid>@<host>~<random>.tmp<suffix>".
TEMP_MARK = ".tmp"


# A temporary file this old is a leftover of a killed write (an export takes seconds), not a write in progress.
STALE_TEMP_AGE_S = 3600.0


# A temporary file whose writer (its pid on this host, from its name) is gone, and unchanged for this long, is a
# leftover too. The age guards against a pid reused or one in another pid namespace with the same host name.
DEAD_WRITER_AGE_S = 60.0


def _read_umask() -> int | None:
    """The process's umask from ``/proc/self/status`` (Linux 4.7+): read at each write, so a umask set after import
    counts; None where the kernel does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


def _umask_at_import() -> int:
    """The umask where ``/proc`` does not say: set and put back once, at import (racy with other threads only then)."""
    mask = _read_umask()
    if mask is None:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def file_mode() -> int:
    """The mode an ``open()`` would give a new file now. ``mkstemp`` makes its files 0600; renamed into place they would
    keep it, and colleagues who can read the run folder (a shared output folder) could not read the traces."""
    mask = _read_umask()
    return 0o666 & ~(mask if mask is not None else _UMASK_AT_IMPORT)


_WRITER = re.compile(r"\.~(?P<pid>\d+)@(?P<host>[^~/]+)~[^~/]*" + re.escape(TEMP_MARK))


@contextlib.contextmanager
def atomic_path(final: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path in ``final``'s folder; rename it onto ``final`` only on success.

    A reader never sees a half-written file under the final name. ``suffix`` lets writers that choose
    their format from the extension (``export_chrome_trace`` gzips ``*.gz``) see the right one. SIGTERM and
    SIGINT wait until the file is renamed or removed (:func:`hf_distprof.core.signals.deferred`), so a stopped
    job leaves the whole file or nothing, never the temporary one.
    """
    with signals.deferred():
        # The writer in the name: the next run on this host removes what a killed process left at once.
        writer = f"~{os.getpid()}@{get_hostname()}~"
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.{writer}", suffix=f"{TEMP_MARK}{suffix}",
                                        dir=final.parent)
        os.close(fd)
        try:
            os.chmod(tmp_name, file_mode())  # as open() would make it (mkstemp's is 0600)
        except OSError:  # a file system without modes: its own
            pass
        tmp = Path(tmp_name)
        try:
            yield tmp
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def is_temp_file(path: Path) -> bool:
    """Whether ``path`` is one of :func:`atomic_path`'s temporary files (left behind only by SIGKILL)."""
    return path.name.startswith(".") and TEMP_MARK in path.name


def _writer_gone(name: str) -> bool:
    """Whether the temporary file ``name`` was made by a process of this host that no longer runs."""
    match = _WRITER.search(name)
    if match is None or match["host"] != get_hostname() or int(match["pid"]) == os.getpid():
        return False
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive under another user, or no such pid number
        return False
    return False


def remove_stale_temp_files(
    folder: Path, older_than_s: float = STALE_TEMP_AGE_S, dead_writer_age_s: float = DEAD_WRITER_AGE_S
) -> list[Path]:
    """Delete the temporary files an earlier, killed write left in ``folder`` and its run folders.

    A file goes when its writer, a process of this host, is gone and the file is ``dead_writer_age_s`` old, or
    when it is ``older_than_s`` old whoever wrote it: a younger one may belong to a rank that is writing right now
    (another run sharing the output folder, on this host or another).

    Returns:
        The files removed.
    """
    removed: list[Path] = []
    now = time.time()
    candidates = [*folder.glob(".*"), *folder.glob("*/.*")] if folder.is_dir() else []
    for path in candidates:
        if not is_temp_file(path):
            continue
        try:
            age = now - path.stat().st_mtime
            if age < older_than_s and not (age >= dead_writer_age_s and _writer_gone(path.name)):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def atomic_write_text(final: Path, text: str) -> None:
    """Write ``text`` to ``final`` atomically (temp file in the same folder, then rename)."""
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")
