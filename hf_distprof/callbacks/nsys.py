"""``NsightCallback``: Nsight Systems around the profiler's window (``--nsys-window``), and ``--nvtx``'s checks.

``--nsys-window`` calls ``torch.cuda.profiler.start()`` / ``stop()`` (cudaProfilerStart/Stop) so that
``nsys profile --capture-range=cudaProfilerApi`` records exactly the steps a torch.profiler trace would hold:
the schedule's active steps (:func:`hf_distprof.callbacks.profiler.schedule.recorded_steps`), whether
``--enable-profiling`` is on or not, on the ranks of ``--profile-ranks``. Capture starts where
``ProfilerStep#N`` would start (the end of the step before, so the step's data loading is in) and stops at the
end of the window's last step: two CUDA calls per window, nothing on other steps.

The NVTX ranges of ``--nvtx`` are pushed by the step timer, which owns the phase hooks
(:class:`hf_distprof.timing.instrument.PhaseLabels`); this callback only says when they cannot be drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist
from hf_distprof.callbacks.profiler.schedule import recorded_steps
from hf_distprof.config import ProfilingArguments

logger = dist.get_logger(__name__)


class NsightCallback(TrainerCallback):  # type: ignore[misc]
    """Starts and stops the CUDA profiler around the profiler schedule's active steps (``--nsys-window``).

    Without CUDA it does nothing but say so once (rank 0), for ``--nsys-window`` and ``--nvtx`` alike. A
    start or stop that fails becomes one warning and the window is given up; training goes on.

    Args:
        args: The profiling flags (``--nsys-window``, ``--nvtx``, the schedule, ``--profile-ranks``).
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self._recorded: Callable[[int], bool] = lambda step: False
        self._capturing = False
        self._window = False  # whether this rank drives the capture window
        self._warned = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not torch.cuda.is_available():
            self._say_once(
                f"{self._flags()}: CUDA only (NVTX ranges and cudaProfilerStart/Stop are CUDA APIs), and this run "
                "has no CUDA device: nothing is done for them"
            )
            return
        if self.args.nvtx and not self.args.enable_step_timing:
            self._say_once(
                "--nvtx draws the phases the step timer marks, and --enable-step-timing is false: no NVTX ranges "
                "in this run"
            )
        ranks = self.args.profile_rank_set
        self._window = self.args.nsys_window and (ranks is None or dist.get_rank() in ranks)
        self._recorded = recorded_steps(self.args, state.global_step)
        self._follow(state.global_step)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._follow(state.global_step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._capturing:
            self._call(torch.cuda.profiler.stop)
        self._capturing = False

    def _follow(self, finished_step: int) -> None:
        """Capture the next step exactly when the schedule records it."""
        if not self._window:
            return
        wanted = self._recorded(finished_step + 1)
        if wanted != self._capturing:
            self._capturing = wanted
            self._call(torch.cuda.profiler.start if wanted else torch.cuda.profiler.stop)

    def _call(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - profiling never crashes training
            logger.warning(f"--nsys-window: {fn.__name__}() failed ({err!r}); no Nsight capture window in this run")
            self._window = self._capturing = False

    def _flags(self) -> str:
        return " and ".join(f for f, on in (("--nvtx", self.args.nvtx), ("--nsys-window", self.args.nsys_window)) if on)

    def _say_once(self, message: str) -> None:
        if not self._warned and dist.get_rank() == 0:
            logger.warning(message)
        self._warned = True
