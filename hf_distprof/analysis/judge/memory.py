"""The memory finding (pure): one rank's peak memory above its peers'."""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.facts import MemoryFacts
from hf_distprof.analysis.results.findings import Judgement
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.verdicts import imbalance_pct


def imbalance_findings(ranks: list[RankResult], options: AnalysisOptions) -> list[Judgement]:
    """A finding per device type on which one rank's peak exceeds the median of the others' peaks by more
    than ``options.memory_imbalance_pct`` (:func:`hf_distprof.core.verdicts.imbalance_pct`, the live step
    timer's peak-memory rule). Ranks are compared by the highest peak over their devices of that type.

    Args:
        ranks: Per-rank results; those without ``[memory]`` events are left out.
        options: The threshold.

    Returns:
        The findings; empty with fewer than two ranks holding memory events of a device type.
    """
    findings = []
    for kind in sorted({d.kind for r in ranks for d in r.memory}):
        peaks = {
            r.rank: max((d for d in r.memory if d.kind == kind), key=lambda d: d.peak_allocated_bytes)
            for r in ranks
            if any(d.kind == kind for d in r.memory)
        }
        if len(peaks) < 2:
            continue
        pct = imbalance_pct([float(d.peak_allocated_bytes) for d in peaks.values()])
        if pct <= options.memory_imbalance_pct:
            continue
        # The first highest, the rank imbalance_pct measures.
        rank, high = max(peaks.items(), key=lambda item: item[1].peak_allocated_bytes)
        typical = median(d.peak_allocated_bytes for r, d in peaks.items() if r != rank)
        findings.append(
            Judgement(
                kind="memory_imbalance",
                # Memory costs no step time: listed after the findings that do.
                severity=0.0,
                ranks=[rank],
                facts=MemoryFacts(kind, rank, high, typical, pct, options.memory_imbalance_pct),
                phase="memory",
                numbers={
                    "imbalance_pct": pct,
                    "max_peak_bytes": float(high.peak_allocated_bytes),
                    "typical_peak_bytes": float(typical),
                    "threshold_pct": options.memory_imbalance_pct,
                },
            )
        )
    return findings
