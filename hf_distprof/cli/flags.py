"""``hf-distprof flags``: print the profiling flag table in Markdown (the one in PROFILING_GUIDE.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hf_distprof.config import flags_markdown


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``flags`` on the top-level sub-parsers."""
    return subparsers.add_parser(
        "flags", help="print the profiling flags as a Markdown table",
        description="Print every profiling flag with its default, valid values and meaning, in Markdown.",
    )


def run(args: argparse.Namespace) -> int:
    """Print the table; always succeeds."""
    sys.stdout.write(flags_markdown())
    return 0
