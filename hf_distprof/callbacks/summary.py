"""``RunSummaryCallback``: at train end, rank 0 says where the run's files are and the commands that open them.

:func:`hf_distprof.callbacks.build_callbacks` adds it last whenever any other callback of ours is on, so a user's
own script ends with the same block as our demo: the run folder, its traces and summaries, the TensorBoard
folders, and how to look at them.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard
from hf_distprof.callbacks import order
from hf_distprof.config import ProfilingArguments
from hf_distprof.core.names import (
    ANALYSIS_NAME,
    MANIFEST_NAME,
    MEMORY_LOG_NAME,
    MEMORY_MODULES_NAME,
    MEMORY_STATS_NAME,
    MEMORY_SUMMARY_NAME,
    PARALLELISM_NAME,
    RANK_LOG_NAME,
    TIMING_LOG_NAME,
    TIMING_SUMMARY_NAME,
    TRACE_SUFFIX,
)

BANNER = "hf_distprof: training finished"
# Summaries a run folder may hold, named in the block when they are there.
_SUMMARIES = (TIMING_SUMMARY_NAME, MEMORY_SUMMARY_NAME, ANALYSIS_NAME, PARALLELISM_NAME, MANIFEST_NAME)
# How far below the parent that the tensorboard line opens each listed folder may lie (see tensorboard_command).
_NEAR = 2


def _by_rank_and_step(trace: Path) -> tuple[int, int, str]:
    """A trace's order in the block: by rank, then by its first step (``rank1_host_step8-10``: not as text, where
    ``step16`` comes before ``step7``), then by name."""
    found = _TRACE_ORDER.match(trace.name)
    return (int(found.group(1)), int(found.group(2)), trace.name) if found else (-1, -1, trace.name)


_TRACE_ORDER = re.compile(r"^rank(\d+)_.*_step(\d+)-\d+")


def _per_rank(run_dir: Path) -> list[str]:
    """The per-rank outputs the folder holds (:data:`_PER_RANK`, the log first, always there on a rank that wrote
    anything), each as ``rank<R>`` names it: a file that is there and not empty for some rank. Crash, exception and hang
    files are the crash report's and ``hang-report``'s to name (a clean rank's crash file lies there, empty, until its
    process exits)."""
    found = []
    for name in _PER_RANK:
        pattern = re.compile("^" + re.escape(name).replace(re.escape("{rank}"), r"\d+") + "$")
        try:
            if any(pattern.match(p.name) and p.stat().st_size > 0 for p in run_dir.iterdir()):
                found.append(name.replace("{rank}", "<R>"))
        except OSError:
            continue
    return ["rank<R>.log", *(n for n in found if n != "rank<R>.log")]


_PER_RANK = (RANK_LOG_NAME, TIMING_LOG_NAME, MEMORY_LOG_NAME, MEMORY_STATS_NAME, MEMORY_MODULES_NAME + ".txt",
             MEMORY_MODULES_NAME + ".json")


def trainer_tensorboard_dir(args: TrainingArguments) -> Path | None:
    """The folder under which the Trainer's TensorBoard callback writes (loss, learning rate), if it reports there."""
    report_to = args.report_to if isinstance(args.report_to, list | tuple) else [args.report_to]
    if not any(r in ("tensorboard", "all") for r in report_to):
        return None
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    # transformers 5: $TENSORBOARD_LOGGING_DIR, else <output_dir>/runs/<date>_<host>.
    return Path(env).expanduser() if env else Path(args.output_dir or ".") / "runs"


def distinct_folders(folders: list[Path]) -> list[Path]:
    """``folders`` made absolute, each folder once (the same folder given absolute and relative, or through a symbolic
    link, is one), in their first order."""
    seen: set[Path] = set()
    kept: list[Path] = []
    for folder in folders:
        key = folder.expanduser().resolve()
        if key not in seen:
            seen.add(key)
            kept.append(Path(os.path.abspath(folder.expanduser())))  # without "..", as the user would write it
    return kept


def tensorboard_command(folders: list[Path]) -> str:
    """A ``tensorboard`` command line that opens every one of ``folders`` (absolute, distinct, at least one).

    TensorBoard reads a ``--logdir`` recursively, so a parent opens them all, and shows the runs beside them (the
    Trainer's earlier runs in ``<output_dir>/runs``): one folder's parent, several folders' deepest common parent,
    when every folder lies at most :data:`_NEAR` levels below it. A parent further up (the file system's root, a home
    folder) would scan everything under it: then ``--logdir_spec name:path,...`` names exactly these folders.
    """
    parent = folders[0].parent if len(folders) == 1 else Path(os.path.commonpath([str(f) for f in folders]))
    if parent != Path(parent.anchor) and all(len(f.relative_to(parent).parts) <= _NEAR for f in folders):
        return f"tensorboard --logdir {parent}"
    if len(folders) == 1:
        return f"tensorboard --logdir {folders[0]}"
    if any("," in str(f) for f in folders):  # commas separate the specs: the common parent opens them, slowly
        return f"tensorboard --logdir {parent}"
    names: list[str] = []
    for folder in folders:
        # A name holds no ":" or "," (they delimit the specs), and each is its own.
        base = folder.name.replace(":", "_").replace(",", "_") or "run"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return "tensorboard --logdir_spec " + ",".join(f"{n}:{f}" for n, f in zip(names, folders))


def _older_than_traces(report: Path, run_dir: Path) -> bool:
    """Whether ``report`` was written before the newest trace of ``run_dir`` (an earlier run's, in a reused folder)."""
    try:
        made = report.stat().st_mtime
        return any(t.stat().st_mtime > made for t in run_dir.glob(f"*{TRACE_SUFFIX}"))
    except OSError:
        return True


def where_to_look(run_dirs: list[Path], tensorboard_dirs: list[Path], profiling: bool, since: float = 0.0) -> str:
    """The end-of-run block: what each run folder holds and the exact commands that open it.

    Args:
        run_dirs: This run's profiler folders.
        tensorboard_dirs: Folders holding TensorBoard events of this run (ours and the Trainer's); each is listed
            once, however it is written (:func:`distinct_folders`), and the ``tensorboard`` line opens them all.
        profiling: Whether traces were asked for (``--enable-profiling``).
        since: When this training started (``time.time()``): hang dumps older than it are another attempt's.
    """
    lines = ["", "=" * 78, BANNER]
    for run_dir in run_dirs:
        traces = sorted(run_dir.glob(f"*{TRACE_SUFFIX}"), key=_by_rank_and_step)
        lines.append(f"  run folder: {run_dir}  ({len(traces)} trace(s))")
        lines += [f"    {t.name}" for t in traces]
        summaries = [name for name in _SUMMARIES if (run_dir / name).exists()]
        if summaries:
            lines.append(f"    summaries: {', '.join(summaries)}; per-rank files: {', '.join(_per_rank(run_dir))}")
        hung = _hang_dumps(run_dir, since)
        if hung:
            lines.append(f"    hang dumps: {', '.join(p.name for p in hung)} (a step stalled past --hang-timeout; "
                         "training went on)")
    tensorboard_dirs = distinct_folders(tensorboard_dirs)
    for folder in tensorboard_dirs:
        lines.append(f"  TensorBoard events: {folder}")
    lines += ["", "View them:"]
    if tensorboard_dirs:
        lines.append(f"  {tensorboard_command(tensorboard_dirs)}          # scalars")
    if run_dirs:
        first = run_dirs[0]
        traced = any(first.glob(f"*{TRACE_SUFFIX}"))
        if profiling and traced:
            lines.append(f"  Perfetto: in a browser, https://ui.perfetto.dev, drag in a trace from {first}")
            lines.append(f"  pip install torch-tb-profiler && tensorboard --logdir {first.parent}")
        if not traced:
            # analyze reads traces: without one it would stop with an error (its reason is in the folder's manifest)
            why = "" if profiling else " (--enable-profiling takes them)"
            table = "; the step timer's table is above" if (first / TIMING_SUMMARY_NAME).exists() else ""
            lines.append(f"  no trace in {first}: nothing for hf-distprof analyze{why}{table}")
        else:
            lines.append(f"  hf-distprof analyze {first}               # where the step time goes")
            written = first / "report" / "report.html"  # written for the trackers (report_to) at train end
            if written.is_file() and not _older_than_traces(written, first):
                lines.append(f"  report: {written}   # open it in a browser: the report, with plots (already written)")
            else:
                lines.append(f"  hf-distprof analyze {first} --report {first / 'report'}   # Markdown/HTML with plots")
        if _hang_dumps(first, since):
            lines.append(f"  hf-distprof hang-report {first}               # where the stalled step was stuck")
    lines.append("=" * 78)
    return "\n".join(lines)


def _hang_dumps(run_dir: Path, since: float = 0.0) -> list[Path]:
    """The watchdog's dumps in ``run_dir`` written since ``since`` (a backstop never written, empty, is none; an
    earlier attempt's, in a folder a restarted job reuses, is not this run's)."""
    try:
        return sorted(p for p in run_dir.glob("hang_rank*.txt")
                      if p.stat().st_size > 0 and p.stat().st_mtime >= since)
    except OSError:
        return []


class RunSummaryCallback(TrainerCallback):
    """Prints :func:`where_to_look` on rank 0 at train end (stdout, after the other callbacks wrote their files).

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.printed: str | None = None
        self._began = 0.0  # this training's start (time.time()): older hang dumps are another attempt's

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        order.put_ours_first(self)  # before the trackers' callbacks, so our figures reach them (see order)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        order.put_ours_first(self)  # callbacks added after the Trainer was built (hf-distprof run adds ours so)
        dist.training_ended(False)
        self._began = time.time()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        dist.training_ended()  # every rank: its process group may go at exit (dist.destroy_group_at_exit)
        if not state.is_world_process_zero or dist.get_rank() != 0:  # (ranks that train alone each are process 0)
            return
        run_dirs = paths.run_dirs_of(state)
        # This train() call's folders only (a notebook's earlier call left its writers open: listed again, they read
        # as this run's).
        ours = {tensorboard.tensorboard_dir(args.output_dir, d).absolute() for d in run_dirs or [None]}
        folders = distinct_folders([f for f in tensorboard.open_folders() if f in ours])
        trainer_tb = trainer_tensorboard_dir(args)
        # The Trainer's folder, unless it is one of ours or holds ours (then the block names the one inside); ours
        # are absolute, the Trainer's may be relative ($TENSORBOARD_LOGGING_DIR, output_dir): compared resolved.
        if trainer_tb is not None:
            key = trainer_tb.expanduser().resolve()
            if not any(f.resolve() == key or key in f.resolve().parents for f in folders):
                folders.append(trainer_tb)
        self.printed = where_to_look(run_dirs, folders, self.args.enable_profiling, self._began)
        print(self.printed, flush=True)
