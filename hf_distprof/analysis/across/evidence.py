"""The run's evidence beyond the traced window (pure): the step timer's records, computed once into the figures every
later stage reads (:class:`~hf_distprof.analysis.results.across.TimerFigures`), summarised for the what-if
(:class:`~hf_distprof.analysis.results.across.RunEvidence`), and which phase of each rank's step exceeds its peers'.

The traced window holds a few steps, slowed and reshaped by the profiler; the step timer times every step at a small
cost. A what-if saving, a slow rank, a step-to-step noise: each is judged on the run's steps when the timer's records
are there, and on the traced steps only when they are not.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from hf_distprof.analysis.results.across import PhaseExcess, RunEvidence, TimerFigures
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.timer import TimerRecords
from hf_distprof.core.stats import finite, scaled_mad
from hf_distprof.core.stats import interquartile_mean as typical
from hf_distprof.core.verdicts import KEPT_CELLS, candidate, per_step_excess

PHASE_KEYS = {
    "data": ("data_load_s", "data_s"),
    "forward": ("forward_s",),
    "backward": ("backward_compute_s", "backward_s"),
    "optimizer": ("optimizer_s",),
}
"""The phases of a step the timer records, each by its keys in order of preference."""


def _number(value: Any) -> float | None:
    """A finite number >= 0, else None (booleans, strings, NaN, negative values)."""
    number = finite(value)
    return number if number is not None and number >= 0 else None


def data_part(row: dict[str, Any]) -> float | None:
    """The data loading a row's pre-sync time counts (:attr:`hf_distprof.timing.recorder.StepTiming.pre_sync_data_s`):
    the loader's time (``data_load_s``), on a GPU only what the device waited for: the pre-sync time less the forward
    and the backward compute, when the row has them; else the loader's time capped by the data wait; else the data
    wait. None when the row has neither."""
    load, wait = _number(row.get("data_load_s")), _number(row.get("data_s"))
    if load is None:
        return wait
    pre, forward, backward = (_number(row.get(k)) for k in ("pre_sync_s", "forward_s", "backward_compute_s"))
    if pre is not None and forward is not None and backward is not None:
        rest = max(0.0, pre - forward - backward)
        return load if rest >= load - 1e-9 else rest  # (all of the loading: its own figure, not a difference's)
    return load if wait is None else min(load, wait)


def _per_step(records: TimerRecords, key: str) -> dict[int, dict[int, float]]:
    """rank -> step -> the rows' ``key`` where it is a usable number."""
    out: dict[int, dict[int, float]] = {}
    for rank, steps in records.rows.items():
        for step, row in steps.items():
            value = _number(row.get(key))
            if value is not None:
                out.setdefault(rank, {})[step] = value
    return out


def _own_step(row: dict[str, Any]) -> float | None:
    """The step less the wait for a CPU (``own_step_s``; the step time in rows written before it); None in a row
    with neither."""
    own = _number(row.get("own_step_s"))
    return own if own is not None else _number(row.get("step_s"))


def judged_steps(records: TimerRecords, traced: set[int]) -> list[int]:
    """The steps the run's slow-rank verdict judges, in order: those every rank recorded with its own work, less the
    timer's warm-up and the steps the profiler ran over (its marks, plus ``traced``: the steps of the traces, which
    on-demand and anomaly windows add), among the latest steps the timer keeps
    (:data:`~hf_distprof.core.verdicts.KEPT_CELLS`); all of those when fewer than 2 remain (the timer's own rule).
    Empty for older files (no marks) or fewer than 2 ranks."""
    if not records.marked or len(records.rows) < 2:
        return []
    ranks = sorted(records.rows)
    common = set.intersection(*(set(records.rows[r]) for r in ranks)) - records.warmup
    usable = [s for s in common if all(_number(records.rows[r][s].get("own_work_s")) is not None for r in ranks)]
    kept = sorted(usable)[-max(64, KEPT_CELLS // len(ranks)):]
    skip = records.traced | records.busy | traced
    untraced = [s for s in kept if s not in skip]
    return untraced if len(untraced) >= 2 else kept


def _phases(records: TimerRecords, steps: list[int]) -> dict[str, dict[int, list[float]]]:
    """phase -> rank -> its seconds in each of ``steps`` (data: the loading the pre-sync time counts, :func:`data_part`;
    forward; backward compute, else the whole backward; optimizer); a phase some row lacks is left out."""
    out: dict[str, dict[int, list[float]]] = {}
    for phase, keys in PHASE_KEYS.items():
        values: dict[int, list[float]] = {}
        for rank, rows in sorted(records.rows.items()):
            if phase == "data":
                got = [data_part(rows[s]) if s in rows else None for s in steps]
            else:
                got = [next((v for v in (_number(rows[s].get(k)) for k in keys) if v is not None), None)
                       if s in rows else None for s in steps]
            if any(v is None for v in got):
                break
            values[rank] = [float(v or 0.0) for v in got]
        else:
            if steps and values:
                out[phase] = values
    return out


def _parts(records: TimerRecords) -> dict[int, dict[int, tuple[float, ...]]]:
    """rank -> step -> (pre-sync time, its wait for a CPU, data loading, own compute, tokens, samples) where the row
    has them: the live timer's parts (:func:`hf_distprof.timing.report.step_row`), from the row's own figures."""
    out: dict[int, dict[int, tuple[float, ...]]] = {}
    for rank, steps in records.rows.items():
        for step, row in steps.items():
            pre, work = _number(row.get("pre_sync_s")), _number(row.get("own_work_s"))
            data = data_part(row)
            if pre is None or work is None or data is None:
                continue
            tokens, samples = _number(row.get("tokens")) or 0.0, _number(row.get("samples")) or 0.0
            out.setdefault(rank, {})[step] = (pre, pre - work, data, max(0.0, work - data), tokens, samples)
    return out


def timer_figures(records: TimerRecords, traced: set[int]) -> TimerFigures:
    """Everything the analysis takes from the step timer's records, computed once.

    Args:
        records: The rows beside the traces.
        traced: The steps the traces hold.
    """
    step_times: dict[int, float] = {}
    own_step: dict[int, float] = {}
    for steps in records.rows.values():
        for step, row in steps.items():
            own = _own_step(row)
            if own is not None:
                own_step[step] = max(own_step.get(step, 0.0), own)
            t = _number(row.get("step_s"))
            if t is not None and step not in records.warmup and step not in records.busy:
                step_times[step] = max(step_times.get(step, 0.0), t)
    judged = judged_steps(records, traced)
    return TimerFigures(
        cpu_wait=_per_step(records, "cpu_wait_s"),
        own_work=_per_step(records, "own_work_s"),
        own_step=own_step,
        step_times=step_times,
        judged=judged,
        phases=_phases(records, judged),
        marked_traced=set(records.traced),
        parts=_parts(records),
    )


def run_evidence(timer: TimerFigures) -> RunEvidence | None:
    """What the step timer's records say about the run's judged steps; None without records of 2+ ranks."""
    steps = timer.judged
    if len(steps) < 2:
        return None
    judged = [timer.step_times[s] for s in steps if s in timer.step_times]
    own = timer.own_work
    medians = {rank: median(own[rank][s] for s in steps) for rank in sorted(own) if all(s in own[rank] for s in steps)}
    found = candidate(timer.judged_work())
    slowest = found.rank if found is not None else None
    fastest = min(medians, key=lambda r: (medians[r], r)) if len(medians) > 1 else None
    # What a pace scenario saves per step: the interquartile mean of the steps' excess, as the cause says it (a
    # median lands on either level of a slowness in every other step: a trial's what-if counted 1.3% of the run
    # beside "its peers wait 14.8 ms per step for it").
    gap = (1e3 * typical([own[slowest][s] - own[fastest][s] for s in steps])
           if slowest in medians and fastest is not None and fastest != slowest else None)
    # Every rank's excess, as the verdicts weigh it (any of them may be the rank a raised verdict names; in numpy for
    # a large table: a loop over ranks and steps with a median of the peers in each is R^2 S).
    excess: dict[int, float] = {}
    if len(medians) > 1:
        each = per_step_excess({r: [own[r][s] for s in steps] for r in medians}, list(medians), len(steps), None)[1]
        excess = {r: 1e3 * typical(values) for r, values in each.items()}
    if slowest is not None and slowest not in excess and found is not None:
        excess[slowest] = 1e3 * found.effect_abs
    return RunEvidence(
        steps=len(steps),
        noise_ms=1e3 * scaled_mad(judged) if len(judged) > 1 else 0.0,
        slowest_rank=slowest,
        fastest_rank=fastest if fastest != slowest else None,
        excess_ms=excess,
        fastest_gap_ms=gap,
        step_ms=1e3 * median(judged) if judged else None,
    )


def phase_excess(ranks: list[RankResult], timer: TimerFigures, common: list[int]) -> dict[int, PhaseExcess]:
    """For each rank, the phase of its step that exceeds its peers' the most: from the step timer's records over the
    judged steps when they have the rank (data, forward, backward, optimizer), else from the traced steps every rank
    has (data loading, compute); also for a rank the timer alone has. Empty with fewer than 2 ranks."""
    timed = {p: {r: [1e6 * v for v in vs] for r, vs in by_rank.items()} for p, by_rank in timer.phases.items()}
    window: dict[str, dict[int, list[float]]] = {}
    if common:
        by_step = {r.rank: {s.step: s for s in r.steps} for r in ranks}
        window = {
            "data": {r: [by_step[r][s].cpu.data_loading_us for s in common] for r in by_step},
            "compute": {r: [by_step[r][s].busy_us(dev) - by_step[r][s].cpu.data_loading_us for s in common]
                        for r, dev in ((x.rank, x.device) for x in ranks)},
        }
    out: dict[int, PhaseExcess] = {}
    # The traced ranks, and those the timer alone has (--profile-ranks: a rank that took no window).
    for rank in sorted({r.rank for r in ranks} | (set(next(iter(timed.values()))) if timed else set())):
        use_timer = bool(timed) and rank in next(iter(timed.values()))
        per_phase, n = (timed, len(timer.judged)) if use_timer else (window, len(common))
        best: PhaseExcess | None = None
        for phase, values in per_phase.items():
            if rank not in values or len(values) < 2:
                continue
            peers = [p for p in values if p != rank]
            excess = typical([values[rank][i] - median(values[p][i] for p in peers) for i in range(n)])
            if best is None or excess > best.excess_us:
                best = PhaseExcess(phase, excess, n, from_timer=use_timer)
        if best is not None:
            out[rank] = best
    return out
