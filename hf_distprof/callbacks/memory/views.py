"""``MemoryViewsCallback``: the memory deep-dive over the memory window (``--memory-snapshot``,
``--memory-tracker``, ``--track-activation-memory``).

The memory window is the profiler's active steps (``--profiler-wait-steps``/``--profiler-warmup-steps``/
``--profiler-active-steps``/``--profiler-repeat`` and ``--profiler-skip-first``), whether the profiler runs
or not, so that a trace and the memory views of one run cover the same steps.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import IO, Any

import torch
import yaml
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths
from hf_distprof.callbacks.memory import tools as memory_tools
from hf_distprof.callbacks.memory import stats as memstats
from hf_distprof.callbacks.profiler.schedule import recorded_steps
from hf_distprof.config import ProfilingArguments
from hf_distprof.timing.instrument import eager
from hf_distprof.callbacks.memory.stats import MB

logger = dist.get_logger(__name__)


class MemoryViewsCallback(TrainerCallback):  # type: ignore[misc]
    """Several complementary memory views of the steps in the memory window, written per rank.

    - ``rank{R}_memory_stats.yaml`` (every view flag): per step of the window, ``start`` and ``end``: host
      RSS/VMS and, on GPU, the allocator's full ``memory_stats()`` with ``fragmentation_bytes``; per forward
      (each micro-batch): RSS/VMS before and after it, and with ``--track-activation-memory`` the bytes it
      saved for backward (:class:`~hf_distprof.callbacks.memory.tools.ActivationCounter`). Appended step by step, so a
      run that dies keeps what it had.
    - ``--memory-tracker``: torch's ``MemTracker`` (FSDP2: ``FSDPMemTracker``) over one step, the first after
      the first memory window (it slows that step several times, so it stays out of the traced steps), as
      ``rank{R}_memory_modules.txt`` (a table down to ``--memory-tracker-depth``) and ``.json``.
    - ``--memory-snapshot`` (GPU): the allocator's history over each window, dumped as
      ``rank{R}_{host}_step{first}-{last}_memory_snapshot.pickle``, and one dump when a CUDA allocation
      fails (``..._oom_step{N}_...``), after which the out-of-memory error goes on as usual.

    Nothing here synchronises the device or talks to other ranks. A view that fails warns once and the
    others go on; training is never stopped by it.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.written: list[Path] = []
        self._collected = recorded_steps(args)
        self._rank = 0
        self._host = ""
        self._device = torch.device("cpu")
        self._stats: IO[str] | None = None
        self._stats_path: Path | None = None
        self._step = 0  # the optimizer step being taken
        self._record: dict[str, Any] | None = None  # the current collected step's figures
        self._hooks: list[Any] = []
        self._counter = memory_tools.ActivationCounter() if args.track_activation_memory else None
        self._forward: dict[str, float] = {}
        self._window_first: int | None = None
        self._windows_ended = 0
        self._history: memory_tools.AllocatorHistory | None = None
        self._oom_dumped: set[int] = set()
        self._closed = False
        self._tracker: Any = None
        self._tracker_step: int | None = None
        self._tracker_modules: dict[str, torch.nn.Module] = {}
        self._tracker_own: dict[int, dict[str, int]] = {}
        self._failed: set[str] = set()

    # ---- Trainer hooks -------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)
        self._collected = recorded_steps(self.args, state.global_step)
        self._rank, self._host = dist.get_rank(), dist.get_hostname()
        self._device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else self._device
        if self.run_dir is None:
            return  # nowhere to write (already warned)
        self._open_stats(state)
        if self.args.memory_snapshot:
            if self._device.type != "cuda":
                if self._rank == 0:
                    logger.warning(
                        "--memory-snapshot records the CUDA allocator's history and needs a GPU: skipped on this "
                        "CPU run (the other memory views go on)"
                    )
            else:
                self._history = memory_tools.AllocatorHistory(self.args.memory_snapshot_max_entries)
                self._guard("oom", lambda: memory_tools.attach_oom_observer(self._on_oom))

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._step = state.global_step + 1
        model = kwargs.get("model")
        if self.args.memory_tracker and self._tracker_step is None and self._windows_ended > 0:
            self._tracker_step = self._step
            self._guard("tracker", lambda: self._start_tracker(model, kwargs.get("optimizer")))
        if self.run_dir is None or not self._collected(self._step):
            return
        if self._window_first is None:
            self._window_first = self._step
            if self._history is not None:
                self._guard("snapshot", self._history.start)
        self._record = {"start": self._sample(), "forward": []}
        if model is not None:
            self._guard("hooks", lambda: self._install_forward_hooks(model))

    def tracking(self) -> bool:
        """Whether ``--memory-tracker`` runs in this step (started at its ``on_step_begin``, which runs before the step
        timer's): a step it slows several times, which the step timer marks and leaves out of its verdicts."""
        return self._tracker is not None

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._tracker is not None:
            # Gradients exist now (before zero_grad): each module's own share of the model state.
            optimizer = kwargs.get("optimizer")
            self._tracker_own = {
                id(m): memory_tools.own_state_bytes(m, optimizer) for m in self._tracker_modules.values()
            }

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step
        if self._tracker is not None and step == self._tracker_step:
            self._guard("tracker", self._finish_tracker)
        if self._record is None:
            return
        self._remove_forward_hooks()
        record, self._record = self._record, None
        record["end"] = self._sample()
        self._append_stats(step, record)
        window_over = not self._collected(step + 1) or step >= state.max_steps
        if window_over and self._window_first is not None:
            self._end_window(self._window_first, step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.close(state.global_step)
        if self.args.memory_tracker and self._tracker_step is None and self._rank == 0:
            logger.warning(
                "--memory-tracker measures the first step after the first memory window; training ended at "
                f"step {state.global_step}, before it: give it more steps or a shorter schedule"
            )
        if self.written:
            logger.info("memory views wrote: " + ", ".join(str(p) for p in self.written))

    def close(self, last_step: int) -> None:
        """Stop every view, ending a window cut short (and its snapshot). Safe to call twice."""
        self._remove_forward_hooks()
        if self._tracker is not None:
            self._guard("tracker", self._finish_tracker)
        if self._record is not None:
            record, self._record = self._record, None
            record["end"] = self._sample()
            self._append_stats(self._step, record)
        if self._window_first is not None:
            self._end_window(self._window_first, max(last_step, self._window_first))
        self._closed = True  # the observer cannot be detached: from now on it does nothing
        stats, self._stats = self._stats, None
        if stats is not None:
            try:
                stats.close()
            except OSError as err:
                logger.warning(f"closing {self._stats_path} failed: {err!r}")

    # ---- samples and the YAML file ---------------------------------------------------------------

    def _sample(self) -> dict[str, Any]:
        sample: dict[str, Any] = dict(memstats.host_memory())
        if self._device.type == "cuda":
            try:
                sample["cuda"] = memstats.cuda_memory_stats(self._device)
            except Exception as err:  # noqa: BLE001
                self._warn_once("cuda stats", f"could not read the CUDA allocator's statistics: {err!r}")
        return sample

    def _open_stats(self, state: TrainerState) -> None:
        assert self.run_dir is not None
        self._stats_path = self.run_dir / paths.MEMORY_STATS_NAME.format(rank=self._rank)
        header = {
            "rank": self._rank,
            "host": self._host,
            "device": str(self._device),
            "units": "MiB for *_mb, bytes for activation_bytes and the CUDA allocator's statistics",
            "views": {
                "track_activation_memory": self.args.track_activation_memory,
                "memory_tracker": self.args.memory_tracker,
                "memory_snapshot": self.args.memory_snapshot and self._device.type == "cuda",
            },
        }
        try:
            self._stats = open(self._stats_path, "w", encoding="utf-8")  # noqa: SIM115 - kept open for the run
            self._stats.write(yaml.safe_dump(header, sort_keys=False) + "steps:\n")
            self._stats.flush()
            self.written.append(self._stats_path)
        except OSError as err:
            self._stats = None
            logger.warning(f"cannot write {self._stats_path}: {err!r}; memory statistics are not kept")

    def _append_stats(self, step: int, record: dict[str, Any]) -> None:
        """Add ``step``'s entry under ``steps:`` (appending keeps one valid YAML mapping)."""
        if self._stats is None:
            return
        try:
            self._stats.write(textwrap.indent(yaml.safe_dump({step: _plain(record)}, sort_keys=False), "  "))
            self._stats.flush()
        except OSError as err:
            logger.warning(f"cannot write {self._stats_path}: {err!r}; memory statistics stop here")
            self._stats = None

    # ---- host memory and activations around each forward -----------------------------------------

    def _install_forward_hooks(self, model: torch.nn.Module) -> None:
        self._hooks = [  # (run eagerly under torch.compile: see hf_distprof.timing.instrument.eager)
            model.register_forward_pre_hook(eager(self._before_forward)),
            model.register_forward_hook(eager(self._after_forward)),
        ]

    def _remove_forward_hooks(self) -> None:
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.remove()
        if self._counter is not None:
            self._counter.exit()

    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        host = memstats.host_memory()
        self._forward = {"rss_before_mb": host["rss_mb"], "vms_before_mb": host["vms_mb"]}
        if self._counter is not None:
            self._counter.enter()

    def _after_forward(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        entry = dict(self._forward)
        if self._counter is not None:
            self._counter.exit()
            entry["activation_bytes"] = self._counter.bytes
            entry["saved_tensors"] = self._counter.tensors
        host = memstats.host_memory()
        entry.update(rss_after_mb=host["rss_mb"], vms_after_mb=host["vms_mb"])
        if self._record is not None:
            self._record["forward"].append(entry)

    # ---- the allocator's history (GPU) -------------------------------------------------------------

    def _end_window(self, first: int, last: int) -> None:
        self._window_first = None
        self._windows_ended += 1
        history = self._history
        if history is None or not history.recording or self.run_dir is None:
            return
        target = self.run_dir / paths.MEMORY_SNAPSHOT_NAME.format(rank=self._rank, host=self._host, first=first,
                                                                  last=last)
        self._dump(target)
        self._guard("snapshot", history.stop)

    def _dump(self, target: Path) -> None:
        try:
            with paths.atomic_path(target, suffix=".pickle") as tmp:
                seconds = memory_tools.AllocatorHistory.dump(tmp)
        except Exception as err:  # noqa: BLE001 - a failed dump is one warning
            logger.warning(f"could not write the memory snapshot {target}: {err!r}; training goes on")
            return
        self.written.append(target)
        logger.info(f"memory snapshot {target} written in {seconds:.2f} s (open it at https://pytorch.org/memory_viz)")

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """The out-of-memory observer: one snapshot per step, then the error goes on as usual."""
        if self.run_dir is None or self._closed or self._step in self._oom_dumped:
            return
        self._oom_dumped.add(self._step)
        # The allocator records its history only inside a --memory-snapshot window (stopping it clears it): outside
        # one the snapshot holds the segments and blocks in use, not which code allocated them.
        history = self._history is not None and self._history.recording
        what = "with the allocation history of this window" if history else (
            "the memory in use, without allocation history (recorded only inside --memory-snapshot windows)")
        logger.warning(
            f"CUDA out of memory at step {self._step} (asked {alloc / MB:.0f} MiB, {device_free / MB:.0f} MiB "
            f"free): dumping a memory snapshot, {what}"
        )
        target = self.run_dir / paths.OOM_SNAPSHOT_NAME.format(rank=self._rank, host=self._host, step=self._step)
        self._dump(target)

    # ---- the per-module tracker -------------------------------------------------------------------

    def _start_tracker(self, model: torch.nn.Module | None, optimizer: Any) -> None:
        if model is None:
            raise RuntimeError("the Trainer passed no model to the callback")
        reason = memory_tools.tracker_unsupported(model)
        if reason is not None:
            self._warn_once("tracker", f"--memory-tracker skipped: {reason}; use FSDP2 (fully_shard) or DDP")
            return
        self._tracker_modules = memory_tools.modules_to_depth(model, self.args.memory_tracker_depth)
        tracker = memory_tools.make_tracker(model, optimizer)
        memory_tools.enter_tracker(tracker)
        self._tracker = tracker

    def _finish_tracker(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        tracker.__exit__(None, None, None)
        peak = memory_tools._category_bytes(tracker.get_tracker_snapshot("peak"))
        rows = memory_tools.module_rows(tracker, self._tracker_modules, self._tracker_own)
        if self.run_dir is None:
            return
        base = self.run_dir / paths.MEMORY_MODULES_NAME.format(rank=self._rank)
        kind = "FSDPMemTracker" if memory_tools.is_fsdp2(next(iter(self._tracker_modules.values()))) else "MemTracker"
        title = f"hf_distprof memory per module: rank {self._rank}, step {self._tracker_step} ({kind})"
        text = memory_tools.format_module_table(rows, peak, title)
        payload = {"rank": self._rank, "step": self._tracker_step, "tracker": kind, "units": "bytes",
                   "peak": peak, "modules": rows}
        paths.atomic_write_text(base.with_suffix(".txt"), text)
        paths.atomic_write_text(base.with_suffix(".json"), json.dumps(payload, indent=2) + "\n")
        self.written += [base.with_suffix(".txt"), base.with_suffix(".json")]

    # ---- failures ---------------------------------------------------------------------------------

    def _guard(self, view: str, action: Any) -> None:
        """Run ``action``; a failure warns once per view and turns nothing else off."""
        try:
            action()
        except Exception as err:  # noqa: BLE001 - a memory view must never stop training
            self._warn_once(view, f"memory view '{view}' failed: {err!r}; training and the other views go on")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._failed:
            self._failed.add(key)
            logger.warning(message)


def _plain(value: Any) -> Any:
    """Numbers and strings YAML's safe dumper accepts (floats rounded to 3 decimals)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    return str(value)
