"""Where hf_distprof's log records go: every record in ``rank{R}.log``, warnings on the console of the rank.

Python drops a record before any handler sees it when its logger's effective level is above the record's (a
script that calls ``logging.basicConfig()`` with no level leaves the root at WARNING), and its last-resort console
handler runs only when no handler exists anywhere up the tree: once ``rank{R}.log`` hangs on the root logger, a
script that configured no logging would print no warning of ours at all. So, once a run folder exists, the
``hf_distprof`` logger gets a router (:class:`_Router`) and stops propagating; the router then

- hands every record that the application's levels let through to the root logger's handlers, exactly as
  propagation would have (the application's console and files, ``rank{R}.log``, Python's last resort);
- writes our records that the application's levels drop (INFO under a WARNING root) to ``rank{R}.log`` only;
- prints WARNING and ERROR to stderr itself when the root has handlers but none of them may print (only files,
  null handlers, in-memory streams: the case where Python's last resort stays silent) and nobody put a console
  handler on our logger, so a warning is printed once, never twice.

The ``hf_distprof`` logger is set to INFO only when nobody set its level: ``logging.getLogger("hf_distprof")
.setLevel(logging.WARNING)`` keeps INFO out of the log file too.

Records of ours come before the file: ``build_callbacks`` and ``hf-distprof run``'s attach line run when the Trainer
is built, the run folder (and so ``rank{R}.log``) exists only at train start. The router is installed as soon as
callbacks are built (:func:`route_package_logs`), and while no rank log is open it keeps every record of ours (at
most :data:`PENDING_MAX`, the newest) besides handling it as above; the file, once opened, starts with them.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from pathlib import Path
from typing import TextIO

PACKAGE_LOGGER = "hf_distprof"
# The rank is in every message of ours already ("[RANK n] ..."), from dist.RankPrefixAdapter.
CONSOLE_FORMAT = "%(asctime)s hf_distprof %(levelname)s: %(message)s"
# Records of ours kept while no rank{R}.log is open (the Trainer is built before its run folder exists): a bound, so
# that a process that never opens one (a run folder that could not be created) does not grow.
PENDING_MAX = 1000


class RankLogHandler(logging.FileHandler):
    """The per-rank log file; a write that fails (full disk) is said once on stderr, not once per record."""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            sys.stderr.write(f"hf_distprof: cannot write {self.baseFilename}: {error!r}; its records are dropped\n")


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(CONSOLE_FORMAT))

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass


def _console_streams() -> tuple[object, ...]:
    return (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


def _is_console(handler: logging.Handler) -> bool:
    """Whether ``handler`` may print: anything but a file, a null handler or a stream into memory (a test's capture).
    A handler of another kind (rich's, absl's) counts: better no copy of ours than two."""
    if isinstance(handler, (logging.FileHandler, logging.NullHandler, _Router)):
        return False
    if isinstance(handler, logging.StreamHandler):
        return getattr(handler, "stream", None) in _console_streams()
    return True


def has_console_handler(logger: logging.Logger) -> bool:
    """Whether a handler on ``logger`` may print to the console (see :func:`_is_console`)."""
    return any(_is_console(h) for h in logger.handlers)


class _Router(logging.Handler):
    """The one handler on the ``hf_distprof`` logger once it stops propagating (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.rank_log: logging.Handler | None = None
        self.console = _Stderr()
        # The level we gave the package logger (INFO), so that it does not count as the application's.
        self.our_level: int | None = None
        # Records of ours while no rank log is open, for the next one (see the module's docstring).
        self.pending: deque[logging.LogRecord] = deque(maxlen=PENDING_MAX)

    def application_level(self, name: str) -> int:
        """The effective level the application left for logger ``name``, without our INFO on the package."""
        package, root = logging.getLogger(PACKAGE_LOGGER), logging.getLogger()
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None and logger is not root:
            level = logger.level
            if level != logging.NOTSET and not (logger is package and level == self.our_level):
                return level
            logger = logger.parent
        return root.level  # NOTSET there lets everything through, as Python does

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if record.levelno >= self.application_level(record.name):
            self._propagate(root, record)
            package = logging.getLogger(PACKAGE_LOGGER)
            if (record.levelno >= logging.WARNING and root.handlers and not has_console_handler(root)
                    and not has_console_handler(package)):
                self.console.handle(record)
        elif self.rank_log is not None:
            self.rank_log.handle(record)
        if self.rank_log is None:
            self.pending.append(record)

    def to_rank_log(self, record: logging.LogRecord) -> None:
        """``record`` into the rank log only: now when one is open, else when the next one opens."""
        if self.rank_log is not None:
            self.rank_log.handle(record)
        else:
            self.pending.append(record)

    def _propagate(self, root: logging.Logger, record: logging.LogRecord) -> None:
        """What propagation to the root would have done: its handlers (rank{R}.log among them), Python's last
        resort when there are none. A handler that sits on the package logger as well (pytest puts its capture
        handlers on every logger that does not propagate) saw the record already. As in propagation, the root's
        own filters and ``disabled`` do not apply to a child's record."""
        ours = logging.getLogger(PACKAGE_LOGGER).handlers
        handlers = [h for h in root.handlers if h not in ours]
        for handler in handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
        if not handlers and len(ours) == 1 and logging.lastResort is not None:
            if record.levelno >= logging.lastResort.level:
                logging.lastResort.handle(record)

    def flush(self) -> None:
        for handler in (self.rank_log, self.console):
            if handler is not None:
                handler.flush()


_ROUTER = _Router()


def route_package_logs() -> None:
    """Install the router on the ``hf_distprof`` logger (idempotent); INFO records of ours are created from now on."""
    package = logging.getLogger(PACKAGE_LOGGER)
    # A handler the application put on our logger itself gets what it got before: no INFO of ours forced on it.
    own_handlers = any(h is not _ROUTER for h in package.handlers)
    if _ROUTER not in package.handlers:
        package.addHandler(_ROUTER)
    package.propagate = False
    if package.level == logging.NOTSET and not own_handlers:
        package.setLevel(logging.INFO)
        _ROUTER.our_level = logging.INFO


def unroute_package_logs() -> None:
    """Undo :func:`route_package_logs` (tests; a process that closes its rank log)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    package.removeHandler(_ROUTER)
    package.propagate = True
    if _ROUTER.our_level is not None and package.level == _ROUTER.our_level:
        package.setLevel(logging.NOTSET)
    _ROUTER.our_level = None
    _ROUTER.pending.clear()


def record_in_rank_log(name: str, level: int, message: str) -> None:
    """A record of logger ``name`` (under ``hf_distprof``) for ``rank{R}.log`` only, for a message the console has
    had another way (``hf-distprof run``'s attach line, written to stderr before any logging is set up): written
    now when the file is open, else at the top of the file when it opens. A level set on our logger holds."""
    route_package_logs()
    logger = logging.getLogger(name)
    if logger.isEnabledFor(level):
        _ROUTER.to_rank_log(logger.makeRecord(name, level, "(hf_distprof)", 0, message, (), None))


def discard_pending() -> None:
    """Forget the records kept for a rank log not yet opened (tests: each starts without the last one's)."""
    _ROUTER.pending.clear()


_RANK_LOG: RankLogHandler | None = None


def open_rank_log(path: Path, rank: int, host: str) -> Path | None:
    """Copy this process's log records into ``path`` (``rank{R}.log``), the rank and host on every line.

    A handler on the root logger, so the training script's, the Trainer's and hf_distprof's records all go
    there, at the levels the script configured, hf_distprof's at INFO whatever the root's level (the console
    is left as it is). A later run folder in the same process takes the file over. The file starts with the
    records of ours kept while none was open (see the module's docstring).

    Returns:
        The log file, or None when it could not be opened (then ``OSError`` was raised to the caller).

    Raises:
        OSError: The file cannot be opened.
    """
    global _RANK_LOG
    route_package_logs()
    if _RANK_LOG is not None:
        if _RANK_LOG.baseFilename == str(path.absolute()):
            return path
        close_rank_log()
    handler = RankLogHandler(path, encoding="utf-8", delay=False)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} {host} %(levelname)s %(name)s: %(message)s"))
    # Our records from before the file (the callbacks and the attach line come with the Trainer, the file at train
    # start) open it, in the order they came.
    while _ROUTER.pending:
        handler.handle(_ROUTER.pending.popleft())
    logging.getLogger().addHandler(handler)
    _RANK_LOG = handler
    _ROUTER.rank_log = handler
    return path


def close_rank_log() -> None:
    """Detach and close the rank log file, if one is open."""
    global _RANK_LOG
    if _RANK_LOG is None:
        return
    logging.getLogger().removeHandler(_RANK_LOG)
    try:
        _RANK_LOG.close()
    except (OSError, ValueError):  # its file failed (full disk, closed under it): nothing left to flush
        pass
    _RANK_LOG = None
    _ROUTER.rank_log = None


def rank_log_handler() -> RankLogHandler | None:
    """The open rank log handler, if any."""
    return _RANK_LOG
