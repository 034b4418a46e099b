"""``MemoryLoggerCallback``: memory per rank every ``--memory-log-steps`` optimizer steps, its growth, and a
cross-rank table at the end of training."""

from __future__ import annotations

import atexit
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard, trackers
from hf_distprof.callbacks.memory import tools as memory_tools
from hf_distprof.callbacks.memory import stats as memstats
from hf_distprof.config import ProfilingArguments
from hf_distprof.core import signals
from hf_distprof.callbacks.memory.stats import MB
from hf_distprof.callbacks.parallelism import report_parallelism
from hf_distprof.callbacks.profiler.schedule import traced_steps
from hf_distprof.core.growth import GrowthWatch, MemoryGrowth
from hf_distprof.core.verdicts import imbalance_pct
from hf_distprof.timing.jsonl import JsonlFile

logger = dist.get_logger(__name__)
WARNINGS_TAG = "hf_distprof/warnings"  # the step timer's tag for its live warnings: one place for every warning

_MB = MB
_INF = float("inf")


def read_memory(reset_peaks: bool = False, step: int | None = None) -> dict[str, float]:
    """Memory of this process in MiB, read without any device synchronisation.

    Args:
        reset_peaks: Reset the peak counters after reading them, so that the next sample's peaks belong to
            the steps in between (a peak per logging window, not per lifetime).
        step: The optimizer step it is read at: the allocator's counters are read once per step, whoever asks
            (:func:`hf_distprof.callbacks.memory.stats.cuda_counters`).

    Returns:
        Always ``rss_mb``, ``vms_mb`` (host) and ``peak_rss_mb`` (the process's peak RSS since the last
        reset; Linux). With CUDA also ``allocated_mb``, ``reserved_mb``, ``fragmentation_mb`` (reserved
        minus allocated) and ``peak_allocated_mb`` (since the last reset) of the current device: caching
        allocator counters, kept by the host (no sync).
    """
    sample = memstats.host_memory()
    peak = memstats.window_peak_bytes if reset_peaks else memstats.current_peak_bytes
    # The kernel's peak (getrusage) can trail the resident size just read (/proc/self/statm: its counters are
    # summed from per-CPU caches at different times): a peak is never below the value it peaks over.
    sample["peak_rss_mb"] = max(peak(torch.device("cpu")) / _MB, sample["rss_mb"])
    memstats.note_peak(torch.device("cpu"), round(sample["peak_rss_mb"] * _MB))  # (the run's peak is never below it)
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        # One raw read of the allocator's counters: memory_allocated, memory_reserved and max_memory_allocated
        # would each build and flatten the whole memory_stats() dict (the memory logger's largest cost on an H100).
        allocated, reserved, cuda_peak = memstats.cuda_counters(device, step)
        sample["allocated_mb"] = allocated / _MB
        sample["reserved_mb"] = reserved / _MB
        sample["fragmentation_mb"] = sample["reserved_mb"] - sample["allocated_mb"]
        sample["peak_allocated_mb"] = peak(device, cuda_peak) / _MB
    return sample


def memory_metrics() -> tuple[str, ...]:
    """The metrics :func:`read_memory` gives in this process (CUDA's when CUDA is available)."""
    host = ("rss_mb", "vms_mb", "peak_rss_mb")
    if torch.cuda.is_available():
        return (*host, "allocated_mb", "reserved_mb", "fragmentation_mb", "peak_allocated_mb")
    return host


def in_use_metric() -> tuple[str, str]:
    """The metric whose steady rise means a leak, and its name for people: CUDA allocated, else RSS."""
    if torch.cuda.is_available():
        return "allocated_mb", "allocated CUDA memory"
    return "rss_mb", "process RSS"


def _line(sample: dict[str, Any]) -> str:
    """One ``memory_rank{R}.jsonl`` line: orjson's (several times faster than ``json``'s, cold or not), or ``json``'s
    where a value is NaN (a model state that could not be sized) or infinite, which orjson would write as null."""
    if all(-_INF < v < _INF for v in sample.values() if isinstance(v, float)):
        return orjson.dumps(sample).decode() + "\n"
    return json.dumps(sample) + "\n"


MODEL_STATE_METRICS = ("params_mb", "grads_mb", "optimizer_state_mb", "model_state_mb")


def model_state_memory(
    model: torch.nn.Module, optimizer: Any, params: Sequence[torch.Tensor] | None = None
) -> dict[str, float]:
    """This rank's share of the model state in MiB, from tensor sizes (no device access, no sync).

    Under DDP every rank holds all of it; under FSDP each rank holds its shard, which is where sharding
    saves memory. Gradients are counted while they exist (after the backward, before ``zero_grad``);
    DDP's gradient buckets and FSDP's gathered (unsharded) parameters are transient and not counted.

    Args:
        model: The model the Trainer trains.
        optimizer: Its optimizer (or accelerate's wrapper of it), or None.
        params: ``list(model.parameters())`` when the caller already has it (listing them walks every
            submodule: ~150 us on a 4-layer ModernBERT, most of this function's cost).

    Returns:
        ``params_mb``, ``grads_mb``, ``optimizer_state_mb`` and their sum ``model_state_mb``.
    """
    own = memory_tools.state_bytes(list(model.parameters()) if params is None else params, optimizer)
    out = {
        "params_mb": own["params"] / _MB,
        "grads_mb": own["grads"] / _MB,
        "optimizer_state_mb": own["optimizer_state"] / _MB,
    }
    out["model_state_mb"] = sum(out.values())
    return out


MAX_UNGATHERED = 10
"""Samples a rank keeps before gathering them without a logging step, so that rank 0's TensorBoard and
memory-growth warning do not wait for a rare logging step (the Trainer's default is every 500 steps)."""


class MemoryLoggerCallback(TrainerCallback):  # type: ignore[misc]
    """Logs memory every ``--memory-log-steps`` optimizer steps, watches it grow, and tabulates it at the end.

    Every rank appends its sample to ``<run folder>/memory_rank{R}.jsonl``: the process and device memory
    (:func:`read_memory`; its peaks are reset at each sample, so a logged peak belongs to the steps
    since the previous one), and the rank's share of parameters, gradients and optimizer state
    (:func:`model_state_memory`, taken right after the optimizer step, when gradients still exist), which
    makes FSDP's saving over DDP visible. On the Trainer's logging steps (and after :data:`MAX_UNGATHERED`
    samples without one), the samples taken since the previous gather are gathered to rank 0 in one
    collective, started without waiting and published at the first step end that finds it finished (at the
    latest at the next gather or train end). Rank 0 then writes TensorBoard scalars
    ``memory/<metric>/rank{R}`` and ``memory/<metric>/max`` at each sample's step and wall time, and warns,
    once per rank, when a rank's memory in use keeps growing (:func:`hf_distprof.core.growth.memory_growth`).
    At the end of training rank 0 prints a table of every rank's memory and peak, with the imbalance of the
    peaks, and writes it to
    ``memory_summary.json``.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.jsonl_path: Path | None = None
        self.summary: dict[str, Any] | None = None  # rank 0, after training: what memory_summary.json holds
        self._jsonl: JsonlFile | None = None
        self._writer: Any = None
        # This rank's samples since the last gather: (step, wall time, {metric: value}).
        self._ungathered: list[tuple[int, float, dict[str, float]]] = []
        # ([(step, wall time, metric names)] of the samples, started gather) of the last gather: published
        # once finished.
        self._pending: tuple[list[tuple[int, float, list[str]]], dist.PendingGather] | None = None
        # The model-state sample of the step being taken, from on_optimizer_step.
        self._model_state: dict[str, float] = {}
        # (model, its parameters), listed at the first sample of each train() call and reused after.
        self._params: tuple[torch.nn.Module, list[torch.Tensor]] | None = None
        # (what the sizes depend on, the model-state sample): reused while that stays the same.
        self._sized: tuple[Any, dict[str, float]] | None = None
        self._size_failed = False  # warned once already
        self._read_failed = False  # the same, for a memory read that raised
        self._publish_failed = False  # the same, for publishing a gathered sample
        # rank 0: each rank's MiB in use at each published sample, for the growth verdict.
        self._growth = GrowthWatch(args.memory_growth_threshold_pct, in_use_metric()[1])
        self._warned_growth: set[int] = set()
        self._report_to: Any = None

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # global_step is incremented after this hook: the step being taken is global_step + 1.
        model = kwargs.get("model")
        if (state.global_step + 1) % self.args.memory_log_steps != 0 or model is None:
            return
        try:
            # The parameters are listed once per train() call: a model does not change its parameters
            # between optimizer steps (FSDP has sharded them before the first step).
            if self._params is None or self._params[0] is not model:
                self._params = (model, list(model.parameters()))
                self._sized = None
            optimizer = kwargs.get("optimizer")
            params = self._params[1]
            # The sizes change when the optimizer creates its state (the first step) or gradients come or go; else
            # the walk over every tensor (tens of us per sample) gives the same numbers again.
            held = getattr(memory_tools.inner_optimizer(optimizer), "state", None)
            key = (id(optimizer), len(held) if held is not None else -1, len(params),
                   params[0].grad is not None if params else None, params[-1].grad is not None if params else None)
            if self._sized is None or self._sized[0] != key:
                self._sized = (key, model_state_memory(model, optimizer, params))
            self._model_state = self._sized[1]
        except Exception as err:  # noqa: BLE001 - an odd model must not stop training
            if not self._size_failed:
                self._size_failed = True
                logger.warning(f"could not size the model state: {err!r}; it is logged as nan")
            # The same metrics as on the other ranks, so that the gather's lengths agree.
            self._model_state = dict.fromkeys(MODEL_STATE_METRICS, float("nan"))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        report_parallelism(kwargs.get("model"), args, state, self.run_dir)
        self._report_to = args.report_to  # the trackers a growth warning goes to
        memstats.forget_counters()
        self._params = None
        self._sized = None
        self._write_lines()  # an earlier train() call raised: its samples since its last gather go to its file
        if self._jsonl is not None:
            self._jsonl.close()
        self._ungathered = []
        self._pending = None  # a gather left by a train() call that raised: not this run's samples
        if self.run_dir is not None:
            self.jsonl_path = self.run_dir / paths.MEMORY_LOG_NAME.format(rank=dist.get_rank())
            self._jsonl = JsonlFile(self.jsonl_path, "memory goes to TensorBoard only")
        self._writer = tensorboard.get_writer(tensorboard.tensorboard_dir(args.output_dir, self.run_dir))
        # Lines are written at each gather; a run that ends by an exception still writes the samples since the last.
        atexit.unregister(self._write_lines)  # (registered once, also after a train() call that raised)
        atexit.register(self._write_lines)
        signals.at_default_death(self._write_lines, guard=True)  # SIGTERM: no atexit then
        # On CPU the profiler's buffers grow the RSS while it traces: those intervals are not the run's own.
        traced = traced_steps(self.args, state.global_step, state.max_steps, dist.get_world_size()) \
            if not torch.cuda.is_available() else None
        self._growth = GrowthWatch(
            self.args.memory_growth_threshold_pct, in_use_metric()[1], traced, start=state.global_step
        )
        # The first window's peak starts now, not at process start (model loading, tokenizer training).
        try:
            read_memory(reset_peaks=True)
        except Exception as err:  # noqa: BLE001 - the samples say it again if it keeps failing
            logger.warning(f"could not reset the memory peaks at the start of training ({err!r})")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step
        if self._pending is not None and self._pending[1].done():
            self._publish_pending()  # finished: publish it now rather than at the next gather
        if step % self.args.memory_log_steps == 0:
            self._sample(step)
        # The one collective of this callback during training, on the Trainer's logging steps; every rank
        # reaches it with the same samples (the same steps, the same metrics).
        if self._ungathered and (control.should_log or len(self._ungathered) >= MAX_UNGATHERED):
            self._gather()

    def _sample(self, step: int) -> None:
        measured_at = time.time()
        try:
            memory = read_memory(reset_peaks=True, step=step)
        except Exception as err:  # noqa: BLE001 - a failed read must not stop training, nor the gather after it
            if not self._read_failed:
                self._read_failed = True
                logger.warning(f"step {step}: could not read memory ({err!r}); logged as nan while it fails")
            # The same metrics as every other rank's sample, so that the gather's lengths agree.
            memory = dict.fromkeys(memory_metrics(), float("nan"))
        sample = {**memory, **self._model_state}
        self._model_state = {}
        self._ungathered.append((step, measured_at, sample))

    def _write_lines(self) -> None:
        """Append the samples since the last gather to ``memory_rank{R}.jsonl``, one line each, in one write."""
        if self._jsonl is None or not self._ungathered:
            return
        rank = dist.get_rank()
        # (A full disk must not stop training, nor keep this rank from the gather after it: one warning.)
        self._jsonl.write("".join(_line({"step": step, "rank": rank, **sample})
                                  for step, _, sample in self._ungathered))

    def _gather(self) -> None:
        """Start gathering the samples since the last gather, after publishing the one before.

        It is not waited for here: its result is published once finished (at the latest at the next gather or
        train end), so the gather adds no synchronisation point to the step. Every rank samples the same
        metrics at the same steps (CUDA is on all ranks or none; the Trainer passes the model to every rank's
        hooks), so one flat float gather carries them all.
        """
        self._publish_pending()
        self._write_lines()
        layout = [(step, measured_at, sorted(sample)) for step, measured_at, sample in self._ungathered]
        flat = [sample[m] for (*_, metrics), (*_, sample) in zip(layout, self._ungathered) for m in metrics]
        self._ungathered = []
        self._pending = (layout, dist.all_gather_floats_async(flat))

    def _publish_pending(self) -> None:
        if self._pending is None:
            return
        layout, gather = self._pending
        self._pending = None
        rows = gather.result()
        if dist.get_rank() != 0:
            return
        try:
            self._publish(layout, rows)
        except Exception as err:  # noqa: BLE001 - rank 0's reporting must not stop training
            if not self._publish_failed:
                self._publish_failed = True
                logger.warning(f"could not publish the memory samples ({err!r}); training continues")

    def _publish(self, layout: list[tuple[int, float, list[str]]], rows: list[list[float]]) -> None:
        """Rank 0: the gathered samples to the growth verdict and TensorBoard."""
        in_use = in_use_metric()[0]
        offset = 0
        events: list[tuple[dict[str, float], int, float]] = []
        for step, measured_at, metrics in layout:
            values = [row[offset : offset + len(metrics)] for row in rows]  # [rank][metric]
            offset += len(metrics)
            if in_use in metrics:
                column = metrics.index(in_use)
                for rank, row in enumerate(values):
                    # Warned once per rank, when the verdict held at this sample and the previous one.
                    growth = self._growth.add(rank, step, row[column])
                    if growth is not None and rank not in self._warned_growth:
                        self._warned_growth.add(rank)
                        logger.warning(f"step {step}: {growth.message}")
                        trackers.send_text(self._report_to, WARNINGS_TAG, growth.message, step)
            if self._writer is None:
                continue
            scalars: dict[str, float] = {}
            for i, metric in enumerate(metrics):
                for rank, row in enumerate(values):
                    scalars[f"memory/{metric}/rank{rank}"] = row[i]
                read = [row[i] for row in values if math.isfinite(row[i])]  # a rank's failed read (NaN) left out
                scalars[f"memory/{metric}/max"] = max(read) if read else math.nan
            events.append((scalars, step, measured_at))
        if events:  # one event per sample, in one write
            tensorboard.add_scalar_events(self._writer, events)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._ungathered:
            self._gather()
        self._publish_pending()
        self._params = None
        atexit.unregister(self._write_lines)
        signals.forget_at_default_death(self._write_lines)
        if self._jsonl is not None:
            self._jsonl.close()
        self._final_table(state)
        if self._writer is not None:
            self._writer.flush()

    # ---- the end-of-training table -------------------------------------------------------------

    def _final_table(self, state: TrainerState) -> None:
        """Gather every rank's memory now and its peak over the run; rank 0 prints and writes the table."""
        try:
            sample = read_memory()
            sample["peak_rss_mb"] = max(memstats.lifetime_peak_bytes(torch.device("cpu")) / _MB, sample["rss_mb"])
            if "peak_allocated_mb" in sample:
                device = torch.device("cuda", torch.cuda.current_device())
                sample["peak_allocated_mb"] = memstats.lifetime_peak_bytes(device) / _MB
        except Exception as err:  # noqa: BLE001 - this rank still joins the gather below, with nan
            logger.warning(f"could not read memory at the end of training ({err!r}); its row is nan")
            sample = dict.fromkeys(memory_metrics(), float("nan"))
        row = {"rank": dist.get_rank(), "host": dist.get_hostname(), **sample}
        try:
            rows = dist.all_gather_object(row)  # once, after the last step; every rank reaches train end
        except Exception as err:  # noqa: BLE001 - a broken process group at the end must not hide training
            logger.warning(f"could not gather the end-of-training memory table: {err!r}")
            return
        if dist.get_rank() != 0:
            return
        self.summary = memory_summary(rows, self.args, state.global_step, self._growth.verdicts())
        if self.run_dir is not None:
            target = self.run_dir / paths.MEMORY_SUMMARY_NAME
            try:
                paths.atomic_write_text(target, json.dumps(self.summary, indent=2) + "\n")
            except OSError as err:
                logger.warning(f"cannot write {target}: {err!r}")
        where = self.run_dir if self.run_dir is not None else "no run folder, no files"
        # From a fresh line: a progress bar (tqdm, on stderr) leaves the cursor at the end of its own line.
        print("\n" + format_memory_table(self.summary, title=f"hf_distprof memory at the end of training ({where})"),
              flush=True)
        if self.summary["peak_over_threshold"] and not self.args.enable_step_timing:
            logger.warning(self.summary["peak_warning"])  # the step timer says it otherwise



def memory_summary(
    rows: list[dict[str, Any]], args: ProfilingArguments, last_step: int, growth: list[MemoryGrowth]
) -> dict[str, Any]:
    """What ``memory_summary.json`` holds: every rank's memory at the end, the peaks and their imbalance.

    Args:
        rows: One dict per rank, in rank order: ``rank``, ``host`` and the :func:`read_memory` metrics,
            with the peaks over the whole run.
        args: The flags (``--memory-imbalance-threshold-pct``, ``--memory-growth-threshold-pct``).
        last_step: The last optimizer step.
        growth: The memory-growth verdicts raised.
    """
    basis = "peak_allocated_mb" if "peak_allocated_mb" in rows[0] else "peak_rss_mb"
    peaks = [float(r[basis]) for r in rows]
    read = [i for i in range(len(rows)) if math.isfinite(peaks[i])] or [0]  # a rank whose read failed (NaN) left out
    highest = max(read, key=lambda i: peaks[i])
    lowest = min(read, key=lambda i: peaks[i])
    imbalance = imbalance_pct([peaks[i] for i in read]) if len(read) > 1 else 0.0
    threshold = args.memory_imbalance_threshold_pct
    warning = (
        f"Peak memory imbalance {imbalance:.1f}% > {threshold:g}% ({basis}): rank {rows[highest]['rank']} peaks at "
        f"{peaks[highest]:.0f} MiB vs {peaks[lowest]:.0f} MiB on rank {rows[lowest]['rank']}: look for work only "
        "that rank does (logging, evaluation, checkpointing on rank 0; the profiler's window when --profile-ranks "
        "traces only some ranks) or uneven batches"
    )
    return {
        "world_size": len(rows),
        "last_step": last_step,
        "peak_basis": basis,
        "per_rank": rows,
        "peak_imbalance_pct": imbalance,
        "highest_peak_rank": rows[highest]["rank"],
        "imbalance_threshold_pct": threshold,
        "peak_over_threshold": len(rows) > 1 and imbalance > threshold,
        "peak_warning": warning if len(rows) > 1 and imbalance > threshold else None,
        "memory_growth": [g.to_json() for g in growth],
        "growth_threshold_pct": args.memory_growth_threshold_pct,
    }


_TABLE_COLUMNS = (
    ("allocated_mb", "allocated"), ("reserved_mb", "reserved"), ("peak_allocated_mb", "peak alloc"),
    ("rss_mb", "RSS"), ("peak_rss_mb", "peak RSS"),
)


def format_memory_table(summary: dict[str, Any], title: str) -> str:
    """The end-of-training table rank 0 prints: one row per rank, MiB, the highest peak marked."""
    rows = summary["per_rank"]
    columns = [(key, name) for key, name in _TABLE_COLUMNS if key in rows[0]]
    lines = [title, f"{'rank':>5}  {'host':<16}" + "".join(f"{name:>12}" for _, name in columns)]
    for r in rows:
        mark = "  <- highest peak" if r["rank"] == summary["highest_peak_rank"] and len(rows) > 1 else ""
        cells = "".join(f"{float(r[key]):>8.0f} MiB" for key, _ in columns)
        lines.append(f"{r['rank']:>5}  {str(r['host'])[:16]:<16}{cells}{mark}")
    lines.append(
        f"peak imbalance ({summary['peak_basis']}): {summary['peak_imbalance_pct']:.1f}% "
        f"(threshold {summary['imbalance_threshold_pct']:g}%)"
    )
    for g in summary["memory_growth"]:
        lines.append(g["message"])
    return "\n".join(lines)


# The name PROFILING_GUIDE.md and earlier scripts use.
SimpleGPUMemoryCallback = MemoryLoggerCallback
