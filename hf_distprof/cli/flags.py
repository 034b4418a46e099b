"""``hf-distprof flags``: print the profiling flag table in Markdown (the one in PROFILING_GUIDE.md)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from hf_distprof.config import flags_markdown

START, END = "<!-- flags:start -->\n", "<!-- flags:end -->"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``flags`` on the top-level sub-parsers."""
    parser = subparsers.add_parser(
        "flags", help="print the profiling flags as a Markdown table",
        description="Print every profiling flag with its default, valid values and meaning, in Markdown.",
    )
    parser.add_argument(
        "--update", metavar="GUIDE.md", type=Path,
        help=f"instead of printing, rewrite the table between '{START.strip()}' and '{END}' in this file",
    )
    return parser


def update_guide(path: Path) -> None:
    """Replace the flag table between the markers in ``path``.

    Raises:
        ValueError: The file has no marker pair.
    """
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path}: no '{START.strip()}' ... '{END}' markers")
    path.write_text(pattern.sub(lambda _: START + flags_markdown() + END, text), encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    """Print the table, or rewrite it in a guide."""
    if args.update is None:
        sys.stdout.write(flags_markdown())
        return 0
    try:
        update_guide(args.update)
    except (OSError, ValueError) as err:
        print(f"hf-distprof flags: {err}", file=sys.stderr)
        return 1
    return 0
