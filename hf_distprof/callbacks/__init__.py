"""One TrainerCallback per module; :func:`build_callbacks` constructs only the enabled ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_distprof.config import ProfilingArguments

if TYPE_CHECKING:
    from transformers import TrainerCallback


def build_callbacks(args: ProfilingArguments) -> list[TrainerCallback]:
    """Construct the callbacks the flags switch on; ``[]`` when everything is off.

    A disabled callback is never constructed (nor its module imported), so it costs nothing.

    Args:
        args: The parsed flags.

    Returns:
        The callbacks to pass to ``Trainer(callbacks=...)``.
    """
    callbacks: list[TrainerCallback] = []
    profiler = None
    if args.enable_profiling:
        from hf_distprof.callbacks.profiler.callback import ProfilerCallback

        profiler = ProfilerCallback(args)
        callbacks.append(profiler)
    if args.enable_memory_logging:
        from hf_distprof.callbacks.memory.logger import MemoryLoggerCallback

        callbacks.append(MemoryLoggerCallback(args))
    views = None
    if args.memory_views_enabled:
        from hf_distprof.callbacks.memory.views import MemoryViewsCallback

        views = MemoryViewsCallback(args)
        callbacks.append(views)
    if args.enable_step_timing:
        from hf_distprof.callbacks.step_timer import StepTimerCallback

        step_timer = StepTimerCallback(args)
        callbacks.append(step_timer)
        if profiler is not None:
            profiler.step_timer = step_timer  # --profile-ranks auto chooses ranks by their step times
        if views is not None:
            step_timer.memory_busy = views.tracking  # --memory-tracker's step, slowed several times: not judged
    if args.hang_timeout > 0:
        from hf_distprof.callbacks.hang import HangWatchdogCallback

        callbacks.append(HangWatchdogCallback(args))
    if args.nvtx or args.nsys_window:
        from hf_distprof.callbacks.nsys import NsightCallback

        callbacks.append(NsightCallback(args))
    if args.profiler_analyze or args.enable_profiling:
        # For --profiler-analyze, and for the trackers report_to names (it decides at train end). Last, so that at
        # train end it runs after every other callback has written its files.
        from hf_distprof.callbacks.analyze import TraceAnalysisCallback

        callbacks.append(TraceAnalysisCallback(args))
    if callbacks:
        # A process group the script leaves is destroyed at exit after a clean end, before the C++ teardown can abort
        # on gloo's threads; registered now, before any exit handler of ours, so that it runs after them.
        from hf_distprof import dist

        dist.destroy_group_at_exit()
        # Last of all: rank 0 says where the files are once every other callback has written them.
        from hf_distprof.callbacks.summary import RunSummaryCallback

        callbacks.append(RunSummaryCallback(args))
        # From here on our records are kept for rank{R}.log, which opens only at train start (hf_distprof.logs).
        from hf_distprof import logs

        logs.route_package_logs()
    return callbacks
