"""The analysis outputs kept as references (``tests/data/golden/expected``): what ``analyze`` prints and writes for a
fixed set of runs, so that a change to how the analysis is organised cannot change what it says unnoticed.

Each case is analysed in-process (one worker) and rendered as ``analyze --json``, the text of ``analyze`` (the
summary and the box) and of ``analyze --findings``; one case also as ``report.md``. Paths are written relative to
their root (``<data>`` for ``tests/data``, ``<shared>`` for ``../shared``), so the references hold on any checkout.

``python -m tests.golden`` rewrites the references from the code as it is: do that only for a change that is meant
to change what the analysis says, and name each such change in the commit.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box, format_findings, format_summary

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared"
EXPECTED = DATA / "golden" / "expected"


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    report: bool = False
    """Whether ``report.md`` is kept too (matplotlib makes its figures: a few seconds)."""

    @property
    def shared(self) -> bool:
        return SHARED in self.folder.parents


CASES = (
    Case("cpu_slow_data", DATA / "golden" / "cpu_slow_data", report=True),
    Case("cpu_clean_memory", DATA / "golden" / "cpu_clean_memory"),
    Case("clean", DATA / "clean"),
    Case("slow_rank1", DATA / "slow_rank1"),
    Case("slow_data", DATA / "slow_data"),
    Case("fsdp2", DATA / "fsdp2"),
    Case("gpu_float_ts", DATA / "gpu_float_ts"),
    Case("dlrm_8gpu_v100", SHARED / "traces" / "dlrm_8gpu_v100", report=True),
)


def _relative(text: str) -> str:
    for root, name in ((SHARED.resolve(), "<shared>"), (DATA.resolve(), "<data>"), (SHARED, "<shared>"),
                       (DATA, "<data>")):
        text = text.replace(str(root), name)
    return text


def render(case: Case, *, read_compact: bool = True) -> dict[str, str]:
    """The outputs of one case: file name -> text."""
    result = analyze_paths([case.folder], AnalysisOptions(workers=1), read_compact=read_compact)
    out = {
        f"{case.name}.json": result.to_json().decode() + "\n",
        f"{case.name}.txt": format_summary(result) + "\n\n" + format_box(result) + "\n",
        f"{case.name}.findings.txt": format_findings(result) + "\n",
    }
    if case.report:
        from hf_distprof.analysis.tell.report import write_report

        with tempfile.TemporaryDirectory() as tmp:
            write_report(result, tmp)
            out[f"{case.name}.report.md"] = (Path(tmp) / "report.md").read_text()
    return {name: _relative(text) for name, text in out.items()}


def main() -> int:
    EXPECTED.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        if not case.folder.is_dir():
            print(f"skipped {case.name}: {case.folder} is not there", file=sys.stderr)
            continue
        for name, text in render(case).items():
            (EXPECTED / name).write_text(text)
            print(f"wrote {EXPECTED / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
