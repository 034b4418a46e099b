"""The memory finding (pure): one rank's peak memory above its peers'."""

from __future__ import annotations

from statistics import median

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.findings import Finding
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.core.text import format_bytes
from hf_distprof.core.verdicts import imbalance_pct


def imbalance_findings(ranks: list[RankResult], options: AnalysisOptions) -> list[Finding]:
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
        allocators = ", ".join(f"{op.name} {format_bytes(op.allocated_bytes)}" for op in high.top_ops[:3])
        why = (f"peak allocated memory over the traced steps ([memory] events): rank {rank} "
               f"{format_bytes(high.peak_allocated_bytes)} on {high.device} (step {high.peak_step}) vs "
               f"{format_bytes(typical)}, the median of the other ranks: {pct:.1f}% more "
               f"(threshold {options.memory_imbalance_pct:g}%)")
        action = ("Look for work only that rank does (evaluation, logging, checkpoint saving on rank 0), "
                  "uneven batch shapes (pad to a fixed length or group by length), or tensors kept alive on one rank")
        findings.append(
            Finding(
                kind="memory_imbalance",
                # Memory costs no step time: listed after the findings that do.
                severity=0.0,
                title=f"Peak {kind} memory imbalance across ranks",
                ranks=[rank],
                evidence=f"{why}; its top allocators: {allocators}",
                recommendation=action + "; sharding optimizer state and gradients (FSDP) also evens memory out.",
                phase="memory",
                why=why,
                action=action,
                numbers={
                    "imbalance_pct": pct,
                    "max_peak_bytes": float(high.peak_allocated_bytes),
                    "typical_peak_bytes": float(typical),
                    "threshold_pct": options.memory_imbalance_pct,
                },
            )
        )
    return findings
