"""Two runs side by side: every phase, throughput, communication, imbalance and memory, per rank, with deltas.

Pure functions over :class:`~hf_distprof.runs.load.RunData`; the result is plain dataclasses that serialise to
JSON. Each figure is compared step by step (:func:`hf_distprof.core.difference.judge_difference`), so a difference
is called significant only when it stands out from both runs' own step-to-step noise.

What changed most (the headline) is looked for among each rank's own work (data loading, forward, backward
compute, optimizer), because under DDP a slow rank makes every other rank's step, data wait (the Trainer's
cross-rank token count) and collective wait longer too: those follow from the cause and do not name it. A
change is *localized* on a rank when the same phase on the other ranks changed by less than half as much and
the rank's excess over their change is itself a change the comparison would call significant (at least
``min_effect_pct`` of run A's median, and beyond the noise): between two clean runs on a busy machine one rank's
forward once grew 48% while its peer's grew 23%, an excess of 25% that is the machine's drift, not one rank.
The largest localized change is the headline. When every rank changed alike, the headline says so: then the
machine (load, clocks, threads) or the whole workload changed, not one rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from hf_distprof.runs.load import RunData
from hf_distprof.core.difference import (
    MIN_EFFECT_PCT,
    NOISE_FACTOR,
    PROFILED,
    TOO_FEW,
    Difference,
    judge_difference,
    single_difference,
)
from hf_distprof.core.verdicts import imbalance_pct

Record = dict[str, Any]


@dataclass(frozen=True)
class Metric:
    """One compared figure: how to read it from a step record, and how to show it."""

    key: str
    label: str
    phase: str
    """Short name used in the headline and the JSON (``data``, ``forward``, ``backward``, ...)."""
    unit: str
    """``s``, ``samples/s``, ``tokens/s``, ``%`` or ``MB``."""


# Per rank, from timing_rank{R}.jsonl; seconds per optimizer step unless said otherwise.
STEP_METRICS: tuple[Metric, ...] = (
    Metric("step_s", "step time", "step", "s"),
    Metric("data_s", "data wait (incl. cross-rank token count)", "data_wait", "s"),
    Metric("data_load_s", "data loading", "data", "s"),
    Metric("forward_s", "forward", "forward", "s"),
    Metric("backward_s", "backward (incl. gradient sync)", "backward_with_sync", "s"),
    Metric("backward_compute_s", "backward compute", "backward", "s"),
    Metric("sync_s", "gradient sync (backward - compute)", "sync", "s"),
    Metric("optimizer_s", "optimizer", "optimizer", "s"),
    Metric("pre_sync_s", "own work before the sync", "pre_sync", "s"),
    Metric("wait_s", "waiting for other ranks", "wait", "s"),
    Metric("samples_per_s", "throughput", "throughput", "samples/s"),
    Metric("tokens_per_s", "throughput", "throughput", "tokens/s"),
)
# Across ranks, per step: what the run as a whole did.
RUN_METRICS: tuple[Metric, ...] = (
    Metric("step_s", "step time (slowest rank)", "step", "s"),
    Metric("samples_per_s", "throughput (all ranks)", "throughput", "samples/s"),
    Metric("tokens_per_s", "throughput (all ranks)", "throughput", "tokens/s"),
    Metric("comm_pct", "gradient sync share of the step", "sync", "%"),
    Metric("imbalance_pct", "imbalance of own work (max vs others)", "imbalance", "%"),
)
MEMORY_METRIC = Metric("memory_mb", "memory in use", "memory", "MB")
PEAK_METRIC = Metric("peak_memory_mb", "peak memory over the run", "memory", "MB")
TRACE_METRICS: tuple[Metric, ...] = (
    Metric("compute_s", "traced compute", "trace_compute", "s"),
    Metric("communication_s", "traced communication wait", "trace_comm", "s"),
    Metric("data_loading_s", "traced data loading", "trace_data", "s"),
    Metric("gpu_wait_s", "traced wait for the GPU (sync%)", "trace_sync", "s"),  # GPU runs only
)
# The rank's own work, where a cause shows; the second key is the fallback when the first was not measured.
OWN_WORK: tuple[tuple[str, str | None], ...] = (
    ("data_load_s", "data_s"), ("forward_s", None), ("backward_compute_s", "backward_s"), ("optimizer_s", None),
)
PEER_METRICS = ("wait_s", "sync_s", "comm_pct", "imbalance_pct")
"""Figures about the other ranks (waiting for them, syncing with them, how far the slowest is ahead): in a run of one
process they are no such thing (its "wait" is the rest of the step, the Trainer's own), so they are not compared."""
ONE_PROCESS = "one process"
"""The status of a :data:`PEER_METRICS` row where a run had one process: shown, never judged."""
LOCALIZED_SHARE = 0.5
"""A change is localized on a rank when the other ranks' change of that phase is below this share of it."""


@dataclass
class Row:
    """One figure of one rank (``rank`` None: the run as a whole), A against B."""

    metric: str
    label: str
    phase: str
    unit: str
    rank: int | None
    diff: Difference


@dataclass
class Headline:
    """What changed most."""

    kind: str
    """``localized`` (one rank's phase), ``moved`` (one rank's phase slower and another's faster by as much: the slow
    rank moved), ``uniform`` (every rank alike), ``other``, ``none``, or ``too_few_steps``
    (nothing significant, and the step time had too few steps to be judged at all)."""
    rank: int | None
    phase: str | None
    metric: str | None
    text: str


@dataclass
class Comparison:
    """Run B against run A."""

    run_a: str
    run_b: str
    ranks_a: list[int]
    ranks_b: list[int]
    steps_a: int
    """Steps compared per rank in run A (warm-up and profiled steps left out), the fewest over ranks."""
    steps_b: int
    rows: list[Row]
    headline: Headline
    notes: list[str] = field(default_factory=list)
    min_effect_pct: float = MIN_EFFECT_PCT
    """The effect floor the rows were judged with (``--min-effect-pct``)."""

    @property
    def significant(self) -> list[Row]:
        return [r for r in self.rows if r.diff.significant]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (each row's difference inline)."""
        return dataclasses.asdict(self)


def step_value(record: Record, key: str) -> float | None:
    """One per-rank figure of one step record; None when the step timer did not measure it."""
    if key == "sync_s":
        bwd, compute = record.get("backward_s"), record.get("backward_compute_s")
        return None if bwd is None or compute is None else float(bwd) - float(compute)
    if key in ("samples_per_s", "tokens_per_s"):
        count, step = record.get(key.split("_")[0], 0) or 0, record.get("step_s") or 0.0
        return float(count) / float(step) if count and step > 0 else None
    value = record.get(key)
    return None if value is None else float(value)


def _per_step(records: list[Record], key: str) -> list[float]:
    return [v for v in (step_value(r, key) for r in records) if v is not None]


def run_series(run: RunData) -> dict[str, list[float]]:
    """Per-step figures of the run as a whole, over the steps every rank recorded."""
    by_step: dict[int, dict[int, Record]] = {}
    for rank in run.ranks:
        for record in run.counted(rank):
            by_step.setdefault(int(record["step"]), {})[rank] = record
    out: dict[str, list[float]] = {m.key: [] for m in RUN_METRICS}
    for step in sorted(by_step):
        got = by_step[step]
        if len(got) != len(run.ranks):
            continue
        step_s = max(float(r["step_s"]) for r in got.values())
        out["step_s"].append(step_s)
        for key in ("samples", "tokens"):
            total = sum(int(r.get(key, 0) or 0) for r in got.values())
            if total and step_s > 0:
                out[f"{key}_per_s"].append(total / step_s)
        syncs = [step_value(r, "sync_s") for r in got.values()]
        if all(s is not None for s in syncs) and step_s > 0:
            out["comm_pct"].append(100.0 * sum(s or 0.0 for s in syncs) / len(syncs) / step_s)
        # What the step timer's verdict compares: the pre-sync work less its wait for a CPU (own_work_s), else (rows
        # written before it) the pre-sync time.
        own = [r.get("own_work_s", r.get("pre_sync_s")) for r in got.values()]
        if all(v is not None for v in own) and len(own) > 1:
            out["imbalance_pct"].append(imbalance_pct([float(v) for v in own]))
    return out


def memory_series(run: RunData, rank: int) -> list[float]:
    """The rank's memory in use (MB) at each memory logging step after the warm-up: GPU allocated, else RSS."""
    records = run.memory.get(rank, [])
    key = "allocated_mb" if any("allocated_mb" in r for r in records) else "rss_mb"
    first = min((int(r["step"]) for r in run.steps.get(rank, [])), default=1)
    return [float(r[key]) for r in records if key in r and int(r["step"]) >= first + run.warmup_steps]


def peak_memory_mb(run: RunData, rank: int) -> float | None:
    """The rank's peak memory over the run (MB): the memory logger's summary, else the step timer's."""
    rows = (run.memory_summary or {}).get("per_rank") or []
    basis = (run.memory_summary or {}).get("peak_basis")
    for row in rows:
        if row.get("rank") == rank and basis in row:
            return float(row[basis])
    for row in (run.summary or {}).get("per_rank") or []:
        if row.get("rank") == rank and row.get("peak_memory_bytes") is not None:
            return float(row["peak_memory_bytes"]) / 2**20
    return None


def _median_step(run: RunData) -> float | None:
    steps = run_series(run)["step_s"]
    return median(steps) if steps else None


def compare_runs(a: RunData, b: RunData, min_effect_pct: float = MIN_EFFECT_PCT) -> Comparison:
    """Compare run B with run A.

    Args:
        a: The baseline run.
        b: The run compared with it.
        min_effect_pct: Smallest change of a median, in % of A's, that can be significant (above the drift
            between two identical runs on the machine: see the guide's "Comparing runs").

    Returns:
        Every figure side by side with its delta and significance, and the headline.
    """
    notes: list[str] = []
    if Path(a.path).resolve() == Path(b.path).resolve():
        notes.append(f"run A and run B are the same folder ({a.path}): a run against itself differs in nothing")
    ranks = sorted(set(a.ranks) & set(b.ranks))
    if a.ranks != b.ranks:
        notes.append(f"run A has ranks {a.ranks}, run B {b.ranks}: per-rank rows are for ranks {ranks} only")
    step_a = _median_step(a)
    rows: list[Row] = []
    alone = [name for name, run in (("A", a), ("B", b)) if _one_process(run)]

    def add(metric: Metric, rank: int | None, xs: list[float], ys: list[float]) -> None:
        if not xs and not ys:
            return
        diff = judge_difference(
            xs, ys, points=metric.unit == "%", step_s=step_a if metric.unit == "s" and metric.key != "step_s" else None,
            min_effect_pct=min_effect_pct,
        )
        if alone and metric.key in PEER_METRICS:
            runs = " and ".join(f"run {n}" for n in alone)
            diff = dataclasses.replace(diff, status=ONE_PROCESS, reason=f"{runs} had one process: no other rank to "
                                       "wait for or sync with (its figure is the rest of the step)")
        rows.append(Row(metric.key, metric.label, metric.phase, metric.unit, rank, diff))

    series_a, series_b = run_series(a), run_series(b)
    run_metrics = {m.key: m for m in RUN_METRICS}
    for metric in STEP_METRICS:
        if metric.key in run_metrics:
            add(run_metrics[metric.key], None, series_a[metric.key], series_b[metric.key])
        for rank in ranks:
            add(metric, rank, _per_step(a.counted(rank), metric.key), _per_step(b.counted(rank), metric.key))
    for key in ("comm_pct", "imbalance_pct"):
        add(run_metrics[key], None, series_a[key], series_b[key])
    for rank in ranks:
        add(MEMORY_METRIC, rank, memory_series(a, rank), memory_series(b, rank))
    for rank in ranks:
        peaks = peak_memory_mb(a, rank), peak_memory_mb(b, rank)
        if peaks != (None, None):
            m = PEAK_METRIC
            rows.append(Row(m.key, m.label, m.phase, m.unit, rank, single_difference(*peaks)))
    if a.trace_steps and b.trace_steps:
        for metric in TRACE_METRICS:
            for rank in ranks:
                before = len(rows)
                series = [[s.get(metric.key, 0.0) for s in run.trace_steps.get(rank, [])] for run in (a, b)]
                if metric.key == "gpu_wait_s" and not any(x for values in series for x in values):
                    continue  # a CPU run, or a GPU run that never waited for its GPU inside a CUDA call
                add(metric, rank, *series)
                if len(rows) > before:
                    rows[-1] = dataclasses.replace(rows[-1], diff=dataclasses.replace(
                        rows[-1].diff, status=PROFILED, reason="inside a profiler window: shown, not judged"))
    if a.traced_steps or b.traced_steps:
        notes.append("steps inside a profiler window are left out of the step-timer figures (the profiler slows them)")
    counted = [min((len(r.counted(k)) for k in ranks), default=0) for r in (a, b)]
    return Comparison(str(a.path), str(b.path), a.ranks, b.ranks, counted[0], counted[1], rows,
                      headline(rows, ranks, min_effect_pct), notes, min_effect_pct)


def _one_process(run: RunData) -> bool:
    """Whether the run had one process (no peers): one rank's records, and its summary, if any, says a world of 1."""
    world = (run.summary or {}).get("world_size")
    return len(run.ranks) == 1 and (not isinstance(world, int) or world == 1)


def _own_work_rows(rows: list[Row], ranks: list[int]) -> list[Row]:
    """Per rank, the own-work phases that were measured (the fallback key where the first is missing)."""
    by_key = {(r.metric, r.rank): r for r in rows}
    out = []
    for first, fallback in OWN_WORK:
        key = first if any((first, k) in by_key for k in ranks) else fallback
        out += [by_key[(key, k)] for k in ranks if key is not None and (key, k) in by_key]
    return out


def _alike_on_every_rank(rows: list[Row], row: Row, ranks: list[int]) -> bool:
    """Whether ``row``'s figure changed significantly, the same way, on every one of 2+ ranks."""
    same = [r for r in rows if r.metric == row.metric and r.rank is not None and r.diff.significant
            and r.diff.delta is not None and (r.diff.delta > 0) == ((row.diff.delta or 0.0) > 0)]
    return len(ranks) > 1 and {r.rank for r in same} >= set(ranks)


def _num(value: float | None, unit: str, sign: str = "") -> str:
    """A figure as the table shows it: seconds to 0.1 ms, the rest to 4 significant digits."""
    if value is None:
        return "n/a"
    return f"{value:{sign}.4f}" if unit == "s" else f"{value:{sign}.4g}"


def _fmt_delta(row: Row) -> str:
    d = row.diff
    pct = "" if d.delta_pct is None else f", {d.delta_pct:+.0f}%"
    return f"{d.median_a:.4f} -> {d.median_b:.4f} {row.unit} per step ({d.delta:+.4f}{pct})"


def headline(rows: list[Row], ranks: list[int], min_effect_pct: float = MIN_EFFECT_PCT) -> Headline:
    """What changed most: the largest localized change of a rank's own work, else a uniform or other change.

    Args:
        rows: The compared rows.
        ranks: The ranks both runs have.
        min_effect_pct: The comparison's effect floor: a rank's excess over its peers' change must clear it
            (in % of run A's median of that figure) to localize the change on that rank.

    Returns:
        The headline.
    """
    own = [r for r in _own_work_rows(rows, ranks) if r.diff.significant and r.diff.delta is not None]

    def peers(row: Row) -> float:
        others = [o.diff.delta or 0.0 for o in _own_work_rows(rows, ranks) if o.metric == row.metric
                  and o.rank != row.rank and o.diff.delta is not None]
        return median(others) if others else 0.0

    def excess(row: Row) -> float:
        return abs((row.diff.delta or 0.0) - peers(row))

    def stands_out(row: Row) -> bool:
        d = row.diff
        return (d.median_a is not None and excess(row) >= min_effect_pct / 100.0 * abs(d.median_a)
                and excess(row) > NOISE_FACTOR * d.noise)

    def largest_other(row: Row) -> float:
        """The largest change of the same phase on another rank (its median hid one that changed as much: a slow
        rank that moved from rank 2 to rank 1 read "rank 2, -100%, against +0.0000 s on the other ranks")."""
        return max((abs(o.diff.delta or 0.0) for o in _own_work_rows(rows, ranks) if o.metric == row.metric
                    and o.rank != row.rank and o.diff.delta is not None), default=0.0)

    localized = [r for r in own if largest_other(r) < LOCALIZED_SHARE * abs(r.diff.delta or 0.0) and stands_out(r)]
    moved = [(a, b) for a in own for b in own if a.metric == b.metric and (a.diff.delta or 0.0) > 0 > (b.diff.delta
             or 0.0) and min(a.diff.delta or 0.0, -(b.diff.delta or 0.0)) >= LOCALIZED_SHARE * max(
             a.diff.delta or 0.0, -(b.diff.delta or 0.0)) and stands_out(a) and stands_out(b)]
    if moved and not localized:
        a, b = max(moved, key=lambda ab: (ab[0].diff.delta or 0.0) - (ab[1].diff.delta or 0.0))
        return Headline("moved", a.rank, a.phase, a.metric,
                        f"the slow rank moved: rank {a.rank}, {a.label}: {_fmt_delta(a)}; rank {b.rank}, {b.label}: "
                        f"{_fmt_delta(b)}")
    if localized:
        top = max(localized, key=excess)
        beside = f", against {peers(top):+.4f} s on the other ranks" if len(ranks) > 1 else ""
        return Headline("localized", top.rank, top.phase, top.metric,
                        f"rank {top.rank}, {top.label}: {_fmt_delta(top)}{beside}")
    if own:
        top = max(own, key=lambda r: abs(r.diff.delta or 0.0))
        changed = ", ".join(sorted({r.label for r in own}))
        step = next((r for r in rows if r.metric == "step_s" and r.rank is None), None)
        whole = f"step time {_fmt_delta(step)}; " if step is not None and step.diff.delta is not None else ""
        return Headline("uniform", None, top.phase, top.metric,
                        f"every rank changed alike: {whole}{changed} (largest: rank {top.rank} {top.label} "
                        f"{_fmt_delta(top)}): the machine (load, clocks, threads) or the whole workload changed, "
                        "not one rank")
    others = [r for r in rows if r.diff.significant]
    if others:
        top = max(others, key=lambda r: abs(r.diff.delta_pct or 0.0))
        who = "the run" if top.rank is None else f"rank {top.rank}"
        if top.rank is not None and _alike_on_every_rank(rows, top, ranks):
            # Not one rank's change: name every rank, with the run's own row when it has one.
            top = next((r for r in others if r.metric == top.metric and r.rank is None), top)
            who = "every rank alike"
            return Headline("other", None, top.phase, top.metric,
                            f"{who}: {top.label} {_num(top.diff.median_a, top.unit)} -> "
                            f"{_num(top.diff.median_b, top.unit)} {top.unit} ({_num(top.diff.delta, top.unit, '+')}"
                            f"{'' if top.rank is None else f' on rank {top.rank}'}); no rank's own work changed beyond "
                            "the noise")
        return Headline("other", top.rank, top.phase, top.metric,
                        f"{who}, {top.label}: {_num(top.diff.median_a, top.unit)} -> "
                        f"{_num(top.diff.median_b, top.unit)} {top.unit} ({_num(top.diff.delta, top.unit, '+')}); no "
                        "rank's own work changed beyond the noise")
    step = next((r for r in rows if r.metric == "step_s" and r.rank is None), None)
    if step is None:  # no step compared (all warm-up or profiled): not "within the noise"
        return Headline("too_few_steps", None, None, None, "nothing can be judged: no step of the step timer compared "
                        "(each the warm-up, inside a profiler window or right after a pause); run more steps")
    if step.diff.status == TOO_FEW:
        return Headline("too_few_steps", None, None, None,
                        f"nothing can be judged: {step.diff.reason} (step time); run more steps")
    return Headline("none", None, None, None, "no significant difference: every change is within the runs' noise")
