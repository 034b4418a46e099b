"""What the judge stage yields (plain data): findings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Finding:
    """One diagnosis, with the measured numbers that triggered it and what to do."""

    kind: str
    severity: float  # rough % of step time at stake; findings are sorted by it
    title: str
    ranks: list[int]
    evidence: str
    recommendation: str
    numbers: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None
    """How sure: 1 - p of the arrival-order test for rank findings, the share of steps above the threshold
    for per-step shares (:mod:`hf_distprof.core.verdicts`)."""
