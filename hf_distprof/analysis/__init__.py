"""Trace analysis: trace I/O -> parsed events -> pure analyzers -> report. Never imports transformers.

Public API::

    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_findings

    result = analyze_paths(["runs/20260101-120000"], AnalysisOptions(comm_bound_pct=25))
    print(format_findings(result))
    result.exposed_comm_pct, result.imbalance_pct   # headline numbers
    result.to_dict()                                  # JSON-ready

Every name is resolved on first use: importing one stage (the compact writer in a training rank imports
``hf_distprof.analysis.read.compact``) loads that stage only, never the judge, the words or the plots.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "AnalysisOptions": "hf_distprof.analysis.options",
    "AnalysisResult": "hf_distprof.analysis.results.result",
    "CpuBreakdown": "hf_distprof.analysis.results.rank",
    "CrossRankResult": "hf_distprof.analysis.results.across",
    "FileError": "hf_distprof.analysis.results.rank",
    "Finding": "hf_distprof.analysis.results.findings",
    "GpuBreakdown": "hf_distprof.analysis.results.rank",
    "RankResult": "hf_distprof.analysis.results.rank",
    "StepResult": "hf_distprof.analysis.results.rank",
    "TraceReadError": "hf_distprof.analysis.read.trace_io",
    "analyze_paths": "hf_distprof.analysis.api",
    "analyze_ranks": "hf_distprof.analysis.api",
    "format_box": "hf_distprof.analysis.tell.box",
    "format_findings": "hf_distprof.analysis.tell.text",
    "format_summary": "hf_distprof.analysis.tell.text",
}

__all__ = [
    "AnalysisOptions",
    "AnalysisResult",
    "CpuBreakdown",
    "CrossRankResult",
    "FileError",
    "Finding",
    "GpuBreakdown",
    "RankResult",
    "StepResult",
    "TraceReadError",
    "analyze_paths",
    "analyze_ranks",
    "format_box",
    "format_findings",
    "format_summary",
]

if TYPE_CHECKING:
    from hf_distprof.analysis.api import analyze_paths, analyze_ranks
    from hf_distprof.analysis.options import AnalysisOptions
    from hf_distprof.analysis.read.trace_io import TraceReadError
    from hf_distprof.analysis.results.across import CrossRankResult
    from hf_distprof.analysis.results.findings import Finding
    from hf_distprof.analysis.results.rank import CpuBreakdown, FileError, GpuBreakdown, RankResult, StepResult
    from hf_distprof.analysis.results.result import AnalysisResult
    from hf_distprof.analysis.tell.box import format_box
    from hf_distprof.analysis.tell.text import format_findings, format_summary


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_distprof.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
