"""The reliability table quoted in DEVELOPING.md agrees with the faults the suite injects and their file counts.

The integration rows need 2-rank runs to produce, so only their presence and the totals line are checked here; the
1-rank rows are rebuilt from ``test_profiler_signals``'s own table of moments and expected files.
"""

from __future__ import annotations

import re

from .. import reliability
from ..conftest import REPO_ROOT
from .test_profiler_signals import EXPECTED, MOMENTS, SIGNALS

INTEGRATION_FAULTS = (
    "SIGTERM to torchrun mid-window", "SIGTERM to torchrun during an export", "rank 1 killed (SIGKILL) mid-window",
    "exception on rank 1 mid-window", "resume from a checkpoint", "disk full during export",
    "output folder read-only mid-run", "output folder read-only from the start",
)


def guide_table() -> list[str]:
    text = (REPO_ROOT / "DEVELOPING.md").read_text(encoding="utf-8")
    section = text[text.index("## Fault injection: the reliability table"):]
    start = section.index("| fault injected |")
    return section[start:section.index("\n\n", start)].splitlines()


def test_the_guide_quotes_every_one_rank_signal_row_as_the_suite_prints_it():
    rows = [reliability.Row(f"{signame} {MOMENTS[moment]} (1 rank)", True, len(files), len(files), 0)
            for signame in SIGNALS for moment, files in EXPECTED.items()]
    printed = reliability.table(rows).splitlines()[2:-1]  # without the header and the totals line
    quoted = guide_table()
    assert [line for line in quoted if "(1 rank)" in line] == printed


def test_the_guide_quotes_every_two_rank_fault_and_its_totals_add_up():
    source = (REPO_ROOT / "tests" / "integration" / "test_reliability.py").read_text(encoding="utf-8")
    assert [fault for fault in INTEGRATION_FAULTS if f'"{fault}' not in source] == []  # the labels the tests record
    quoted = guide_table()
    assert [line.split(" | ")[0][2:] for line in quoted if "(2 ranks)" in line] == [
        f"{fault} (2 ranks)" for fault in INTEGRATION_FAULTS]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in quoted[2:-1]]
    totals = re.fullmatch(r"\| \*\*(\d+) faults\*\* \| \*\*(\d+) survived\*\* \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|",
                          quoted[-1])
    assert totals is not None, quoted[-1]
    assert [int(x) for x in totals.groups()] == [
        len(cells), sum(c[1] == "yes" for c in cells), *(sum(int(c[i]) for c in cells) for i in (2, 3, 4, 5))]
