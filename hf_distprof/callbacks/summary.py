"""``RunSummaryCallback``: at train end, rank 0 says where the run's files are and the commands that open them.

:func:`hf_distprof.callbacks.build_callbacks` adds it last whenever any other callback of ours is on, so a user's
own script ends with the same block as our demo: the run folder, its traces and summaries, the TensorBoard
folders, and how to look at them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import paths, tensorboard
from hf_distprof.config import ProfilingArguments
from hf_distprof.core.names import (
    ANALYSIS_NAME,
    MANIFEST_NAME,
    MEMORY_SUMMARY_NAME,
    PARALLELISM_NAME,
    TIMING_SUMMARY_NAME,
    TRACE_SUFFIX,
)

BANNER = "hf_distprof: training finished"
# Summaries a run folder may hold, named in the block when they are there.
_SUMMARIES = (TIMING_SUMMARY_NAME, MEMORY_SUMMARY_NAME, ANALYSIS_NAME, PARALLELISM_NAME, MANIFEST_NAME)


def trainer_tensorboard_dir(args: TrainingArguments) -> Path | None:
    """The folder under which the Trainer's TensorBoard callback writes (loss, learning rate), if it reports there."""
    report_to = args.report_to if isinstance(args.report_to, list | tuple) else [args.report_to]
    if not any(r in ("tensorboard", "all") for r in report_to):
        return None
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    # transformers 5: $TENSORBOARD_LOGGING_DIR, else <output_dir>/runs/<date>_<host>.
    return Path(env).expanduser() if env else Path(args.output_dir or ".") / "runs"


def where_to_look(run_dirs: list[Path], tensorboard_dirs: list[Path], profiling: bool) -> str:
    """The end-of-run block: what each run folder holds and the exact commands that open it.

    Args:
        run_dirs: This run's profiler folders.
        tensorboard_dirs: Folders holding TensorBoard events of this run (ours and the Trainer's).
        profiling: Whether traces were asked for (``--enable-profiling``).
    """
    lines = ["", "=" * 78, BANNER]
    for run_dir in run_dirs:
        traces = sorted(run_dir.glob(f"*{TRACE_SUFFIX}"))
        lines.append(f"  run folder: {run_dir}  ({len(traces)} trace(s))")
        lines += [f"    {t.name}" for t in traces]
        summaries = [name for name in _SUMMARIES if (run_dir / name).exists()]
        if summaries:
            lines.append(f"    summaries: {', '.join(summaries)}; per-rank log: rank<R>.log")
    for folder in tensorboard_dirs:
        lines.append(f"  TensorBoard events: {folder}")
    lines += ["", "View them:"]
    if tensorboard_dirs:
        # One parent shows every run (the Trainer's loss and our scalars) side by side.
        common = Path(os.path.commonpath([str(f.absolute()) for f in tensorboard_dirs]))
        logdir = common if len(tensorboard_dirs) > 1 else tensorboard_dirs[0].absolute().parent
        lines.append(f"  tensorboard --logdir {logdir}          # scalars")
    if run_dirs:
        first = run_dirs[0]
        if profiling:
            lines.append(f"  open https://ui.perfetto.dev and drag in a trace from {first}")
            lines.append(f"  pip install torch-tb-profiler && tensorboard --logdir {first.parent}")
        lines.append(f"  hf-distprof analyze {first}               # where the step time goes")
        lines.append(f"  hf-distprof analyze {first} --report {first / 'report'}   # Markdown/HTML with plots")
    lines.append("=" * 78)
    return "\n".join(lines)


class RunSummaryCallback(TrainerCallback):
    """Prints :func:`where_to_look` on rank 0 at train end (stdout, after the other callbacks wrote their files).

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.printed: str | None = None

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        run_dirs = paths.run_dirs_of(state)
        folders = [*tensorboard.open_folders()]
        trainer_tb = trainer_tensorboard_dir(args)
        if trainer_tb is not None and not any(f == trainer_tb or trainer_tb in f.parents for f in folders):
            folders.append(trainer_tb)
        self.printed = where_to_look(run_dirs, folders, self.args.enable_profiling)
        print(self.printed, flush=True)
