"""Weights & Biases: into ``wandb.run``, the run the Trainer's WandbCallback (or the user) opened.

Rows are logged the way the WandbCallback logs them: without an explicit ``step`` (W&B's own step must only
grow, and it counts ``log`` calls, not training steps) and with ``train/global_step``, which the callback
declares the x-axis of every metric. An explicit ``step=global_step`` from us would either be dropped (below
W&B's counter) or push the counter ahead of the Trainer's next row, which W&B would then drop.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_distprof.trackers._base import (
    ARTIFACT_TYPE,
    FINDINGS_TABLE_KEY,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    STEP_KEY,
    Answer,
    NoRun,
    answer_numbers,
    answer_summary,
    artifact_name,
    attachable,
    log_live,
    table_rows,
)

if TYPE_CHECKING:
    import wandb

LIBRARY = "wandb"
LABEL = "W&B"

EVENT_COLUMNS: list[str | int] = ["step", "text"]

_event_tables: dict[tuple[str, str], Any] = {}  # (run id, tag) -> the INCREMENTAL wandb.Table of that tag
_event_lock = threading.Lock()


def _current_run() -> wandb.Run:
    import wandb

    run = wandb.run
    if run is None:
        raise NoRun("no W&B run open (wandb.run is None)")
    return run


def live(figures: dict[str, float], step: int) -> None:
    """The finite figures, in one history row with ``train/global_step = step``."""
    log_live(_current_run(), figures, step)


def text(tag: str, sentence: str, step: int) -> None:
    """A row ``(step, sentence)`` appended to the INCREMENTAL table ``tag`` (one table per tag and run).

    A table rather than a string in the history: W&B charts no strings, and a table reads as a list of events.
    Not ``run.alert``: that e-mails or pages people, which a profiler hint must not do. INCREMENTAL tables need
    W&B Server 0.70 or later to display; older self-hosted servers show only the last batch.
    """
    import wandb

    run = _current_run()
    with _event_lock:
        table = _event_tables.get((run.id, tag))
        if table is None:
            table = wandb.Table(columns=EVENT_COLUMNS, log_mode="INCREMENTAL")
            _event_tables[(run.id, tag)] = table
        table.add_data(step, sentence)
        run.log({tag: table, STEP_KEY: step})


def answer(result: Answer, traces: list[Path]) -> None:
    """The answer into ``wandb.run`` (see :func:`write`)."""
    write(_current_run(), result, traces)


def write(run: wandb.Run, result: Answer, traces: list[Path]) -> None:
    """The answer into ``run``.

    - one history row: the figures and the table ``hf_distprof/findings``, with ``train/global_step``;
    - ``run.summary``: every summary value under ``hf_distprof/<name>``, and ``hf_distprof/schema_version``;
    - an Artifact ``hf_distprof-<run id>`` of type ``hf_distprof-report``: ``answer.md`` and the artifact files,
      the traces under ``traces/`` when asked. Traces are added by reference to their file (policy
      "immutable"), not copied into W&B's staging folder: they can be gigabytes, and they no longer change.
    """
    import wandb

    row: dict[str, Any] = {**answer_numbers(result), STEP_KEY: result.step}
    columns, rows = table_rows(result)
    if columns:
        header: list[str | int] = list(columns)
        row[FINDINGS_TABLE_KEY] = wandb.Table(columns=header, data=rows, allow_mixed_types=True)
    run.log(row)

    summary = answer_summary(result)
    run.summary.update({**summary, SCHEMA_KEY: SCHEMA_VERSION})

    artifact = wandb.Artifact(
        artifact_name(run.id),
        type=ARTIFACT_TYPE,
        description="hf_distprof's answer for this run: report, analysis and timing files",
        metadata={SCHEMA_KEY: SCHEMA_VERSION, "step": result.step, **summary},
    )
    with artifact.new_file("answer.md", encoding="utf-8") as handle:
        handle.write(result.text)
    for path, name in attachable(result.artifacts):
        if path.is_dir():
            artifact.add_dir(str(path), name=name)
        else:
            artifact.add_file(str(path), name=name)
    for path, name in attachable(traces):
        if path.is_dir():
            artifact.add_dir(str(path), name=f"traces/{name}", policy="immutable")
        else:
            artifact.add_file(str(path), name=f"traces/{name}", policy="immutable")
    run.log_artifact(artifact)


def describe(run: wandb.Run) -> str:
    """Where ``run`` lives, in words: its URL online, its folder and the sync command offline."""
    where = f"offline in {run.sync_dir} (upload: wandb sync {run.sync_dir})" if run.offline else str(run.url)
    return f"W&B run {run.id} ({run.name}) in project {run.project}: {where}"


def after_the_fact(result: Answer, run_dir: Path, run_id: str | None, project: str | None) -> str:
    """The answer of a finished run: into the W&B run ``run_id`` (resumed), else into a new run named after
    ``run_dir``; the one place where a W&B run is started. ``reinit="create_new"`` leaves any run this process
    already has untouched (and unfinished)."""
    import wandb

    current = wandb.run
    if current is not None and run_id is not None and current.id == run_id:
        write(current, result, [])
        return describe(current)

    settings: dict[str, Any] = {
        "project": project or os.environ.get("WANDB_PROJECT") or "huggingface",  # the Trainer's default
        "reinit": "create_new",
    }
    if run_id is not None:
        settings.update(id=run_id, resume="allow")
    else:
        settings.update(name=run_dir.name, job_type="hf_distprof-analyze")
    run = wandb.init(**settings)
    try:
        if not run.resumed:  # a run of ours: the same x-axis as the Trainer's runs
            run.define_metric(STEP_KEY)
            run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        write(run, result, [])
        where = describe(run)
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return where
