"""``hf-distprof flags``: print the profiling flag table in Markdown (the one in PROFILING_GUIDE.md)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from hf_distprof.config import flags_markdown
from hf_distprof.core.text import markdown_table

START, END = "<!-- flags:start -->\n", "<!-- flags:end -->"
CLI_START, CLI_END = "<!-- commands:start -->\n", "<!-- commands:end -->"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``flags`` on the top-level sub-parsers."""
    parser = subparsers.add_parser(
        "flags", help="print the profiling flags as a Markdown table",
        description="Print every profiling flag with its default, valid values and meaning, in Markdown.",
    )
    parser.add_argument(
        "--update", metavar="GUIDE.md", type=Path,
        help="instead of printing, rewrite in this file the flag table between its flags:start/flags:end comment "
             "markers, and the subcommands' options between commands:start/commands:end where it has them",
    )
    parser.add_argument("--commands", action="store_true",
                        help="print every subcommand's options (Markdown) instead of the profiling flags")
    return parser


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def commands_markdown() -> str:
    """Every ``hf-distprof`` subcommand's arguments and options as Markdown, from the real parser.

    ``run`` takes the profiling flags (the flag table); only its own arguments are listed here.
    """
    import argparse
    import dataclasses

    from hf_distprof.cli.main import build_parser
    from hf_distprof.config import ProfilingArguments

    profiling = {f.name for f in dataclasses.fields(ProfilingArguments)}
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    out: list[str] = []
    for name, sub in subparsers.choices.items():
        out += [f"#### `hf-distprof {name}`", "", _cell(helps.get(name) or ""), ""]
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if name == "run" and action.dest in profiling:
                continue
            flag = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
            switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            default = "" if (switch or action.default in (None, argparse.SUPPRESS) or action.required
                             or not action.option_strings) else f"`{action.default}`"
            text = (action.help or "") % {"default": action.default} if action.help else ""
            rows.append([flag, default, _cell(text)])
        out += markdown_table(["argument", "default", "meaning"], rows)
        if name == "run":
            out.append("| every profiling flag | | as in the flag table above |")
        out.append("")
    return "\n".join(out)


def update_guide(path: Path) -> None:
    """Replace the flag table between the markers in ``path``, and the subcommands' options where it has them.

    Raises:
        ValueError: The file has no flag-table marker pair.
    """
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path}: no '{START.strip()}' ... '{END}' markers")
    text = pattern.sub(lambda _: START + flags_markdown() + END, text)
    commands = re.compile(re.escape(CLI_START) + r".*?" + re.escape(CLI_END), re.S)
    text = commands.sub(lambda _: CLI_START + commands_markdown() + CLI_END, text)
    path.write_text(text, encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    """Print the table, or rewrite it in a guide."""
    if args.update is None:
        sys.stdout.write(commands_markdown() if args.commands else flags_markdown())
        return 0
    try:
        update_guide(args.update)
    except (OSError, ValueError) as err:
        print(f"hf-distprof flags: {err}", file=sys.stderr)
        return 1
    return 0
