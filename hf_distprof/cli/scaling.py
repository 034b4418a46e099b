"""``hf-distprof scaling``: run the training at 1, 2, 4, ... processes and tabulate how it scales.

Each process count runs once, for ``--steps`` optimizer steps, into its own folder ``<output-dir>/nproc{N}``;
the step timer's files there give the step time, throughput and gradient-sync share, and
:mod:`hf_distprof.runs.scaling` turns them into speedup and efficiency. The command is our training script under
``torchrun`` by default, or any command template after ``--`` with these placeholders:

- ``{nproc}`` (required): the process count;
- ``{output_dir}`` (required): the run's folder; the command must make the step timer write there
  (``--profiler-output-dir {output_dir}`` for scripts that use hf_distprof's flags);
- ``{steps}``: ``--steps``; ``{batch}``: the per-rank batch (``--batch-size`` under weak scaling,
  ``--batch-size / nproc`` under strong scaling, which therefore needs it).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any
from hf_distprof.core.argtypes import number
from hf_distprof.runs.scaling_launch import (
    DEFAULT_SCRIPT, PLACEHOLDERS, default_template, fill, launch, per_rank_batch)


_positive = number(int, 1)
_steps = number(int, 2, why=" (the first step is the warm-up, left out)")  # the step timer leaves step 1 out


def _nprocs(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"must be distinct integers >= 1 separated by commas, got {text!r}")
    return sorted(values)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``scaling`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    from hf_distprof.runs.scaling import MODES

    parser = subparsers.add_parser(
        "scaling",
        help="scaling study: run at 1, 2, 4, ... processes; step time, throughput, speedup, efficiency",
        description=(
            "Run the training at each process count for --steps steps (our training script under torchrun, or "
            "the command template after --, with {nproc} and {output_dir}, optionally {steps} and {batch}), "
            "read the step timer's files and print step time, throughput, speedup, efficiency and gradient-sync "
            "share per process count; write scaling.csv, scaling.json and scaling.png (the curve next to the "
            "ideal line) into --output-dir. Exit status 0 when every run finished and was read."
        ),
        epilog="example: hf-distprof scaling --nprocs 1,2 --steps 20 -- torchrun --nproc_per_node {nproc} "
        "train.py --enable-step-timing --max-steps {steps} --profiler-output-dir {output_dir}",
    )
    parser.add_argument("--nprocs", type=_nprocs, default=[1, 2], metavar="N,N,...",
                        help="process counts to run (default: 1,2)")
    parser.add_argument("--steps", type=_steps, default=20, metavar="K",
                        help="optimizer steps per run, 2 or more; the first (warm-up) is left out (default: 20)")
    parser.add_argument("--mode", choices=MODES, default="weak",
                        help="weak: fixed per-rank batch (default); strong: fixed global batch")
    parser.add_argument("--batch-size", type=_positive, default=8, metavar="B",
                        help="per-rank batch (weak) or global batch (strong, divisible by every N) (default: 8)")
    parser.add_argument("--output-dir", default="./outputs/scaling", metavar="DIR",
                        help="where nproc{N}/ and the table, CSV, JSON and PNG go (default: ./outputs/scaling)")
    earlier = parser.add_mutually_exclusive_group()  # replace the earlier runs, or read them: not both
    earlier.add_argument("--overwrite", action="store_true", help="replace nproc{N}/ folders left by an earlier study")
    earlier.add_argument("--reuse", action="store_true",
                         help="run nothing: read the nproc{N}/ run folders already in --output-dir")
    parser.add_argument("--timeout", type=_positive, default=3600, metavar="S",
                        help="seconds one run may take (default: 3600)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after --: the command template (default: our training script under torchrun)")
    parser.set_defaults(scaling_parser=parser)  # run() reports bad combinations of flags through it
    return parser


def _template(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        if not DEFAULT_SCRIPT.is_file():
            parser.error(f"no command template after -- and the default training script {DEFAULT_SCRIPT} is missing")
        return default_template()
    if len(command) == 1 and " " in command[0]:
        command = shlex.split(command[0])
    joined = " ".join(command)
    for needed in ("{nproc}", "{output_dir}"):
        if needed not in joined:
            parser.error(f"the command template must contain {needed} (placeholders: {', '.join(PLACEHOLDERS)})")
    if args.mode == "strong" and "{batch}" not in joined:
        parser.error("--mode strong needs {batch} in the command template, so that the per-rank batch shrinks "
                     "as the process count grows")
    return command


def run(args: argparse.Namespace) -> int:
    """Run (or read) every process count, then print and write the table.

    Returns:
        0 when every run finished and was read, 1 when a run failed or its files cannot be read, 2 on a bad
        option (argparse) or when the output cannot be written.
    """
    from hf_distprof.core.names import SCALING_RUN_DIR
    from hf_distprof.runs.load import RunFolderError, load_run
    from hf_distprof.runs.scaling import format_scaling, point_from_run, scaling_result
    from hf_distprof.runs.scaling_report import write_scaling_files

    parser: argparse.ArgumentParser = args.scaling_parser
    if args.mode == "strong":
        bad = [n for n in args.nprocs if args.batch_size % n]
        if bad:
            parser.error(f"--batch-size {args.batch_size} (the global batch under --mode strong) must be divisible "
                         f"by every process count in --nprocs; it is not by {bad}")
    if args.reuse and [c for c in args.command if c != "--"]:
        parser.error("--reuse runs nothing: it reads the runs already in --output-dir, so a command after -- would be "
                     "ignored; leave out one or the other")
    template = None if args.reuse else _template(args, parser)
    root = Path(args.output_dir).absolute()
    points = []
    for nproc in args.nprocs:
        run_dir = root / SCALING_RUN_DIR.format(nproc=nproc)
        if template is not None:
            if run_dir.exists() and any(run_dir.iterdir()):
                if not args.overwrite:
                    print(f"hf-distprof scaling: error: {run_dir} holds an earlier run; pass --overwrite to replace "
                          "it or --reuse to read it", file=sys.stderr)
                    return 2
                shutil.rmtree(run_dir)
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # (a file in the way, a read-only place)
                print(f"hf-distprof scaling: error: --output-dir {args.output_dir}: {exc.strerror or exc}",
                      file=sys.stderr)
                return 2
            command = fill(template, nproc, run_dir, args.steps, per_rank_batch(args.mode, args.batch_size, nproc))
            print(f"hf-distprof scaling: {nproc} process(es): {shlex.join(command)}", file=sys.stderr, flush=True)
            failure = launch(command, run_dir, args.timeout)
            if failure is not None:
                print(f"hf-distprof scaling: error: the run with {nproc} process(es) {failure}", file=sys.stderr)
                return 1
        try:
            points.append(point_from_run(load_run(run_dir), nproc))
        except (RunFolderError, ValueError) as exc:
            print(f"hf-distprof scaling: error: {exc}", file=sys.stderr)
            return 2 if args.reuse else 1  # --reuse: a folder given that holds no run, as a missing path elsewhere
    result = scaling_result(points, args.mode)
    print(format_scaling(result))
    try:
        files = write_scaling_files(result, root)
    except OSError as exc:
        print(f"hf-distprof scaling: cannot write into {root}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in files.values())}", file=sys.stderr)
    return 0
