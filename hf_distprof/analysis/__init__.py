"""Trace analysis: trace I/O -> parsed events -> pure analyzers -> report. Never imports transformers.

Public API::

    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_findings

    result = analyze_paths(["runs/20260101-120000"], AnalysisOptions(comm_bound_pct=25))
    print(format_findings(result))
    result.exposed_comm_pct, result.imbalance_pct   # headline numbers
    result.to_dict()                                  # JSON-ready
"""

from __future__ import annotations

from hf_distprof.analysis.api import analyze_paths
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.read.trace_io import TraceReadError
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import Finding
from hf_distprof.analysis.results.rank import CpuBreakdown, FileError, GpuBreakdown, RankResult, StepResult
from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.tell.box import format_box
from hf_distprof.analysis.tell.text import format_findings, format_summary

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
    "format_box",
    "format_findings",
    "format_summary",
]
