"""The analysis as the experiment trackers get it (:class:`hf_distprof.trackers.Answer`): the box and the findings
table in Markdown, the key figures, the headline values, the table, the files.

Every value comes from the same :class:`~hf_distprof.analysis.results.result.AnalysisResult` that ``analyze --json``
prints: the headline values are its fields, the figures its numbers (``exposed_comm_pct``, ``imbalance_pct``, each
finding's severity, each what-if scenario's saving), so a tracker and ``analysis.json`` never disagree.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.tell.box import _fields, format_box, no_finding
from hf_distprof.core.names import (
    ANALYSIS_NAME,
    MANIFEST_NAME,
    MEMORY_SUMMARY_NAME,
    PARALLELISM_NAME,
    TIMING_SUMMARY_NAME,
)
from hf_distprof.trackers import Answer

FILES = ("report.html", ANALYSIS_NAME, TIMING_SUMMARY_NAME, MEMORY_SUMMARY_NAME, PARALLELISM_NAME, MANIFEST_NAME)
"""The run folder's files sent with the answer, when they are there (``report.html``: under ``report/``)."""
COLUMNS = ["finding", "ranks", "severity", "why", "what to try"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(float(value)) else None


SLOW_RANK_KINDS = ("slow_rank", "straggler", "imbalance")
"""Findings that name the rank holding the others back: with one rank's trace (no cross-rank view), the step timer's
verdict over the run is one of these, and the headline's slowest rank is the one it names."""


def figures(result: AnalysisResult) -> dict[str, float]:
    """The key figures, under ``hf_distprof/...``: the headline percentages, each finding's severity and each what-if
    scenario's predicted saving (ms and % of the step, as counted over the run)."""
    out: dict[str, float | None] = {
        "hf_distprof/exposed_comm_pct": _number(result.exposed_comm_pct),
        "hf_distprof/imbalance_pct": _number(result.imbalance_pct),
        "hf_distprof/findings": float(len(result.findings)),
    }
    for finding in result.findings:
        out[f"hf_distprof/finding/{finding.kind}_severity"] = _number(finding.severity)
    for scenario in result.what_if:
        out[f"hf_distprof/whatif/{scenario.scenario}_saving_ms"] = _number(scenario.counted_ms)
        out[f"hf_distprof/whatif/{scenario.scenario}_saving_pct"] = _number(scenario.counted_pct)
    return {k: v for k, v in out.items() if v is not None}


def headline(result: AnalysisResult) -> dict[str, str | float | int | None]:
    """The values a run is compared by: the box's verdict, the slowest rank (``cross_rank.slowest_rank``: the one a
    slow-rank finding names, else the one the what-if replays at its peers' pace), exposed communication and the largest
    saving the what-if predicts that counts (beyond the run's noise; None when none does)."""
    rows = dict(_fields(result))
    top = result.findings[0] if result.findings else None
    # The largest saving that counts (the judge's order): one within the run's noise is no prediction to compare runs
    # by (a clean run's trackers read "predicted_saving_pct 16.4" where the what-if table says "no: noise").
    best = next((s for s in result.what_if if s.beyond_noise), None)
    return {
        "verdict": rows.get("Verdict"),
        "slowest_rank": result.cross_rank.slowest_rank if result.cross_rank is not None else next(
            (f.ranks[0] for f in result.findings if f.kind in SLOW_RANK_KINDS and len(f.ranks) == 1), None),
        "top_finding": top.kind if top is not None else None,
        "exposed_comm_pct": _number(result.exposed_comm_pct),
        "predicted_saving_pct": _number(best.counted_pct) if best is not None else None,
        "predicted_saving": best.title if best is not None else None,
        "ranks": len(result.ranks),
    }


def findings_table(result: AnalysisResult) -> tuple[list[str], list[list[str | float | int | None]]]:
    """One row per finding, in the findings' own order."""
    rows: list[list[str | float | int | None]] = [
        [f.title, ", ".join(map(str, f.ranks)), round(float(f.severity), 2), f.why, f.action] for f in result.findings]
    return COLUMNS, rows


def _cell(value: Any) -> str:
    return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")


def markdown(result: AnalysisResult, run_dir: Path | None = None) -> str:
    """The box (as a code block) and the findings table, as a tracker's text panel shows them."""
    title = f"hf_distprof: {run_dir.name}" if run_dir is not None else "hf_distprof: in short"
    parts = ["```", format_box(result, title=title), "```", ""]
    columns, rows = findings_table(result)
    if rows:
        parts += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        parts += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    else:
        parts.append(no_finding(result))
    return "\n".join(parts) + "\n"


def answer(result: AnalysisResult, run_dir: Path | None, step: int) -> Answer:
    """The tracker answer of ``result``, for the run folder ``run_dir`` (its files attached when present), at
    ``step`` (the run's last step)."""
    files: list[Path] = []
    if run_dir is not None:
        for name in FILES:
            path = run_dir / ("report" if name == "report.html" else "") / name
            if path.is_file():
                files.append(path)
    return Answer(text=markdown(result, run_dir), scalars=figures(result), summary=headline(result),
                  table=findings_table(result), artifacts=files, step=step)
