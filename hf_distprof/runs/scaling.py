"""The maths of a scaling study: one run per process count -> step time, throughput, speedup, efficiency.

Pure functions over :class:`~hf_distprof.runs.load.RunData`; no process is launched here (that is
``hf_distprof.cli.scaling``). Definitions, with ``n0`` the smallest process count of the study:

- **step time**: the median over steps (warm-up left out) of the slowest rank's step;
- **throughput**: samples (tokens) of all ranks over the counted steps / the sum of those steps' times;
- **speedup**: ``throughput(n) / throughput(n0)``;
- **efficiency**: ``speedup / (n / n0)``. Under weak scaling (fixed per-rank batch) that is
  ``throughput(n) / (n/n0 * throughput(n0))``: the share of the ideal linear gain that was kept. Under strong
  scaling (fixed global batch) the throughput ratio is the step-time ratio, so it is the classic
  ``t(n0) / t(n) / (n/n0)``;
- **comm share**: the median over steps of the ranks' mean gradient-sync time (backward minus backward
  compute, waiting for slower ranks included) in % of the step.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from hf_distprof.runs.compare import step_value
from hf_distprof.runs.load import RunData

MODES = ("weak", "strong")


@dataclass
class ScalingPoint:
    """One process count of the study."""

    nproc: int
    steps: int
    """Steps counted (warm-up and profiled steps left out, steps every rank recorded)."""
    step_s: float
    samples_per_s: float
    tokens_per_s: float | None
    per_rank_batch: float
    """Median samples per step on one rank."""
    global_batch: float
    """Median samples per step over all ranks."""
    comm_pct: float | None
    """Gradient-sync share of the step (None when backward compute was not measured)."""
    probe_comm_pct: float | None = None
    """``--measure-comm-overhead``'s ``no_sync`` A/B, when the run measured it."""
    speedup: float = 1.0
    efficiency_pct: float = 100.0
    run_dir: str = ""


@dataclass
class ScalingResult:
    """The study: one point per process count, smallest first."""

    mode: str
    base_nproc: int
    points: list[ScalingPoint]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def point_from_run(run: RunData, nproc: int) -> ScalingPoint:
    """Step time, throughput and comm share of one run (speedup and efficiency are set by :func:`scaling_result`).

    Args:
        run: The run of ``nproc`` processes.
        nproc: Its process count (checked against the ranks that wrote timing files).

    Returns:
        The point.

    Raises:
        ValueError: The run's ranks are not ``0..nproc-1``, or no step was recorded by every rank.
    """
    if run.ranks != list(range(nproc)):
        raise ValueError(f"{run.path}: timing files of ranks {run.ranks}, expected ranks 0..{nproc - 1}")
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank in run.ranks:
        for record in run.counted(rank):
            by_step.setdefault(int(record["step"]), []).append(record)
    rows = [records for _, records in sorted(by_step.items()) if len(records) == nproc]
    if not rows:
        raise ValueError(f"{run.path}: no step after the warm-up was recorded by every rank; run more steps")
    times = [max(float(r["step_s"]) for r in records) for records in rows]
    total = sum(times)
    samples: list[float] = [sum(float(r.get("samples", 0) or 0) for r in records) for records in rows]
    tokens: list[float] = [sum(float(r.get("tokens", 0) or 0) for r in records) for records in rows]
    comm: list[float] = []
    for records, step_s in zip(rows, times):
        syncs = [step_value(r, "sync_s") for r in records]
        if step_s > 0 and all(s is not None for s in syncs):
            comm.append(100.0 * sum(s or 0.0 for s in syncs) / len(syncs) / step_s)
    measured = (run.summary or {}).get("comm_overhead") or {}
    # A probe whose difference is within its passes' spread measured nothing: left empty, not a number.
    probe = measured.get("overhead_pct") if measured.get("resolved", True) is not False else None
    return ScalingPoint(
        nproc=nproc,
        steps=len(rows),
        step_s=median(times),
        samples_per_s=sum(samples) / total if total > 0 else 0.0,
        tokens_per_s=sum(tokens) / total if total > 0 and sum(tokens) > 0 else None,
        per_rank_batch=median(float(r.get("samples", 0) or 0) for records in rows for r in records),
        global_batch=median(samples),
        comm_pct=median(comm) if len(comm) == len(rows) else None,
        probe_comm_pct=float(probe) if probe is not None else None,
        run_dir=str(run.path),
    )


def scaling_result(points: list[ScalingPoint], mode: str = "weak") -> ScalingResult:
    """Speedup and efficiency of every point against the smallest process count.

    Args:
        points: One point per process count.
        mode: ``weak`` (fixed per-rank batch) or ``strong`` (fixed global batch): says which batch must not
            change between the points; a note says when it did.

    Returns:
        The study, smallest process count first.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, ``points`` is empty, or a process count repeats.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not points:
        raise ValueError("a scaling study needs at least one run")
    points = sorted(points, key=lambda p: p.nproc)
    if len({p.nproc for p in points}) != len(points):
        raise ValueError(f"process counts repeat: {[p.nproc for p in points]}")
    base = points[0]
    for p in points:
        p.speedup = p.samples_per_s / base.samples_per_s if base.samples_per_s > 0 else 0.0
        p.efficiency_pct = 100.0 * p.speedup / (p.nproc / base.nproc)
    notes = []
    fixed, what = ("per_rank_batch", "per-rank batch") if mode == "weak" else ("global_batch", "global batch")
    sizes = sorted({float(getattr(p, fixed)) for p in points})
    if len(sizes) > 1:
        notes.append(
            f"{mode} scaling keeps the {what} fixed, but it was {', '.join(f'{s:g}' for s in sizes)} across the "
            "runs: speedup and efficiency compare different workloads"
        )
    return ScalingResult(mode=mode, base_nproc=base.nproc, points=points, notes=notes)


def _opt(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


COLUMNS = ("nproc", "steps", "median step s", "samples/s", "tokens/s", "speedup", "efficiency %", "comm %")


def table_rows(result: ScalingResult) -> list[list[str]]:
    """The table's cells, one row per process count (the same cells go to the CSV)."""
    return [
        [str(p.nproc), str(p.steps), f"{p.step_s:.4f}", f"{p.samples_per_s:.2f}", _opt(p.tokens_per_s, ".1f"),
         f"{p.speedup:.3f}", f"{p.efficiency_pct:.1f}", _opt(p.comm_pct, ".1f")]
        for p in result.points
    ]


def format_scaling(result: ScalingResult) -> str:
    """The terminal table with a line on how to read it."""
    cells = table_rows(result)
    widths = [max(len(x) for x in col) for col in zip(COLUMNS, *cells)]
    batch = "per-rank batch fixed" if result.mode == "weak" else "global batch fixed"
    lines = [f"{result.mode} scaling ({batch}); speedup and efficiency against {result.base_nproc} process(es); "
             "samples/s and tokens/s over the counted steps' summed time (long steps weigh in: compare's are the "
             "median step's)"]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in [list(COLUMNS), *cells]]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def scaling_csv(result: ScalingResult) -> str:
    """The table as CSV (numbers unrounded, empty cells for what was not measured)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    fields = ["nproc", "steps", "step_s", "samples_per_s", "tokens_per_s", "speedup", "efficiency_pct", "comm_pct",
              "probe_comm_pct", "per_rank_batch", "global_batch"]
    writer.writerow(["mode", *fields])
    for p in result.points:
        writer.writerow([result.mode] + ["" if getattr(p, f) is None else getattr(p, f) for f in fields])
    return out.getvalue()
