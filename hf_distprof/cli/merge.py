"""``hf-distprof merge``: per-rank traces -> one gzipped Perfetto/Chrome trace with one process per rank."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
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
    from hf_distprof.core.argtypes import number

    parser = subparsers.add_parser(
        "merge",
        help="merge per-rank traces into one trace (open in ui.perfetto.dev)",
        description=(
            "Write one gzipped Chrome/Perfetto trace of all ranks: one process per rank named 'rank N', "
            "clocks aligned as analyze aligns them (--align collectives: another host by the run manifest's measured "
            "offset while the traces agree with it, else on the ends of matched collectives), by the run manifest's "
            "clock offsets measured at train start alone (--align clock; also collectives' fallback) or by wall "
            "clock (--align none)."
        ),
    )
    parser.add_argument("paths", nargs="+", help="trace files and/or folders holding them")
    parser.add_argument(
        "-o", "--output", default=DEFAULT_OUTPUT, help=f"output file (default: {DEFAULT_OUTPUT})"
    )
    parser.add_argument(
        "--align", choices=ALIGN_MODES, default="collectives", help="clock alignment (default: collectives)"
    )
    parser.add_argument(
        "--workers", type=number(int, 0, check_range=False), default=0,
        help="parallel processes (0: one per file, at most one per CPU core)",
    )
    return parser


def _among_inputs(out: Path, paths: list[str]) -> str | None:
    """Why ``out`` would replace or join the traces it merges, or None: one of the traces the paths hold (found as
    ``analyze`` finds them), or a new file named like a rank's trace (``rank3_...``, ``worker3_...``) in a folder given
    or beside a trace given, which a later ``analyze`` there would read as that rank's (a trial's merged trace written
    over rank 0's own doubled its steps)."""
    from hf_distprof.analysis.read.trace_io import NoTraceError, discover_trace_files

    target = out.resolve()
    try:
        found = [p.resolve() for p in discover_trace_files(paths)]
    except (NoTraceError, OSError):
        return None  # (said by the analysis, with its own words)
    if target in found:
        return "it is one of the traces it merges"
    folders = {Path(p).resolve() for p in paths if Path(p).is_dir()} | {f.parent for f in found}
    if _RANK_NAMED.search(target.name) and any(f == target.parent or f in target.parents for f in folders):
        return (f"it would lie among the traces it merges ({target.parent}) under a rank's trace name, which a later "
                "analyze there reads as that rank's trace; name it otherwise or write it elsewhere")
    return None


_RANK_NAMED = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?\d+.*\.json(\.gz)?$", re.IGNORECASE)  # (as analyze reads
# a rank from a trace's name: hf_distprof.analysis.read.trace_io)


def run(args: argparse.Namespace) -> int:
    """Merge and report what was written.

    Returns:
        0 on success, 1 when no trace could be read, 2 on bad options or paths or when the output
        cannot be written.
    """
    from hf_distprof.analysis import analyze_paths
    from hf_distprof.analysis.merge import write_merged
    from hf_distprof.analysis.options import AnalysisOptions, OptionValueError

    try:
        options = AnalysisOptions(workers=args.workers)
    except OptionValueError as exc:
        print(f"hf-distprof merge: error: {exc.for_flag('--' + exc.name)}", file=sys.stderr)
        return 2
    out = Path(args.output)
    problem = "Is a directory" if out.is_dir() else None if out.parent.is_dir() else "No such directory"
    problem = problem or _among_inputs(out, args.paths)
    if problem:  # checked before the analysis, which can take minutes on a large run
        print(f"hf-distprof merge: --output {args.output}: {problem}", file=sys.stderr)
        return 2
    from hf_distprof.analysis.read.run import SeveralRunsError

    try:
        result = analyze_paths(args.paths, options)
    except (FileNotFoundError, SeveralRunsError) as exc:
        print(f"hf-distprof merge: error: {exc}", file=sys.stderr)
        return 2
    try:
        res = write_merged(result, args.output, align=args.align)
    except ValueError as exc:
        print(f"hf-distprof merge: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"hf-distprof merge: --output {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for err in res.errors:
        print(f"hf-distprof merge: skipped {err.path}: {err.reason}", file=sys.stderr)
    # (rounded first: "-0.000 ms" for a shift of -0.1 us)
    shifts = ", ".join(f"rank {r}: {round(s / 1e3, 3) + 0.0:+.3f} ms" for r, s in res.shifts_us.items())
    how = (f"the run manifest's clock offsets, within {res.clock_uncertainty_us:.0f} us"
           if res.clock_uncertainty_us is not None else f"{res.matched_collectives} collectives matched")
    aligned = ("clocks as recorded (--align none)" if res.align == "none" else
               f"clocks aligned by {res.align} ({how}; shifts {shifts})")
    print(f"wrote {res.output}: {len(res.ranks)} rank{'s' if len(res.ranks) != 1 else ''}, {res.n_events} events; "
          f"{aligned}")
    return 0
