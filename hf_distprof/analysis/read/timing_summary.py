"""The step timer's ``timing_summary.json`` beside the traces, read once: the profiler's slowdown and the timer's
slow-rank verdict over the untraced steps, as the run wrote them at train end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_distprof.analysis.results.timer import TimingSummary
from hf_distprof.core import names
from hf_distprof.core.advice import loader_from_json
from hf_distprof.core.stats import finite


def read_timing_summary(files: list[str]) -> TimingSummary:
    """Each trace folder's ``timing_summary.json``, read once; a file that cannot be read or parsed is skipped, a field
    edited by hand or written by another tool (a wrong type) is ignored, as an unreadable file is."""
    out = TimingSummary()
    for folder in sorted({Path(f).parent for f in files}):
        try:
            doc = json.loads((folder / names.TIMING_SUMMARY_NAME).read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
            continue
        if not isinstance(doc, dict):
            continue
        if out.profiler_slowdown is None:
            out.profiler_slowdown = _slowdown_json(doc.get("profiler_slowdown"))
        if out.imbalance_verdict is None and isinstance(doc.get("imbalance_verdict"), dict):
            out.imbalance_verdict = doc["imbalance_verdict"]
        if not out.gpu_health:
            out.gpu_health = _gpu_health(doc.get("gpu_health"))
        if out.loader is None:
            out.loader = loader_from_json(doc.get("dataloader"))
    return out


def _slowdown_json(doc: Any) -> dict[str, Any] | None:
    """``profiler_slowdown`` when every field the analysis reads has its type, else None."""
    if not isinstance(doc, dict) or not doc:
        return None

    def number(key: str, optional: bool = True) -> bool:
        value = doc.get(key)
        return optional if value is None else finite(value) is not None

    def count(key: str) -> bool:
        value = doc.get(key)
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)

    warning = doc.get("warning")
    if not (number("ratio") and number("threshold_ratio", optional=False) and number("confidence")
            and number("noise_pct") and all(count(k) for k in ("steps_inside", "steps_before", "steps_after"))):
        return None
    if not (doc.get("note") is None or isinstance(doc.get("note"), str)):
        return None
    if not (warning is None or isinstance(warning, str)):
        return None
    if warning and not (number("ratio", optional=False) and doc["ratio"] > 0):  # the finding divides by it
        return None
    return dict(doc)


def _gpu_health(doc: Any) -> dict[int, dict[str, Any]]:
    """``gpu_health`` by rank, each sample with an integer SM clock; anything else left out."""
    if not isinstance(doc, dict):
        return {}
    out = {}
    for rank, sample in doc.items():
        if isinstance(rank, str) and rank.isdigit() and isinstance(sample, dict) \
                and isinstance(sample.get("sm_clock_mhz"), int) and not isinstance(sample["sm_clock_mhz"], bool):
            out[int(rank)] = sample
    return out
