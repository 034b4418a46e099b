"""What the analysis says is kept (``tests/golden.py``): ``analyze --json``, its text, its findings and the report of
a fixed set of runs (two real 2-rank CPU runs with the step timer's records, the committed traces, the shared 8-GPU
traces) equal the references in ``tests/data/golden/expected``, byte for byte, from the JSON and from the compact
files alike."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from tests.conftest import require
from tests.golden import CASES, EXPECTED, Case, render


def _same(name: str, got: str) -> None:
    want = (EXPECTED / name).read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "got", n=1))
        pytest.fail(f"{name} differs from its reference (python -m tests.golden rewrites them):\n{diff[:6000]}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_analysis_says_what_it_said(case: Case) -> None:
    if case.shared:
        require(case.folder.is_dir(), f"the shared traces are not at {case.folder}")
    for name, text in render(case).items():
        _same(name, text)


def test_the_compact_files_say_the_same(tmp_path: Path) -> None:
    """The CPU runs read from compact files (written on a first read of the JSON) give the same outputs."""
    from hf_distprof.analysis import AnalysisOptions, analyze_paths

    for case in CASES[:2]:
        folder = tmp_path / case.name
        shutil.copytree(case.folder, folder)
        analyze_paths([folder], AnalysisOptions(workers=1), write_compact=True)
        assert sorted(p.name for p in folder.glob("*.compact.msgpack")) == [
            f"rank{r}_vm_step8-10.pt.trace.json.gz.compact.msgpack" for r in (0, 1)]
        copy = Case(case.name, folder)
        got = render(copy)
        for name in (f"{case.name}.json", f"{case.name}.findings.txt"):
            _same(name, got[name].replace(str(tmp_path), "<data>/golden"))
