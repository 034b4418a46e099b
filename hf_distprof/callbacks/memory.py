"""``MemoryLoggerCallback``: memory per rank every ``--memory-log-steps`` optimizer steps."""

from __future__ import annotations

import json
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


def read_memory() -> dict[str, float]:
    """Memory of this process in MiB, read without any device synchronisation.

    Returns:
        ``rss_mb`` (host resident set size) always; with CUDA also ``allocated_mb``, ``reserved_mb`` and
        ``peak_allocated_mb`` of the current device, which are caching-allocator counters (no sync).
    """
    sample = {"rss_mb": psutil.Process().memory_info().rss / _MB}
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        sample["allocated_mb"] = torch.cuda.memory_allocated(device) / _MB
        sample["reserved_mb"] = torch.cuda.memory_reserved(device) / _MB
        sample["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / _MB
    return sample


class MemoryLoggerCallback(TrainerCallback):  # type: ignore[misc]
    """Logs memory every ``--memory-log-steps`` optimizer steps.

    Every rank appends its sample to ``<run folder>/memory_rank{R}.jsonl``. On those steps only, the
    samples are gathered to rank 0, which writes TensorBoard scalars ``memory/<metric>/rank{R}`` and
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
        # The one collective of this callback, on logging steps only; every rank reaches it.
        gathered = dist.all_gather_object(sample)
        if self._writer is not None:
            for metric in sample:
                values = [s[metric] for s in gathered]
                for rank, value in enumerate(values):
                    self._writer.add_scalar(f"memory/{metric}/rank{rank}", value, step)
                self._writer.add_scalar(f"memory/{metric}/max", max(values), step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
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
