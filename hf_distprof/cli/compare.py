"""``hf-distprof compare RUN_A RUN_B``: two run folders side by side, with what changed beyond their noise."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from hf_distprof.core.argtypes import NonNegativeInt, PositiveFloat
from hf_distprof.core.difference import MIN_EFFECT_PCT


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``compare`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "compare",
        help="compare two runs: per-rank phases, throughput, comm, imbalance, memory, with significance",
        description=(
            "Compare two run folders (the step timer's timing_rank{R}.jsonl and timing_summary.json, the memory "
            "logger's files and the trace analysis when present): step time, each phase, throughput, gradient "
            "sync, imbalance and memory per rank, side by side with deltas (B - A), which differences are beyond "
            "both runs' step-to-step noise, and what changed most. Exit status 0 when both folders were read."
        ),
    )
    parser.add_argument("run_a", metavar="RUN_A", help="the baseline run folder")
    parser.add_argument("run_b", metavar="RUN_B", help="the run folder compared with it")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    parser.add_argument("--report", metavar="DIR", help="also write compare.md, compare.json, compare_phases.png")
    parser.add_argument(
        "--significant-only", action="store_true", help="show only the significant rows in the table"
    )
    parser.add_argument(
        "--warmup-steps",
        type=NonNegativeInt,
        default=None,
        metavar="N",
        help="steps left out at the start of each run (default: what timing_summary.json says, else 1)",
    )
    parser.add_argument(
        "--min-effect-pct",
        type=PositiveFloat,
        default=MIN_EFFECT_PCT,
        metavar="PCT",
        help="smallest change of a median, in %% of run A's, that can be significant (default: %(default)g); raise it "
        "above the drift between two identical runs on your machine (on a busy shared machine one rank's phase drifted "
        "by 23%%)",
    )
    parser.add_argument(
        "--traces",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="analyse a run folder's traces when it has no analysis.json, to compare the traced steps' compute, "
        "communication and data loading (default: on)",
    )
    return parser


def _no_folder_there(report: str) -> str | None:
    """Why no report folder can be made at ``report``, without making it (a comparison that fails leaves nothing
    behind): a file in the way, or its nearest existing folder not writable; None when it can."""
    import os
    from pathlib import Path

    path = Path(report).absolute()
    if path.exists():
        return None if path.is_dir() and os.access(path, os.W_OK) else (
            "File exists" if not path.is_dir() else "Permission denied")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return "Not a directory"
    return None if os.access(parent, os.W_OK | os.X_OK) else "Permission denied"


def run(args: argparse.Namespace) -> int:
    """Compare and print.

    Returns:
        0 when both runs were read and compared, 2 when a folder is not a readable run folder or the report
        cannot be written.
    """
    from hf_distprof.runs.compare import compare_runs
    from hf_distprof.runs.compare_report import format_comparison
    from hf_distprof.analysis.api import analysis_document
    from hf_distprof.runs.load import RunFolderError, load_run

    analyze = analysis_document if args.traces else None
    if args.report:  # checked before the runs are read and compared, not after the table is printed
        problem = _no_folder_there(args.report)
        if problem:
            print(f"hf-distprof compare: error: --report {args.report}: {problem}", file=sys.stderr)
            return 2
    if os.path.realpath(args.run_a) == os.path.realpath(args.run_b):
        print("hf-distprof compare: note: A and B are the same folder: nothing can differ", file=sys.stderr)
    try:
        a = load_run(args.run_a, args.warmup_steps, analyze)
        b = load_run(args.run_b, args.warmup_steps, analyze)
    except RunFolderError as exc:
        print(f"hf-distprof compare: error: {exc}", file=sys.stderr)
        return 2
    for run in (a, b):
        empty = _nothing_to_compare(run, args.warmup_steps)
        if empty:
            print(f"hf-distprof compare: error: {empty}", file=sys.stderr)
            return 2
    try:
        comparison = compare_runs(a, b, args.min_effect_pct)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # The JSON summaries beside the timing files (timing_summary.json, memory_summary.json, analysis.json)
        # are read as this tool writes them; one edited by hand or written by another tool lands here.
        print(f"hf-distprof compare: error: {args.run_a} or {args.run_b}: a summary file holds a value of the "
              f"wrong type ({exc!r})", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(comparison.to_json(), indent=2))
    else:
        print(format_comparison(comparison, args.significant_only))
    if args.report:
        from hf_distprof.runs.compare_report import write_compare_report

        try:
            path = write_compare_report(comparison, args.report)
        except OSError as exc:
            print(f"hf-distprof compare: error: --report {args.report}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"report written to {path}", file=sys.stderr)
    return 0


def _nothing_to_compare(run: Any, warmup_flag: int | None) -> str | None:
    """Why ``run`` has no step to compare, or None: every step left out (the warm-up, profiler windows), so that the
    comparison's "no significant difference" would be about nothing."""
    if any(run.counted(rank) for rank in run.ranks):
        return None
    numbers = [int(r["step"]) for rank in run.ranks for r in run.steps[rank]]
    if not numbers:
        return f"{run.path}: its timing files hold no step"
    held = f"its records hold steps {min(numbers)}-{max(numbers)}"
    if warmup_flag is not None and max(numbers) - min(numbers) < warmup_flag:
        return (f"{run.path}: --warmup-steps {warmup_flag} leaves no step to compare ({held}); give a smaller "
                "--warmup-steps")
    return (f"{run.path}: no step to compare ({held}, each the warm-up ({run.warmup_steps} step(s)), inside a profiler "
            "window or right after a pause); run more steps after the window")
