"""``MemoryLoggerCallback``: memory per rank every ``--memory-log-steps`` optimizer steps."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

import psutil
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard
from hf_distprof.callbacks._common import warn_if_not_data_parallel
from hf_distprof.config import ProfilingArguments

logger = dist.get_logger(__name__)

_MB = 1024 * 1024
_PROCESS: psutil.Process | None = None


def _this_process() -> psutil.Process:
    """This process's psutil handle, made once per pid (a forked child gets its own)."""
    global _PROCESS
    if _PROCESS is None or _PROCESS.pid != os.getpid():
        _PROCESS = psutil.Process()
    return _PROCESS


def read_memory() -> dict[str, float]:
    """Memory of this process in MiB, read without any device synchronisation.

    Returns:
        ``rss_mb`` (host resident set size) always; with CUDA also ``allocated_mb``, ``reserved_mb`` and
        ``peak_allocated_mb`` of the current device, which are caching-allocator counters (no sync).
    """
    sample = {"rss_mb": _this_process().memory_info().rss / _MB}
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        sample["allocated_mb"] = torch.cuda.memory_allocated(device) / _MB
        sample["reserved_mb"] = torch.cuda.memory_reserved(device) / _MB
        sample["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / _MB
    return sample


class MemoryLoggerCallback(TrainerCallback):  # type: ignore[misc]
    """Logs memory every ``--memory-log-steps`` optimizer steps.

    Every rank appends its sample to ``<run folder>/memory_rank{R}.jsonl``. On those steps only, the
    samples are gathered to rank 0 (without waiting: published at the next logging step or train end),
    which writes TensorBoard scalars ``memory/<metric>/rank{R}`` and
    ``memory/<metric>/max``.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.jsonl_path: Path | None = None
        self._jsonl: IO[str] | None = None
        self._writer: Any = None
        # (step, metric names, started gather) of the last logging step, published at the next one.
        self._pending: tuple[int, list[str], dist.PendingGather] | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        warn_if_not_data_parallel(args)
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        if self.run_dir is not None:
            self.jsonl_path = self.run_dir / paths.MEMORY_LOG_NAME.format(rank=dist.get_rank())
            try:
                # Kept open for the run, line-buffered: one short line per logging step.
                self._jsonl = open(self.jsonl_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            except OSError as err:
                logger.warning(f"cannot write {self.jsonl_path}: {err!r}; memory goes to TensorBoard only")
        self._writer = tensorboard.get_writer(tensorboard.tensorboard_dir(args.output_dir, self.run_dir))

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step
        if step % self.args.memory_log_steps != 0:
            return
        sample = read_memory()
        if self._jsonl is not None:
            try:
                self._jsonl.write(json.dumps({"step": step, "rank": dist.get_rank(), **sample}) + "\n")
            except OSError as err:
                # A full disk must not stop training, nor keep this rank from the gather below.
                logger.warning(f"cannot write {self.jsonl_path}: {err!r}; memory goes to TensorBoard only")
                self._close_jsonl()
        # The one collective of this callback, on logging steps only; every rank reaches it. It is not
        # waited for here: its result is published at the next logging step (or train end), so the gather
        # adds no synchronisation point to the step. Every rank samples the same metrics (CUDA is on all
        # ranks or none), so a flat float gather is enough.
        self._publish_pending()
        metrics = sorted(sample)
        self._pending = (step, metrics, dist.all_gather_floats_async([sample[m] for m in metrics]))

    def _publish_pending(self) -> None:
        if self._pending is None:
            return
        step, metrics, gather = self._pending
        self._pending = None
        rows = gather.result()
        if self._writer is None:
            return
        for i, metric in enumerate(metrics):
            values = [row[i] for row in rows]
            for rank, value in enumerate(values):
                self._writer.add_scalar(f"memory/{metric}/rank{rank}", value, step)
            self._writer.add_scalar(f"memory/{metric}/max", max(values), step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._publish_pending()
        self._close_jsonl()
        if self._writer is not None:
            self._writer.flush()

    def _close_jsonl(self) -> None:
        jsonl, self._jsonl = self._jsonl, None
        if jsonl is not None:
            try:
                jsonl.close()
            except OSError as err:
                logger.warning(f"closing {self.jsonl_path} failed: {err!r}")


# The name PROFILING_GUIDE.md and earlier scripts use.
SimpleGPUMemoryCallback = MemoryLoggerCallback
