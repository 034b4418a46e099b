"""Rank 0's per-step record of every rank's timings over the run (:class:`StepSeries`), and the row each rank sends
for a step (:func:`step_row`): what the step timer's noise-aware decisions at train end and on logging steps judge
(the slow-rank verdict, its cause, a burst, the profiler's slowdown), the same rules ``hf-distprof analyze`` applies
to the records. Pure: no I/O, no distributed calls."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from hf_distprof.core.burst import Burst, find_burst
from hf_distprof.core.cause import Attribution, attribute_rows
from hf_distprof.core.overhead import ProfilerSlowdown, profiler_slowdown
from hf_distprof.core.verdicts import KEPT_CELLS, SlowRankVerdict, judge_run
from hf_distprof.timing.recorder import StepTiming


LIVE_VERDICT_GROWTH = 0.05
"""The growth of the steps seen after which the live slow-rank verdict is judged again (:meth:`StepSeries.due`)."""


class StepSeries:
    """Rank 0's per-step record of every rank's pre-sync time and step time, bounded in length.

    Filled from the per-step values each rank sends on logging steps; the noise-aware decisions
    (:mod:`hf_distprof.core.verdicts`) need individual steps, not window means. Only the latest ``max_steps``
    steps are kept (:data:`KEPT_CELLS` values: the latest 10,000 steps of 2 ranks, at least 64 steps), so
    memory and the verdict's time stay bounded on long runs with many ranks.
    """

    def __init__(self, world_size: int, max_steps: int | None = None) -> None:
        self.world_size = world_size
        self.max_steps = max_steps or max(64, KEPT_CELLS // max(world_size, 1))
        # step -> (every rank's own work, the step time, the step time less the ranks' wait for a CPU, every rank's
        # parts: (arrival, cpu_wait, data, compute, tokens, samples), or None for rows without them)
        self._steps: OrderedDict[int, tuple[list[float], float, float, list[tuple[float, ...]] | None]] = OrderedDict()
        self.added = 0  # steps ever added, the ones dropped past max_steps included

    def add(self, per_rank: Sequence[Sequence[Sequence[float]]]) -> None:
        """Add the rows of every rank; steps missing on a rank are dropped.

        A row is ``[step, step_s, own_work_s, own_step_s, pre_sync_s, cpu_wait_s, data_s, compute_s, tokens,
        samples]`` (:func:`step_row`); rows of 3 or 4 (older callers) take the step time as ``own_step_s`` and carry
        no parts, which only the cause (:meth:`cause`) needs. ``own_work_s`` is the pre-sync time less the time the
        rank's thread waited for a CPU (:attr:`StepTiming.own_work_s`), ``own_step_s`` the step time less that wait
        (:attr:`StepTiming.own_step_s`).
        """
        by_step: dict[int, dict[int, tuple[float, float, float, tuple[float, ...] | None]]] = {}
        for rank, rows in enumerate(per_rank):
            for row in rows:
                step, step_s, pre = row[0], row[1], row[2]
                own_step = row[3] if len(row) > 3 else step_s
                parts = tuple(float(v) for v in row[4:10]) if len(row) >= 10 else None
                by_step.setdefault(int(step), {})[rank] = (float(step_s), float(pre), float(own_step), parts)
        for step in sorted(by_step):
            got = by_step[step]
            if len(got) != self.world_size:
                continue
            pre = [got[r][1] for r in range(self.world_size)]
            parts = [got[r][3] for r in range(self.world_size)]
            self.added += step not in self._steps
            self._steps[step] = (pre, max(v[0] for v in got.values()), max(v[2] for v in got.values()),
                                 parts if all(p is not None for p in parts) else None)  # type: ignore[misc]
        while len(self._steps) > self.max_steps:
            self._steps.popitem(last=False)

    def __len__(self) -> int:
        return len(self._steps)

    def due(self, judged_at: int) -> bool:
        """Whether a verdict judged when :attr:`added` was ``judged_at`` is due again: once the steps seen grew by
        :data:`LIVE_VERDICT_GROWTH` since, at most that share of the steps kept (at every logging step while one
        logging interval is 5% of the steps seen; with 2 ranks, which keep 10,000, at least every 500). A verdict's
        cost grows with the steps it judges (22 ms at 10,000 steps of 2 ranks), which every logging step of a long
        run would otherwise pay."""
        return self.added - judged_at >= max(1, int(LIVE_VERDICT_GROWTH * min(judged_at, self.max_steps)))

    def step_times(self) -> dict[int, float]:
        """step -> the step time (the slowest rank's; under DDP they are equal)."""
        return {step: v[1] for step, v in self._steps.items()}

    def own_step_times(self) -> dict[int, float]:
        """step -> the step time less the ranks' wait for a CPU (the largest over ranks): what the verdict's
        materiality is judged against, since a host's run-queue waits lengthen the step for nobody's work."""
        return {step: v[2] for step, v in self._steps.items()}

    def _kept(self, exclude: Callable[[int], bool] | None) -> list[tuple[list[float], float, float, Any]]:
        return [v for step, v in self._steps.items() if exclude is None or not exclude(step)]

    def burst(self, threshold_pct: float, exclude: Callable[[int], bool] | None = None,
              slow_rank: int | None = None, gate: str = "") -> Burst | None:
        """A burst over the kept steps (:func:`~hf_distprof.core.burst.find_burst`), its phase from the rows' parts."""
        kept = [(step, v) for step, v in self._steps.items() if exclude is None or not exclude(step)]
        ranks, parted = range(self.world_size), bool(kept) and all(v[3] is not None for _, v in kept)
        phases = {name: {r: [v[3][r][k] for _, v in kept] for r in ranks}
                  for name, k in (("data", 2), ("compute", 3))} if parted else None
        return find_burst({r: [v[0][r] for _, v in kept] for r in ranks}, [s for s, _ in kept],
                          [v[1] for _, v in kept], threshold_pct, phases, slow_rank, gate)

    def verdict(self, threshold_pct: float, exclude: Callable[[int], bool] | None = None) -> SlowRankVerdict | None:
        """The slow-rank verdict over the kept steps, leaving out ``exclude``d steps: each rank's own work, and when
        that names no rank, its pre-sync time with its wait for a CPU (:func:`hf_distprof.core.verdicts.judge_run`,
        the rule ``hf-distprof analyze`` judges the records by). The pre-sync time is judged only over steps whose
        rows carry it.

        Steps the profiler traced are left out by the caller: a slow rank there may be the profiler's doing.
        """
        if self.world_size < 2:
            return None
        kept = self._kept(exclude)
        per_rank = {r: [row[r] for row, _, _, _ in kept] for r in range(self.world_size)}
        parted = kept if all(parts is not None for *_, parts in kept) else []
        arrival = {r: [parts[r][0] for *_, parts in parted] for r in range(self.world_size)} if parted else {}
        return judge_run(per_rank, arrival, threshold_pct, [own_step for _, _, own_step, _ in kept],
                         [step_s for _, step_s, _, _ in parted])

    def profiler_slowdown(self, busy: set[int], traced: Callable[[int], bool], args: Any,
                          host_timed: bool = True) -> ProfilerSlowdown | None:
        """The profiler's slowdown over the kept steps (:func:`hf_distprof.core.overhead.profiler_slowdown`): the
        steps it traced (``traced``) against the others, those it was busy in left out on both sides (and said, as are
        traced steps with no row: after a pause); ``args``: the profiling flags (its options, the threshold); with
        ``host_timed``, each step's wait for a CPU of the rank last to the sync (the largest pre-sync time's part)."""
        times = self.step_times()
        waits = {s: max(v[3])[1] for s, v in self._steps.items() if v[3] is not None} if host_timed else None
        inside, left_out = {s for s in times if traced(s)}, [s for s in range(min(times, default=0), max(
            times, default=-1) + 1) if traced(s) and (s not in times or s in busy)]
        return profiler_slowdown(
            {s: t for s, t in times.items() if s not in busy}, inside,
            {"record_shapes": args.profiler_record_shapes, "profile_memory": args.profiler_profile_memory,
             "with_stack": args.profiler_with_stack, "with_flops": args.profiler_with_flops},
            threshold_ratio=args.profiler_slowdown_threshold, cpu_wait=waits, left_out=left_out)

    def cause(self, rank: int, threshold_pct: float,
              exclude: Callable[[int], bool] | None = None) -> Attribution | None:
        """Why ``rank`` makes its peers wait (:func:`hf_distprof.core.cause.attribute`), over the same steps as
        :meth:`verdict`; None without the rows' parts or with one rank."""
        kept = self._kept(exclude)
        if self.world_size < 2 or not kept or any(parts is None for *_, parts in kept):
            return None
        return attribute_rows({r: [parts[r] for *_, parts in kept] for r in range(self.world_size)}, rank,
                              threshold_pct)


def step_row(timing: StepTiming, host_timed: bool) -> list[float]:
    """One step of one rank as the step timer sends it to rank 0 (:meth:`StepSeries.add`): ``[step, step_s,
    own_work_s, own_step_s, pre_sync_s, cpu_wait_s, data_s, compute_s, tokens, samples]``. Without host timing (a GPU's
    device times) the work is the pre-sync time and no wait for a CPU is taken out."""
    pre = timing.pre_sync_s
    work = timing.own_work_s if host_timed else pre
    data = timing.pre_sync_data_s
    # The wait for a CPU is what the own work took out of the pre-sync time (what the records say too).
    return [timing.step, timing.step_s, work, timing.own_step_s if host_timed else timing.step_s, pre, pre - work,
            data, max(0.0, work - data), float(timing.tokens), float(timing.samples)]
