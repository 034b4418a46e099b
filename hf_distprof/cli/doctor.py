"""``hf-distprof doctor``: its command line; the checks themselves are :mod:`hf_distprof.doctor`."""

from __future__ import annotations

import argparse
from typing import Any

from hf_distprof.core.argtypes import number
from hf_distprof.doctor import CHECKS, runner


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "doctor",
        help="check a distributed setup (run it under torchrun or accelerate launch)",
        description=(
            "Check ranks, versions, environment, memory, point-to-point links, collectives and clock skew on "
            "every rank; rank 0 prints each check as ✓ or ✗. Every check is bounded by --timeout. Exit status "
            f"0 when no check failed, 1 when one did, 2 on bad arguments. Checks, in order: {', '.join(CHECKS)}."
        ),
    )
    parser.add_argument("--timeout", type=number(float, 0, above=True), default=30.0, metavar="SECONDS",
                        help="time allowed to each check, on every rank (default: 30)")
    parser.add_argument("--expect-world-size", type=number(int, 0, above=True), default=None, metavar="N",
                        help="world size the init check requires (default: $WORLD_SIZE, 1 without a launcher)")
    parser.add_argument("--min-free-gb", type=number(float, 0), default=1.0, metavar="GB",
                        help="device memory (host memory on CPU) each rank must have free (default: 1.0)")
    parser.add_argument("--max-skew-ms", type=number(float, 0, above=True), default=500.0, metavar="MS",
                        help="largest clock offset of a rank from rank 0 that passes (default: 500)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="process group backend (default: nccl with CUDA, else gloo)")
    parser.add_argument("--json", metavar="PATH", help="rank 0 also writes the results to PATH")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the checks on this rank (every rank of the launch runs this command).

    Returns:
        The exit status (:func:`hf_distprof.doctor.runner.run`).
    """
    return runner.run(args)
