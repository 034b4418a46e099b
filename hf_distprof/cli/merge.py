"""``hf-distprof merge``: per-rank traces -> one gzipped Perfetto/Chrome trace with one process per rank."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_OUTPUT = "merged.pt.trace.json.gz"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``merge`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    from hf_distprof.analysis.merge import ALIGN_MODES

    parser = subparsers.add_parser(
        "merge",
        help="merge per-rank traces into one trace (open in ui.perfetto.dev)",
        description=(
            "Write one gzipped Chrome/Perfetto trace of all ranks: one process per rank named 'rank N', "
            "clocks aligned on the ends of matched collectives (--align collectives) or by wall clock "
            "(--align none)."
        ),
    )
    parser.add_argument("paths", nargs="+", help="trace files and/or folders holding them")
    parser.add_argument(
        "-o", "--output", default=DEFAULT_OUTPUT, help=f"output file (default: {DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--align", choices=ALIGN_MODES, default="collectives", help="clock alignment (default: collectives)"
    )
    parser.add_argument("--workers", type=int, default=0, help="parallel processes (0: one per core)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Merge and report what was written.

    Returns:
        0 on success, 1 when no trace could be read, 2 on bad paths.
    """
    from hf_distprof.analysis.merge import merge_traces
    from hf_distprof.analysis.model import AnalysisOptions

    try:
        res = merge_traces(
            args.paths, args.output, align=args.align, options=AnalysisOptions(workers=args.workers)
        )
    except FileNotFoundError as exc:
        print(f"hf-distprof merge: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"hf-distprof merge: error: {exc}", file=sys.stderr)
        return 1
    for err in res.errors:
        print(f"hf-distprof merge: skipped {err.path}: {err.reason}", file=sys.stderr)
    shifts = ", ".join(f"rank {r}: {s / 1e3:+.3f} ms" for r, s in res.shifts_us.items())
    print(
        f"wrote {res.output}: {len(res.ranks)} ranks, {res.n_events} events; clocks aligned by {res.align}"
        f" ({res.matched_collectives} collectives matched; shifts {shifts})"
    )
    return 0
