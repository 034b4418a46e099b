"""Where a cross-rank report is shown while training runs: TensorBoard scalars and the Trainer's logs; and at train end
``timing_summary.json`` and the table.

Rank 0 calls these on logging steps with the report of the steps since the previous logging step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_distprof import dist, paths, tensorboard
from hf_distprof.timing.report import PHASE_KEYS, CrossRankReport, format_table

logger = dist.get_logger(__name__)

# Per-rank series written as timing/<key>/rank{R}.
PER_RANK_KEYS: tuple[str, ...] = PHASE_KEYS


def custom_scalars_layout() -> dict[str, dict[str, list[Any]]]:
    """TensorBoard custom-scalars layout: one chart per phase with a line per rank.

    TensorBoard reads one layout per run folder, so whoever writes another layout into the same folder
    must merge it with this one.
    """
    timing: dict[str, list[Any]] = {
        f"{key} per rank": ["Multiline", [rf"^timing/{key}/rank\d+$"]] for key in PER_RANK_KEYS
    }
    timing["imbalance % (pre-sync time, step time, peak memory)"] = [
        "Multiline",
        [r"^timing/(imbalance_pct|step_imbalance_pct|memory_imbalance_pct)$"],
    ]
    timing["step_s mean/min/max"] = ["Multiline", [r"^timing/step_s/(mean|min|max)$"]]
    throughput = {
        "samples/s per rank": ["Multiline", [r"^throughput/samples_per_s/rank\d+$"]],
        "tokens/s per rank": ["Multiline", [r"^throughput/tokens_per_s/rank\d+$"]],
        "all ranks": ["Multiline", [r"^throughput/(samples_per_s|tokens_per_s|mfu_pct)$"]],
    }
    return {"hf_distprof timing": timing, "hf_distprof throughput": throughput}


def write_scalars(writer: Any, report: CrossRankReport, step: int) -> None:
    """Write the report as ``timing/...`` and ``throughput/...`` scalars at ``step``.

    Args:
        writer: A ``torch.utils.tensorboard.SummaryWriter``.
        report: The cross-rank report of the steps since the previous logging step.
        step: The Trainer's ``global_step``.
    """
    scalars: dict[str, float] = {}
    for r in report.ranks:
        for key in PER_RANK_KEYS:
            value = getattr(r, key)
            if value is not None:
                scalars[f"timing/{key}/rank{r.rank}"] = value
        scalars[f"throughput/samples_per_s/rank{r.rank}"] = r.samples_per_s
        scalars[f"throughput/tokens_per_s/rank{r.rank}"] = r.tokens_per_s
    scalars["timing/step_s"] = report.step_mean_s  # the name the console and the other trackers give it
    scalars["timing/step_s/mean"] = report.step_mean_s
    scalars["timing/step_s/min"] = report.step_min_s
    scalars["timing/step_s/max"] = report.step_max_s
    scalars["timing/imbalance_pct"] = report.imbalance_pct
    scalars["timing/step_imbalance_pct"] = report.step_imbalance_pct
    scalars["timing/slowest_rank"] = report.slowest_rank
    if report.memory_imbalance_pct is not None:
        scalars["timing/memory_imbalance_pct"] = report.memory_imbalance_pct
    scalars["throughput/samples_per_s"] = report.samples_per_s
    scalars["throughput/tokens_per_s"] = report.tokens_per_s
    if report.mfu_pct is not None:
        scalars["throughput/mfu_pct"] = report.mfu_pct
    tensorboard.add_scalars(writer, scalars, step)


def headline_figures(report: CrossRankReport) -> dict[str, float | int]:
    """The few figures added to the Trainer's logs on a logging step (console, ``trainer_state.json``)."""
    figures: dict[str, float | int] = {
        "timing/step_s": round(report.step_mean_s, 4),
        "timing/imbalance_pct": round(report.imbalance_pct, 1),
        "timing/slowest_rank": report.slowest_rank,
        "throughput/samples_per_s": round(report.samples_per_s, 2),
        "throughput/tokens_per_s": round(report.tokens_per_s, 1),
    }
    if report.memory_imbalance_pct is not None:
        figures["timing/memory_imbalance_pct"] = round(report.memory_imbalance_pct, 1)
    if report.mfu_pct is not None:
        # Significant figures, not decimals: a small model on a CPU runs at well under 0.01% of a peak.
        figures["throughput/mfu_pct"] = float(f"{report.mfu_pct:.3g}")
    return figures


def end_of_run(run_dir: Path | None, summary: dict[str, Any], report: CrossRankReport, comm: Any,
               event: Callable[[str], None] = lambda warning: None) -> None:
    """Rank 0 at train end: ``timing_summary.json`` into the run folder, the table on stdout, its warnings logged and
    each sent on as an ``event`` (the live warnings' tag in TensorBoard and the trackers, at the last step: the stalls,
    the profiler's slowdown and the final verdict are said at train end only, and reached no tracker)."""
    if run_dir is not None:
        paths.atomic_write_text(run_dir / paths.TIMING_SUMMARY_NAME, json.dumps(summary, indent=2) + "\n")
    where = run_dir if run_dir is not None else "no run folder, no files"
    print(format_table(report, comm, title=f"hf_distprof step timing ({where})"), flush=True)
    for warning in report.warnings:
        logger.warning(warning)
        event(warning)

