"""``hf-distprof hang-report``: which rank the others wait for, from ``--hang-timeout``'s per-rank dumps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``hang-report`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "hang-report",
        help="which rank a hung run waits for (the --hang-timeout stack dumps), and which rank died, of what, where",
        description=(
            "Read hang_rank<R>_<host>.txt (and flight_recorder_rank<R>_<host>.pkl) in a run folder and say which "
            "ranks are inside a collective, which is not, and where that one is stuck; and read rank<R>_crash.txt "
            "(every rank of a run with an hf_distprof flag writes its stacks there when it dies of a fatal signal) "
            "and say which rank died, of what signal, where; and read rank<R>_exception.txt (the traceback of an "
            "uncaught exception that ended a rank) and rank<R>_stopped.txt (when a signal, SIGTERM, stopped a rank, "
            "and where) and say which rank raised or was stopped first, what, where."
        ),
    )
    parser.add_argument("run_folder", help="the run folder holding the dumps")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the report.

    Returns:
        0 with a report, 2 when the folder holds no dump, crash file, exception file or stop file, or one
            cannot be read.
    """
    from hf_distprof.runs.hang_report import hang_report

    try:
        report = hang_report(Path(args.run_folder))
    except (FileNotFoundError, ValueError) as exc:
        print(f"hf-distprof hang-report: error: {exc}", file=sys.stderr)
        return 2
    print(report.text, end="")
    return 0
