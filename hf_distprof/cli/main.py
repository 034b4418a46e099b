"""Entry point of the ``hf-distprof`` console script.

Every subcommand lives in its own module under ``hf_distprof.cli`` and exposes two functions:
``add_parser(subparsers)``, which registers its sub-parser, and ``run(args) -> int``, which does the
work and returns the exit status. ``SUBCOMMANDS`` lists them in the order ``--help`` shows them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from hf_distprof._version import __version__

# Module names under hf_distprof.cli; each one registers itself on the sub-parser.
SUBCOMMANDS: tuple[str, ...] = (
    "run", "flags", "analyze", "merge", "hang_report", "doctor", "bench_collectives", "compare", "scaling",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand registered, or only one.

    Args:
        only: A subcommand's module name (``hang_report`` for ``hang-report``): only its module is imported and
            registered, so that running one subcommand loads only its own code; None registers every one.

    Returns:
        The parser; each sub-parser sets ``func`` to its module's ``run``.
    """
    parser = argparse.ArgumentParser(
        prog="hf-distprof",
        description="Profile distributed Hugging Face Trainer runs and analyse their traces.",
    )
    parser.add_argument("--version", action="version", version=f"hf-distprof {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS if only is None else (only,):
        module = importlib.import_module(f"hf_distprof.cli.{name}")
        sub = module.add_parser(subparsers)
        sub.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hf-distprof``.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The process exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    named = argv[0].replace("-", "_") if argv else None
    parser = build_parser(named if named in SUBCOMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, with its usage (the top-level one's named no subcommand's flags)
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        chosen = subparsers.choices.get(argv[0]) if argv else None  # (``run`` has a positional named ``command``)
        (chosen or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # the last buffered lines: a reader that went away shows here, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_gone():
            raise  # another pipe (a worker process's, a launched command's): a real error, with its traceback
        # The reader went away (``hf-distprof analyze RUN | head``): stop quietly, as Unix tools do, with the status
        # a shell gives a command that SIGPIPE ended; stdout goes to /dev/null so the flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # SIGPIPE


def _stdout_gone() -> bool:
    """Whether standard output's reader has closed it (a pipe without a reader), as opposed to another pipe of ours:
    writing what it still holds fails again, or polling it reports the error (POSIX)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() (Windows), or no file descriptor
        return False


if __name__ == "__main__":
    sys.exit(main())
