"""The guide's command reference is the parsers' own: every option of every subcommand, generated and compared."""

from __future__ import annotations

import re

from hf_distprof.cli.flags import CLI_END, CLI_START, commands_markdown
from hf_distprof.cli.main import SUBCOMMANDS

from ..conftest import REPO_ROOT


def test_the_guide_lists_every_subcommand_option_as_the_parsers_do():
    text = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    match = re.search(re.escape(CLI_START) + r"(.*?)" + re.escape(CLI_END), text, re.S)
    assert match, "PROFILING_GUIDE.md has no <!-- commands:start --> ... <!-- commands:end --> section"
    assert match.group(1) == commands_markdown(), "stale: run `hf-distprof flags --update PROFILING_GUIDE.md`"


def test_the_reference_names_each_subcommand_and_its_options():
    text = commands_markdown()
    assert [line[len("#### `hf-distprof "):-1] for line in text.splitlines() if line.startswith("#### ")] == [
        name.replace("_", "-") for name in SUBCOMMANDS]
    for option in ("`--findings`", "`--top-kernels`", "`--warmup-steps`", "`--timeout`", "`--update`",
                   "`--commands`", "`--bandwidth-ref`"):
        assert f"| {option}" in text, option
    # Switches show no default; options with a value show it.
    assert "| `--json` |  |" in text and "| `--workers` | `0` |" in text
