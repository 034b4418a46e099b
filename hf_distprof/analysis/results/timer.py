"""What the step timer wrote beside the traces (plain data, read once by :mod:`hf_distprof.analysis.read`): its
per-step records (``timing_rank{R}.jsonl``) and its end-of-run summary (``timing_summary.json``).

A trace holds a few steps; the step timer measured every step of the same run, on every rank, into the same run
folder. What the analysis takes from these rows (each traced step's wait for a CPU, the steps inside and outside the
window, the run's own slow-rank evidence) is computed once, across ranks
(:func:`hf_distprof.analysis.across.evidence.timer_figures`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_distprof.core.advice import LoaderSettings


@dataclass
class TimerRecords:
    """Every rank's step records, by step (a step written twice keeps its last row)."""

    rows: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    """rank -> step -> the row."""
    warmup: set[int] = field(default_factory=set)
    """Steps the timer left out as its warm-up (the first of each ``train()`` call) or as the step after a checkpoint,
    an evaluation or a profiler window's export (``after_pause``: it waits for the slowest rank's), on any rank."""
    traced: set[int] = field(default_factory=set)
    """Steps the profiler ran over (warmup and active phases) by the rows' own marks; empty in older files."""
    busy: set[int] = field(default_factory=set)
    """Untraced steps during which the profiler was still busy with a written trace (its compact summary's thread
    takes the GIL): left out of the verdict and of the profiler's slowdown, on neither side."""
    marked: bool = False
    """Whether every row carries the ``traced`` / ``warmup`` marks (files of this version)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of each records file left out: it breaks the rule it is read by (a garbled line)."""


@dataclass
class TimingSummary:
    """What the analysis takes from the ``timing_summary.json`` files in the traces' folders."""

    profiler_slowdown: dict[str, Any] | None = None
    """The first folder's ``profiler_slowdown`` whose fields the analysis reads all have their types; None without."""
    imbalance_verdict: dict[str, Any] | None = None
    """The first folder's ``imbalance_verdict`` (the step timer's slow-rank verdict); None without."""
    loader: LoaderSettings | None = None
    """The training DataLoader's settings (``dataloader``), which the data-loading advice does not ask for again."""
    gpu_health: dict[int, dict[str, Any]] = field(default_factory=dict)
    """rank -> its GPU as NVML saw it at train end (``gpu_health``: SM clock, throttle reasons ...); empty off GPUs."""
