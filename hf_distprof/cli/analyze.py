"""``hf-distprof analyze``: per-rank traces -> breakdowns, stragglers and ranked findings."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

from hf_distprof.analysis.options import MESSAGE_SIZES, AnalysisOptions, OptionValueError
from hf_distprof.core.argtypes import number
from hf_distprof.core.text import flag_name

# Options that are not thresholds get their own flags below.
_NOT_THRESHOLDS = ("workers", "progress")
# The options' argparse types only parse (text that is not a number fails with the valid range): the range
# itself is checked by AnalysisOptions, for the API's callers too.


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``analyze`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "analyze",
        help="analyse per-rank profiler traces (GPU/NCCL or CPU/gloo)",
        description=(
            "Analyse the Kineto traces of a distributed run (one file per rank, .json or .json.gz): "
            "per-step time breakdowns, communication overlap, stragglers, load imbalance and ranked "
            "findings. Exit status 0 when at least one trace was analysed."
        ),
    )
    parser.add_argument("paths", nargs="+", help="trace files and/or folders holding them")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON instead of text")
    parser.add_argument(
        "--findings", action="store_true",
        help="print only the headline, the findings (with the questions left undecided and the profiler's slowdown) "
        "and the box: what the demo ends with",
    )
    parser.add_argument(
        "--report", metavar="DIR", help="also write report.md/report.html/PNGs/analysis.json to DIR"
    )
    parser.add_argument(
        "--bandwidth-ref",
        metavar="FILE",
        help="a CSV of hf-distprof bench-collectives: set each collective's transfer time against the benchmark's "
        "busbw at the nearest size, to tell time lost to a slow network from waiting for a late peer",
    )
    parser.add_argument(
        "--workers", type=number(int, 0, check_range=False), default=0,
        help="parallel processes (0: one per file, at most one per CPU core, when the traces are 16 MiB or more on "
        "disk in all; else one)",
    )
    parser.add_argument(
        "--no-compact",
        dest="read_compact",
        action="store_false",
        help="read every trace's JSON, ignoring the compact files beside them (<trace>.compact.msgpack, written at "
        "export); the result is the same either way",
    )
    parser.add_argument(
        "--write-compact",
        action="store_true",
        help="write a compact file beside each trace that has no usable one (with --no-compact: beside every "
        "trace), so that the next analyze of these traces reads it instead of the JSON",
    )
    parser.add_argument(
        "--log-to",
        action="append",
        choices=("tensorboard", "wandb", "mlflow", "trackio"),
        metavar="{tensorboard,wandb,mlflow,trackio}",
        help="also send the answer (box, findings table, key figures, report.html and the summaries) to this tracker, "
        "after the fact: into the run --log-to-run names, else a new run named after the run folder (TensorBoard: "
        "RUN/tensorboard); repeat for several. Needs the tracker's library (pip install -e \".[trackers]\")",
    )
    parser.add_argument(
        "--log-to-run", metavar="ID", help="with --log-to: the tracker's run to add the answer to (W&B run id, MLflow "
        "run id, Trackio run name)",
    )
    parser.add_argument(
        "--log-to-project", metavar="NAME", help="with --log-to and no --log-to-run: the project (W&B, Trackio) or "
        "experiment (MLflow) of the new run (default: where the Trainer would put it)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: shown for 8+ files on a terminal)",
    )
    thresholds = parser.add_argument_group("thresholds")
    for f in dataclasses.fields(AnalysisOptions):
        if f.name in _NOT_THRESHOLDS:
            continue
        choices = MESSAGE_SIZES if f.name == "message_sizes" else None
        thresholds.add_argument(
            flag_name(f.name),
            type=str if choices else number(float if f.default is None else type(f.default), 0, check_range=False,
                                            above=f.name == "profiler_slowdown_threshold"),  # (its range is > 0)
            default=f.default,
            choices=choices,
            metavar="{" + ",".join(choices) + "}" if choices else "N",
            # argparse %-formats help strings: a literal % must be doubled.
            help=f"{f.metadata['help']} (default: {f.metadata.get('default_text', f.default)})".replace("%", "%%"),
        )
    return parser


def options_from_args(args: argparse.Namespace) -> AnalysisOptions:
    """Build :class:`AnalysisOptions` from parsed arguments (one field per flag)."""
    return AnalysisOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(AnalysisOptions)})


def run(args: argparse.Namespace) -> int:
    """Run the analysis and print it.

    Returns:
        0 when at least one rank was analysed, 1 when none could be, 2 on bad options or paths or when the
        report cannot be written.
    """
    from hf_distprof.analysis import analyze_paths  # the words after: imported while the workers read the traces
    from hf_distprof.analysis.read.run import SeveralRunsError

    for needs, flag in (("log_to_run", "--log-to-run"), ("log_to_project", "--log-to-project")):
        if getattr(args, needs) and not args.log_to:  # (it was ignored, the answer sent nowhere)
            print(f"hf-distprof analyze: error: {flag} says where --log-to sends the answer: it needs --log-to "
                  "TRACKER", file=sys.stderr)
            return 2
    try:
        options = options_from_args(args)
    except OptionValueError as exc:
        print(f"hf-distprof analyze: error: {exc.for_flag(flag_name(exc.name))}", file=sys.stderr)
        return 2
    reference = None
    if args.bandwidth_ref:
        from hf_distprof.collectives.bench import load_reference

        try:
            reference = load_reference(args.bandwidth_ref)
        except (OSError, ValueError) as exc:
            print(f"hf-distprof analyze: error: --bandwidth-ref: {exc}", file=sys.stderr)
            return 2
    made = bool(args.report) and not Path(args.report).exists()  # taken back if the analysis stops with an error
    if args.report:  # checked before the analysis, which can take minutes on a large run
        problem = unwritable_folder(Path(args.report))
        if problem:
            print(f"hf-distprof analyze: --report {args.report}: {problem}", file=sys.stderr)
            return 2
    try:
        result = analyze_paths(
            args.paths, options, read_compact=args.read_compact, write_compact=args.write_compact,
            reference=reference, reference_file=args.bandwidth_ref,
        )
    except (FileNotFoundError, SeveralRunsError) as exc:
        print(f"hf-distprof analyze: error: {exc}", file=sys.stderr)
        if made:
            with contextlib.suppress(OSError):
                Path(args.report).rmdir()  # empty: nothing was written
        return 2
    if args.json:
        sys.stdout.write(result.to_json().decode() + "\n")
    else:
        from hf_distprof.analysis import format_box, format_findings, format_summary

        print(format_findings(result) if args.findings else format_summary(result))
        if result.ranks:
            print("\n" + format_box(result))  # what a person reads first: last, under the tables
    for err in result.errors:
        print(f"hf-distprof analyze: skipped {err.path}: {err.reason}", file=sys.stderr)
    for text in result.run.missing_files if result.run is not None else []:
        print(f"hf-distprof analyze: warning: {text}", file=sys.stderr)
    if args.report:
        from hf_distprof.analysis.tell.report import write_report

        try:
            path = write_report(result, args.report)
        except OSError as exc:
            print(f"hf-distprof analyze: --report {args.report}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"report written to {path}", file=sys.stderr)
    if not result.ranks:
        print("hf-distprof analyze: error: no trace could be analysed", file=sys.stderr)
        return 1
    status = 0
    for tracker in args.log_to or []:
        said = log_to(result, args, tracker)
        print(f"hf-distprof analyze: {said}", file=sys.stderr)
        if said.startswith((f"{tracker}: skipped:", f"{tracker}: failed:")):
            status = 1  # asked for and not sent: a script that checks the status must see it
    return status


def unwritable_folder(folder: Path) -> str | None:
    """Why ``folder`` cannot take files (made if missing), or None: a file of that name, a parent that cannot hold it,
    no permission to write in it."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def run_folder(paths: list[str]) -> Path:
    """The run folder of the analysed paths: the first folder given, else the first trace's folder."""
    first = Path(paths[0])
    return first if first.is_dir() else first.parent


def log_to(result: Any, args: argparse.Namespace, tracker: str) -> str:
    """Send ``result``'s answer to ``tracker`` (``--log-to``), at the run's last step (``timing_summary.json``'s, else
    the last traced step); one line says where it went."""
    import json

    from hf_distprof import trackers
    from hf_distprof.analysis.tell.tracker import answer
    from hf_distprof.core.names import TIMING_SUMMARY_NAME

    folder = run_folder(args.paths)
    step = 0
    try:
        step = int(json.loads((folder / TIMING_SUMMARY_NAME).read_text()).get("last_step") or 0)
    except (OSError, ValueError, TypeError):
        step = max((s.step for r in result.ranks for s in r.steps), default=0)
    return trackers.send_after_the_fact(tracker, answer(result, folder, step), folder, run_id=args.log_to_run,
                                        project=args.log_to_project)
