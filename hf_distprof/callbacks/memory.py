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
from hf_distprof.parallelism import report_parallelism
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


MODEL_STATE_METRICS = ("params_mb", "grads_mb", "optimizer_state_mb", "model_state_mb")


def _local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds of ``tensor``: the local shard of a DTensor (FSDP2), else the whole tensor."""
    to_local = getattr(tensor, "to_local", None)
    local = to_local() if callable(to_local) else tensor
    return local.numel() * local.element_size()


def model_state_memory(model: torch.nn.Module, optimizer: Any) -> dict[str, float]:
    """This rank's share of the model state in MiB, from tensor sizes (no device access, no sync).

    Under DDP every rank holds all of it; under FSDP each rank holds its shard, which is where sharding
    saves memory. Gradients are counted while they exist (after the backward, before ``zero_grad``);
    DDP's gradient buckets and FSDP's gathered (unsharded) parameters are transient and not counted.

    Args:
        model: The model the Trainer trains.
        optimizer: Its optimizer (or accelerate's wrapper of it), or None.

    Returns:
        ``params_mb``, ``grads_mb``, ``optimizer_state_mb`` and their sum ``model_state_mb``.
    """
    params = list(model.parameters())
    param_bytes = sum(_local_bytes(p) for p in params)
    grad_bytes = sum(_local_bytes(p.grad) for p in params if p.grad is not None)
    optim_bytes = 0
    state = getattr(optimizer, "state", None) or {}
    for entry in state.values():
        for value in entry.values() if isinstance(entry, dict) else ():
            if isinstance(value, torch.Tensor):
                optim_bytes += _local_bytes(value)
    out = {"params_mb": param_bytes / _MB, "grads_mb": grad_bytes / _MB, "optimizer_state_mb": optim_bytes / _MB}
    out["model_state_mb"] = sum(out.values())
    return out


class MemoryLoggerCallback(TrainerCallback):  # type: ignore[misc]
    """Logs memory every ``--memory-log-steps`` optimizer steps.

    Every rank appends its sample to ``<run folder>/memory_rank{R}.jsonl``: the process and device memory
    (:func:`read_memory`), and the rank's share of parameters, gradients and optimizer state
    (:func:`model_state_memory`, taken right after the optimizer step, when gradients still exist), which
    makes FSDP's saving over DDP visible. On those steps only, the samples are gathered to rank 0 (without
    waiting: published at the next logging step or train end), which writes TensorBoard scalars
    ``memory/<metric>/rank{R}`` and ``memory/<metric>/max``.

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
        # The model-state sample of the step being taken, from on_optimizer_step.
        self._model_state: dict[str, float] = {}
        self._size_failed = False  # warned once already

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # global_step is incremented after this hook: the step being taken is global_step + 1.
        model = kwargs.get("model")
        if (state.global_step + 1) % self.args.memory_log_steps != 0 or model is None:
            return
        try:
            self._model_state = model_state_memory(model, kwargs.get("optimizer"))
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
        sample = {**read_memory(), **self._model_state}
        self._model_state = {}
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
        # ranks or none; the Trainer passes the model to every rank's hooks), so a flat float gather is enough.
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
