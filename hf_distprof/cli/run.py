"""``hf-distprof run [profiling flags] -- COMMAND ...``: profile a training script without editing it.

COMMAND is whatever starts the training (``python train.py ...``, ``torchrun ...``, ``accelerate launch ...``, on
each node of a multi-node job alike). Every ``transformers.Trainer`` built in its processes gets the callbacks
those flags switch on (:mod:`hf_distprof.autorun`); the script's own flags go to the script untouched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from hf_distprof.autorun import command_environment
from hf_distprof.config import ProfilingArguments, add_profiling_args

PROG = "hf-distprof run"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``run`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "run",
        help="run a training command with hf_distprof's callbacks attached to every Trainer (no code change)",
        description=(
            "Run COMMAND (python script.py ..., torchrun ..., accelerate launch ...) so that every "
            "transformers.Trainer built in its processes gets hf_distprof's callbacks for the profiling flags "
            "given before '--'. The script needs no change and never sees these flags; a script that already "
            "passes hf_distprof callbacks gets no second set. Works through torchrun's and accelerate's process "
            "spawning (PYTHONPATH and HF_DISTPROF_RUN_ARGS pass to every worker); on several nodes run it on "
            "each node. Not with `python -S` or `-I`, which skip sitecustomize."
        ),
        usage="hf-distprof run [profiling flags] -- COMMAND [ARGS ...]",
    )
    add_profiling_args(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after '--'")
    return parser


def run(args: argparse.Namespace) -> int:
    """Check the flags and the command, then replace this process with COMMAND.

    Returns:
        2 on bad flags, a missing or unknown command, or no feature switched on; otherwise it does not return
        (COMMAND's exit status is the process's).
    """
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        prof = ProfilingArguments(**ProfilingArguments.namespace_fields(args))
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if not command:
        print(f"{PROG}: error: no command: hf-distprof run [profiling flags] -- COMMAND [ARGS ...]", file=sys.stderr)
        return 2
    if command[0].startswith("-"):
        print(f"{PROG}: error: unknown profiling flag {command[0]} (see `hf-distprof flags`), or '--' is missing "
              f"before the command", file=sys.stderr)
        return 2
    if not prof.any_enabled:
        print(f"{PROG}: error: no profiling flag switches anything on (e.g. --enable-profiling, "
              f"--enable-memory-logging, --enable-step-timing)", file=sys.stderr)
        return 2
    executable = shutil.which(command[0])
    if executable is None:
        missing = os.sep in command[0] and not os.path.exists(command[0])
        why = "not executable (chmod +x, or run it through bash/python)" if not missing and os.sep in command[0] \
            else "command not found"
        print(f"{PROG}: error: {why}: {command[0]}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, command, command_environment(prof))
    except OSError as err:  # e.g. a script without a #! line: "Exec format error"
        print(f"{PROG}: error: cannot run {command[0]}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0  # not reached
