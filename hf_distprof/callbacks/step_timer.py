"""``StepTimerCallback``: where each step's time goes, per rank, and which rank holds back the others.

Per optimizer step and rank it records data wait, forward, backward (with the gradient sync), optimizer
and the whole step (``hf_distprof.timing.recorder``), from model hooks and the Trainer's step hooks. The
same hooks name those phases in the traces a profiler records (``hf_distprof/forward`` ...), and with
``--nvtx`` as NVTX ranges (``hf_distprof.timing.instrument.PhaseLabels``).
Between logging steps it only takes clock marks: no device sync, no collective, no ``.item()``. On each
logging step (``on_log``) it resolves the marks, appends ``timing_rank{R}.jsonl``, and does one small
all-gather of every rank's means and peak memory; rank 0 writes TensorBoard scalars (``timing/``,
``throughput/``), adds the headline figures to the Trainer's logs and warns about imbalance. At train end
rank 0 writes ``timing_summary.json`` and prints a table. With ``--measure-comm-overhead N`` it first
runs the ``no_sync`` A/B (``hf_distprof.timing.comm_overhead``) on a real batch.
"""

from __future__ import annotations

import atexit
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard, trackers
from hf_distprof.callbacks.memory.stats import MB, forget_counters
from hf_distprof.callbacks.parallelism import report_parallelism
from hf_distprof.callbacks.profiler.schedule import after_window, traced_steps
from hf_distprof.config import ProfilingArguments
from hf_distprof.timing import comm_overhead, gpu_health, publish
from hf_distprof.timing.clock import default_clock, training_device
from hf_distprof.timing.cpu_wait import RunQueueClock
from hf_distprof.timing.instrument import (ModelHooks, PhaseLabels, current_memory_bytes, instrument_loader,
                                           loader_settings, loads_elsewhere, peak_memory_bytes)
from hf_distprof.timing.jsonl import JsonlFile
from hf_distprof.timing.recorder import StepRecorder, StepTiming
from hf_distprof.timing.report import (CrossRankReport, PhaseTotals, RankSummary, cross_rank_report, live_time_warnings,
                                       memory_warning, peak_tflops_for_device)
from hf_distprof.timing.series import StepSeries, step_row
from hf_distprof.core import signals
from hf_distprof.core.advice import LoaderSettings
from hf_distprof.core.burst import quiet_gate
from hf_distprof.core.cause import Attribution, with_device
from hf_distprof.core.growth import GrowthWatch, MemoryGrowth

logger = dist.get_logger(__name__)

# The first optimizer step of a train() call pays one-off costs (allocator warm-up, DDP bucket rebuild):
# it goes to the jsonl but not into the means, so it cannot fake an imbalance.
WARMUP_STEPS = 1
# Unresolved steps kept at most; past this they are resolved locally on that step, logging step or not
# (no collective; on GPU one wait for the device, plus one jsonl write, per this many steps).
MAX_PENDING_STEPS = 1000
# Per-step rows a rank keeps for rank 0 between logging steps; older ones are dropped when logging is rare.
ROWS_KEPT = 4096
# The TensorBoard text tag of every live warning (the slow rank and its cause, memory), at the step it was said.
WARNINGS_TAG = "hf_distprof/warnings"


class StepTimerCallback(TrainerCallback):  # type: ignore[misc]
    """Times every optimizer step per rank and reports cross-rank imbalance on logging steps.

    Args:
        args: The profiling flags (thresholds, ``--measure-comm-overhead``, ``--peak-tflops``, output folder).
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.comm: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self._recorder: StepRecorder | None = None
        self._labels = PhaseLabels()
        self._hooks: ModelHooks | None = None
        self._undo_loader: Any = None
        self._loader: LoaderSettings | None = None
        self._jsonl: JsonlFile | None = None
        self._writer: Any = None
        self._device = torch.device("cpu")
        self._peak_tflops: float | None = None
        self._first_step = 1
        # The steps in the means, the warm-up, and the steps after a checkpoint or an evaluation (each waits for the
        # slowest rank's), left out like the warm-up; how many steps an interval left out (its FLOPs are scaled).
        self._interval, self._run, self._warmup, self._paused = (PhaseTotals() for _ in range(4))
        self._after_pause: set[int] = set()
        self._skipped = self._skipped_sent = 0
        self._gathered_step = 0
        # The global_step of a Trainer logging step not yet gathered; None when there is none.
        self._log_step: int | None = None
        # The logging step whose gather was started at its on_step_end and is read at its on_log, and the size of
        # the next gather's buffers (every rank derives it from the same gathered lengths).
        self._pending: tuple[int, dist.PendingJson] | None = None
        self._gather_cap = dist.OBJECT_CAP_MIN
        self._flos_logged = self._flos_begin = 0.0
        # (kind, rank) -> the step of its live warning (each is said once).
        self._warned: dict[tuple[str, int], int] = {}
        self._failed = False
        self._report_to: Any = None
        # Phases timed on the host clock (CPU training): only then is the thread's wait for a CPU part of them and
        # taken out of the pre-sync time compared across ranks (on GPU the phases are device time).
        self._host_timed = True
        # Per-step rows (timing.report.step_row) not yet sent to rank 0; rank 0's record of all ranks, and every
        # rank's GPU at the latest logging step.
        self._rows: deque[list[float]] = deque(maxlen=ROWS_KEPT)
        self._series: StepSeries | None = None
        self._health: dict[int, dict[str, Any]] = {}
        self._traced: Any = None  # step -> whether the profiler ran over it
        self._ended_early: int | None = None  # a step ended before the profiler wrote its trace
        # Whether the profiler is still busy with a written trace (its compact summary, on a thread that takes the
        # GIL); set by ProfilerCallback. Steps it overlaps are the profiler's, like the traced ones: left out.
        self.profiler_busy: Callable[[], bool] | None = None
        self.memory_busy: Callable[[], bool] | None = None  # --memory-tracker's step (set by build_callbacks)
        self.before_fetch: Callable[[], None] | None = None  # before the loader's next(): the profiler ends a pause
        self._busy_at_begin = False
        self._busy_steps: set[int] = set()
        self._streak: dict[str, int | None] = {}  # what was over its threshold at the previous logging step
        self._live: tuple[Any, int] | None = None  # the live verdict, and the steps seen when it was judged
        # rank 0: each rank's MB in use at each logging step, for the memory-growth verdict
        self._growth_watch = GrowthWatch(args.memory_growth_threshold_pct, "process RSS", self._distorts_memory)
        # Called with each resolved step after the warm-up (--profile-ranks auto keeps this rank's step times).
        self.step_listeners: list[Callable[[StepTiming], None]] = []

    # ---- setup and teardown -------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._recorder is not None:  # an earlier train() raised: its timed steps to its file, its hooks off
            listeners, self.step_listeners = self.step_listeners, []  # (not this run's steps: no rank choice on them)
            self._at_exit()
            self.step_listeners = listeners
            self._release()
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        self._report_to = args.report_to  # the trackers the live warnings go to, beside TensorBoard
        forget_counters()  # an earlier train() call's allocator read at a step of the same number is not this one's
        model = kwargs.get("model")
        report_parallelism(model, args, state, self.run_dir)
        loader = kwargs.get("train_dataloader")
        params = list(model.parameters()) if model is not None else []
        self._device = training_device(args, params)
        if self.args.measure_comm_overhead > 0 and model is not None and loader is not None:
            self.comm = comm_overhead.measure_before_training(
                model, loader, args.per_device_train_batch_size, self._device, self.args.measure_comm_overhead)

        recorder = StepRecorder(default_clock(self._device), run_queue=RunQueueClock())
        self._host_timed = recorder.clock.cheap_marks
        # NVTX is a CUDA API; without CUDA the Nsight callback says once that --nvtx does nothing.
        labels = self._labels = PhaseLabels(nvtx=self.args.nvtx and torch.cuda.is_available())

        def on_fetch() -> None:
            if self.before_fetch is not None:
                self.before_fetch()
            labels.fetch()
            recorder.fetch_begin()  # last: the run-queue reading as close to the next() as the clock's start

        self._undo_loader = instrument_loader(loader, recorder.add_load_time, on_fetch) if loader is not None else None
        recorder.loader_timed = self._undo_loader is not None
        recorder.loads_elsewhere = loads_elsewhere(loader, dist.get_rank())  # accelerate's dispatch_batches
        self._loader = loader_settings(loader)  # (the data advice asks for what it does not set)
        if model is not None:
            self._hooks = ModelHooks(model, recorder, labels)
        self._recorder = recorder
        self._peak_tflops = self.args.peak_tflops
        if self._peak_tflops is None and self._device.type == "cuda":
            self._peak_tflops = peak_tflops_for_device(torch.cuda.get_device_name(self._device))
        self._first_step = state.global_step + 1
        self._gathered_step = state.global_step
        self._log_step = None
        # The first buffer fits an interval of the Trainer's logging steps (the same on every rank; rows are most).
        every = float(getattr(state, "logging_steps", 0) or 0)
        self._pending, self._gather_cap = None, dist.json_cap(min(int(every), ROWS_KEPT) if every >= 1 else ROWS_KEPT)
        self._flos_logged = self._flos_begin = float(state.total_flos)
        self._interval, self._run, self._warmup, self._paused = (PhaseTotals() for _ in range(4))
        self._rows, self._streak, self._ended_early, self._live = deque(maxlen=ROWS_KEPT), {}, None, None
        self._health = {}
        self._busy_at_begin, self._busy_steps, self._after_pause, self._skipped = False, set(), set(), 0
        self._series = StepSeries(dist.get_world_size())
        self._traced = traced_steps(self.args, state.global_step, state.max_steps, dist.get_world_size())
        self._growth_watch = GrowthWatch(
            self.args.memory_growth_threshold_pct, self._memory_kind(), self._distorts_memory, start=state.global_step
        )

        if self.run_dir is not None:  # None: the folder could not be created (paths warned once)
            path = self.run_dir / paths.TIMING_LOG_NAME.format(rank=dist.get_rank())
            self._jsonl = JsonlFile(path, "step timing goes to the logs only")
        atexit.register(self._at_exit)  # training died (an exception): the steps timed so far still reach the file
        signals.at_default_death(self._at_exit, guard=True)  # SIGTERM: no atexit then
        self._writer = tensorboard.get_writer(tensorboard.tensorboard_dir(args.output_dir, self.run_dir))
        if self._writer is not None:
            self._writer.add_custom_scalars(publish.custom_scalars_layout())
        recorder.boundary()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is None:
            return
        self._labels.exit()
        self._finish_gather(state, None)  # a logging step whose on_log never came (a Trainer that skipped it)
        payload = self._guarded(self._final_payload)
        gathered = dist.all_gather_object(payload)  # the end-of-run gather; every rank reaches it
        if dist.get_rank() == 0 and all(g is not None for g in gathered):
            self._guarded(self._write_summary, gathered, state)
        self._release()
        if self._writer is not None:
            self._writer.flush()

    def _release(self) -> None:
        """The model's and the loader's hooks taken off, the jsonl closed, the exit handlers forgotten."""
        self._labels.exit()  # (a phase range a train() that raised left open: NVTX's too)
        if self._hooks is not None:
            self._hooks.remove()
        if self._undo_loader is not None:
            self._undo_loader()
        if self._jsonl is not None:
            self._jsonl.close()
        atexit.unregister(self._at_exit)
        signals.forget_at_default_death(self._at_exit)
        self._hooks = self._undo_loader = self._recorder = None

    # ---- the step: marks only -----------------------------------------------------------------

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is not None:
            self._recorder.boundary()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is not None:
            self._labels.exit()
            self._recorder.step_begin()
            self._busy_at_begin = any(bool(b()) for b in (self.profiler_busy, self.memory_busy) if b is not None)

    def on_substep_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is not None:
            self._recorder.micro_end()
            self._labels.exit()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._recorder is not None:
            self._recorder.optimizer_begin()
            self._labels.enter("optimizer")

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._recorder is not None:
            self._labels.exit()
            self._recorder.optimizer_end()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is None:
            return
        ended_early = self._ended_early == state.global_step  # before the trace (and its summary) was written
        if self._busy_at_begin or (not ended_early and self.profiler_busy is not None and self.profiler_busy()):
            self._busy_steps.add(state.global_step)
        if ended_early:
            # The profiler wrote a trace since (end_step_before_export): the next step's data wait starts now.
            self._ended_early = None
            self._recorder.boundary()
        else:
            # Closed at on_optimizer_step already, unless a trainer skipped that hook: then the open phase would
            # keep the next step's data phase from opening.
            self._labels.exit()
            self._recorder.step_end(state.global_step)
        # DefaultFlowCallback (always the first callback) has decided on every rank whether the Trainer
        # logs this step; the gather follows that decision, not whoever calls on_log.
        self._mark_log_step(state, control)
        if self._recorder.pending_steps >= MAX_PENDING_STEPS:
            self._guarded(self._drain)  # local only: bounded memory when logging is rare or off

    def _distorted(self, step: int) -> bool:
        """Whether the profiler ran over ``step`` or was still busy with a written trace during it."""
        return bool(self._traced is not None and self._traced(step)) or step in self._busy_steps

    def end_step_before_export(self, step: int) -> None:
        """End optimizer step ``step`` now: the profiler is about to write a trace in its ``on_step_end`` (called by
        :class:`~hf_distprof.callbacks.profiler.callback.ProfilerCallback`, which runs before this callback): the
        export is the profiler's, neither this step's nor the next one's data wait."""
        if self._recorder is None:
            return
        self._labels.exit()
        self._recorder.step_end(step)
        self._ended_early = step

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is not None:
            self._mark_log_step(state, control)  # logging_strategy="epoch"

    def _mark_log_step(self, state: TrainerState, control: TrainerControl) -> None:
        # Same condition as the Trainer's _maybe_log_save_evaluate: a step already logged is not logged again.
        if control.should_log and state.global_step > self._gathered_step:
            self._log_step = state.global_step
            self._start_gather(state)

    def _start_gather(self, state: TrainerState) -> None:
        """Start this logging step's gather of every rank's figures, without waiting: the Trainer's own loss gather
        (a blocking all-gather on every logging step) runs between this ``on_step_end`` and ``on_log``, which reads
        the result. The ranks' wait for each other is then the Trainer's, paid once, not ours again."""
        if self._pending is not None:  # an earlier logging step whose on_log never came
            self._finish_gather(state, None)
        payload = self._guarded(self._interval_payload, state.global_step)
        self._pending = (state.global_step, dist.all_gather_json_async(payload, self._gather_cap))
        self._gathered_step = state.global_step

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._recorder is not None:
            self._recorder.boundary()  # checkpoint time is not the next step's data wait
            self._after_pause.add(state.global_step + 1)  # which waits in its first collective for the slowest rank

    on_evaluate = on_save

    # ---- logging steps: resolve, one gather, publish ------------------------------------------

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._recorder is None:
            return
        # Gather only on the Trainer's own logging steps, which every rank reaches. Other on_log calls
        # (evaluation metrics, a user's trainer.log() that may run on rank 0 only) must not enter a
        # collective: a rank alone in all_gather_object waits forever.
        if self._log_step is not None and self._log_step == state.global_step:
            self._log_step = None
            self._finish_gather(state, kw.get("logs"))
        self._recorder.boundary()  # logging time is not the next step's data wait

    def _finish_gather(self, state: TrainerState, logs: dict[str, Any] | None) -> None:
        """Read the started gather (every rank, at the same point) and publish it on rank 0."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        step, gather = pending
        gathered = gather.result()
        self._gather_cap = gather.next_cap
        if dist.get_rank() == 0 and all(g is not None for g in gathered):
            self._guarded(self._publish_interval, gathered, state, logs, step)

    def _drain(self, wait: bool = True) -> None:
        """Resolve finished steps into the running totals and the jsonl file (no collective). On a GPU the steps
        whose events have completed go first, while the device still runs the newest one; then, with ``wait``, the
        one wait."""
        assert self._recorder is not None
        for then in (False, True)[:1 + wait]:
            self._take(self._recorder.resolve(wait=then))

    def _take(self, timings: list[StepTiming]) -> None:
        rows = [self._row(t) for t in timings]  # each step's figures made once: summed, kept, written
        for timing, row in zip(timings, rows, strict=True):
            self._add(timing, row)
        if self._jsonl is not None and timings:  # a full disk: said once; the caller still reaches its collective
            self._jsonl.write((b"\n".join(map(orjson.dumps, rows)) + b"\n").decode())

    def _row(self, timing: StepTiming) -> dict[str, Any]:
        """One ``timing_rank{R}.jsonl`` line: the timing, what the ranks are compared on (``own_work_s``), and
        whether the step is this timer's warm-up or one the profiler ran over: the analysis judges the same
        steps on the same figure again (:mod:`hf_distprof.analysis.judge.verdicts`)."""
        row = timing.to_json()
        row["own_work_s"] = timing.own_work_s if self._host_timed else timing.pre_sync_s
        row["own_step_s"] = timing.own_step_s if self._host_timed else timing.step_s
        row["warmup"] = timing.step < self._first_step + WARMUP_STEPS
        row["after_pause"] = timing.step in self._after_pause or (self._traced is not None
                                                                 and after_window(self._traced, timing.step))
        row["traced"] = bool(self._traced is not None and self._traced(timing.step))
        row["profiler_busy"] = timing.step in self._busy_steps
        return row

    def flush(self) -> None:
        """Resolve the steps finished so far now, as a logging step does (on GPU: one wait for the device).

        For callers that need this rank's step times on a logging step before this callback's ``on_log``.
        """
        if self._recorder is not None:
            self._guarded(self._drain)

    def _at_exit(self) -> None:
        """The interpreter exits before train end (an exception out of ``train()``, a signal through the profiler's
        handlers): the steps already finished go to the jsonl file, without waiting for the device (a hung collective
        must not keep the process from ending). No collective, no summary."""
        if self._recorder is not None and self._jsonl is not None:
            self._recorder.drop_device_tokens()  # (a GPU's attention masks: counting them would wait)
            self._guarded(self._drain, False)
            self._jsonl.close()

    def _add(self, timing: StepTiming, row: dict[str, Any]) -> None:
        if row["warmup"] or row["after_pause"]:
            (self._warmup if row["warmup"] else self._paused).add_row(row)
            self._skipped += 1
            return
        self._interval.add_row(row, self._run)
        for listener in self.step_listeners:
            listener(timing)
        if timing.pre_sync_s is not None:
            self._rows.append(step_row(timing, self._host_timed))

    def _summaries(self, totals: PhaseTotals, step: int | None = None) -> dict[str, Any] | None:
        if totals.steps == 0:
            return None
        peak = peak_memory_bytes(self._device, step)
        return totals.to_rank_summary(dist.get_rank(), dist.get_hostname(), peak).__dict__.copy()

    def _interval_payload(self, step: int | None = None) -> dict[str, Any]:
        self._drain()
        payload = {
            "interval": self._summaries(self._interval, step),
            "run": self._summaries(self._run, step),
            "rows": list(self._rows),
            "memory": current_memory_bytes(self._device, step),  # the allocator read once at this step
            "gpu": gpu_health.of_device(self._device),
        }
        self._interval, self._skipped_sent, self._skipped = PhaseTotals(), self._skipped, 0
        self._rows.clear()
        return payload

    def _final_payload(self) -> dict[str, Any]:
        self._drain()
        rows = list(self._rows)
        self._rows.clear()
        # A run of WARMUP_STEPS steps or fewer has nothing else to report: use what there is.
        return {"run": self._summaries(self._run if self._run.steps else self._warmup), "rows": rows,
                "gpu": gpu_health.of_device(self._device)}

    def _add_rows(self, gathered: list[dict[str, Any]]) -> None:
        assert self._series is not None
        self._series.add([g.get("rows") or [] for g in gathered])
        self._health = {rank: g["gpu"] for rank, g in enumerate(gathered) if g.get("gpu")}

    def _report(self, summaries: list[Any], flops: float | None, verdict: Any = None,
                burst: Any = None) -> CrossRankReport | None:
        if any(s is None for s in summaries):
            return None
        cause = self._cause(verdict) if verdict is not None and verdict.raised else None
        return cross_rank_report(
            [RankSummary.from_dict(s) for s in summaries],
            self.args.imbalance_threshold_pct,
            self.args.memory_imbalance_threshold_pct,
            flops=flops,
            peak_tflops=self._peak_tflops,
            verdict=verdict,
            on_gpu=getattr(self._device, "type", "cpu") == "cuda",
            cause=cause, burst=burst, loader=self._loader)

    def _exclude(self) -> Callable[[int], bool] | None:
        """The steps the verdict leaves out: the profiler's (its own distortion), unless fewer than 2 are left (the
        profiler ran over nearly every step: those are all there is to judge)."""
        assert self._series is not None
        untraced = [s for s in self._series.step_times() if not self._distorted(s)]
        return self._distorted if len(untraced) >= 2 else None

    def _cause(self, verdict: Any) -> Attribution | None:
        """Why the verdict's rank makes its peers wait, over the steps the verdict judged, with what the GPUs show."""
        assert self._series is not None
        found = self._series.cause(verdict.rank, self.args.imbalance_threshold_pct, self._exclude())
        return with_device(found, self._health) if found is not None else None

    def _verdict(self) -> Any:
        """The slow-rank verdict over the steps so far, the profiler's steps left out; None with one rank (no peer)."""
        s, pct = self._series, self.args.imbalance_threshold_pct
        return s.verdict(pct, self._exclude()) if s is not None and s.world_size > 1 else None

    def _live_verdict(self) -> tuple[Any, bool]:
        """The live slow-rank verdict, and whether it was judged now (:meth:`StepSeries.due`); the end of the run
        always judges anew."""
        assert self._series is not None
        fresh = self._live is None or self._series.due(self._live[1])
        if fresh:
            self._live = (self._verdict(), self._series.added)
        assert self._live is not None
        return self._live[0], fresh

    def _persistent(self, key: str, subject: int | None) -> bool:
        """Whether ``subject`` was over its threshold at this logging step and the previous one."""
        previous = self._streak.get(key)
        self._streak[key] = subject
        return subject is not None and previous == subject

    def _publish_interval(
        self, gathered: list[dict[str, Any]], state: TrainerState, logs: dict[str, Any] | None, step: int
    ) -> None:
        # The Trainer's FLOP count is its own at this logging step (store_flos before on_log); read later, it would
        # hold steps after the interval: no MFU for that interval then.
        flops = float(state.total_flos) - self._flos_logged if state.global_step == step else 0.0
        counted = min((g["interval"] or {}).get("steps", 0) for g in gathered)  # (FLOPs of the steps in the means)
        flops *= counted / (counted + self._skipped_sent) if counted else 0.0
        interval = self._report([g["interval"] for g in gathered], flops if flops > 0 else None)
        self._flos_logged = float(state.total_flos)  # read late or not, the next interval counts from here
        if interval is not None and self._writer is not None:
            publish.write_scalars(self._writer, interval, step)
        if interval is not None:
            # Callbacks after this one (the progress printer) see them in `logs`; the entry the Trainer
            # already appended to log_history for this step (saved in trainer_state.json) gets them too.
            figures = publish.headline_figures(interval)
            if logs is not None:
                logs.update(figures)  # the trackers after us get them (hf_distprof.callbacks.order)
            trackers.send_live(trackers.renamed_by_trainer(self._report_to), figures, step)  # (see there)
            if state.log_history and state.log_history[-1].get("step") == step:
                state.log_history[-1].update(figures)
        # Live warnings come from the run so far, never from one window, and only when the verdict held at
        # the previous logging step too (persistence across windows); each (kind, rank) is said once.
        self._add_rows(gathered)
        verdict, fresh = self._live_verdict()
        if any(g["run"] is None for g in gathered):
            return
        # One rank has no peer to be slower than or to hold more memory than: no report over the run to judge then.
        run = self._report([g["run"] for g in gathered], None, verdict) if len(gathered) > 1 else None
        slow = verdict.rank if verdict is not None and verdict.raised else None
        if run is not None and fresh and self._persistent("time", slow):  # held when judged now and before
            self._warn_once("time", run.slowest_rank, step, run.warnings[0])
        mem_over = run is not None and (run.memory_imbalance_pct or 0.0) > run.memory_threshold_pct  # (threshold >= 0)
        if run is not None and self._persistent("memory", run.max_memory_rank if mem_over else None):
            warning = memory_warning(run.ranks, run.memory_imbalance_pct or 0.0, run.memory_threshold_pct)
            self._warn_once("memory", run.max_memory_rank or 0, step, warning)
        if self.args.enable_memory_logging:
            return  # the memory logger, with its finer samples, owns the growth verdict
        for rank, g in enumerate(gathered):
            if g.get("memory") is not None:
                # Warned when the verdict held at this logging step and the previous one.
                growth = self._growth_watch.add(rank, step, float(g["memory"]) / MB)
                if growth is not None:
                    self._warn_once("growth", rank, step, growth.message)

    def _growth(self, rank: int) -> MemoryGrowth | None:
        """The memory-growth verdict of ``rank``; None when the memory logger (finer samples) owns it."""
        return None if self.args.enable_memory_logging else self._growth_watch.verdict(rank)

    def _distorts_memory(self, step: int) -> bool:
        """Whether the profiler traced ``step``: its buffers grow the RSS, which is then not the run's own."""
        return self._device.type != "cuda" and self._traced is not None and bool(self._traced(step))

    def _memory_kind(self) -> str:
        return "allocated CUDA memory" if self._device.type == "cuda" else "process RSS"

    def _warn_once(self, kind: str, rank: int, step: int, warning: str) -> None:
        if (kind, rank) not in self._warned:
            self._warned[(kind, rank)] = step
            logger.warning(f"step {step}: {warning}")
            self._event(warning, step)

    def _event(self, warning: str, step: int) -> None:
        """``warning`` where the run's scalars are (TensorBoard), at ``step``, and in every other tracker's run."""
        if self._writer is not None:
            self._writer.add_text(WARNINGS_TAG, warning, step)
        trackers.send_text(self._report_to, WARNINGS_TAG, warning, step)

    def _write_summary(self, gathered: list[dict[str, Any]], state: TrainerState) -> None:
        runs = [g["run"] for g in gathered]
        counted = min(r["steps"] for r in runs) if all(runs) else 0
        all_steps = counted + (WARMUP_STEPS if self._run.steps else 0) + self._paused.steps
        # The Trainer counts FLOPs for every step; scale to the steps in the means (equal work per step).
        flops = (float(state.total_flos) - self._flos_begin) * counted / all_steps if all_steps else None
        self._add_rows(gathered)
        final = self._verdict()
        assert self._series is not None
        # A rank slowest in a few steps only, whose peers waited for it there (beside a slow rank: beyond its usual).
        raised = final.rank if final is not None and final.raised else None
        burst = self._series.burst(self.args.imbalance_threshold_pct, self._exclude(), raised, quiet_gate(final))
        report = self._report(runs, flops, final, burst)  # (the burst's rank the table's slowest, as analyze's)
        if report is None:
            return
        cause = self._cause(final) if final is not None and final.raised else None
        live, withdrawn = live_time_warnings(self._warned, final)
        report.warnings.extend(withdrawn)
        slowdown = self._series.profiler_slowdown(self._busy_steps, self._traced, self.args, self._host_timed)
        if slowdown is not None and slowdown.warning is not None:
            report.warnings.append(slowdown.warning[0].upper() + slowdown.warning[1:])
        report.warnings.extend([burst.message] if burst is not None else [])
        summary: dict[str, Any] = {
            "world_size": len(gathered),
            "steps_in_means": counted,
            "warmup_steps_excluded": WARMUP_STEPS if self._run.steps else 0,
            "pause_steps_excluded": self._paused.steps,
            "last_step": state.global_step,
            "imbalance_basis": "pre_sync_s",
            **report.to_json(),
            "per_rank": report.to_json()["ranks"],
            "peak_tflops": self._peak_tflops,
            "comm_overhead": self.comm,
            "profiler_slowdown": slowdown.to_json() if slowdown is not None else None,
            "memory_growth": [g.to_json() for g in map(self._growth, range(len(gathered))) if g is not None],
            "live_time_warnings": live,
            "slow_rank_cause": cause.to_json() if cause is not None else None,
            "burst": burst.to_json() if burst is not None else None,
            "dataloader": self._loader.to_json() if self._loader is not None else None,
            "gpu_health": {str(rank): h for rank, h in sorted(self._health.items())},
            "files": sorted(paths.TIMING_LOG_NAME.format(rank=r) for r in range(len(gathered))),
        }
        del summary["ranks"]
        self.summary = summary
        publish.end_of_run(self.run_dir, summary, report, self.comm, lambda w: self._event(w, state.global_step))

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """Run local reporting work; a failure becomes one warning and training goes on."""
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001  # profiling never crashes training
            if not self._failed:
                self._failed = True
                logger.warning(f"step timing: {fn.__name__} failed ({err!r}); training continues")
            return None
