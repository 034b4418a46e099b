"""Trackio: into the current run (``trackio.context_vars.current_run``), the one the Trainer's TrackioCallback
(or the user) opened with ``trackio.init``.

Rows are logged as the TrackioCallback logs them: without an explicit ``step`` (Trackio then counts ``log``
calls) and with ``train/global_step``; choose that as the dashboard's X-axis to line everything up with the
global step. An explicit ``step=global_step`` from us would move Trackio's counter, and with it the x position
of every later row the Trainer logs.

What Trackio cannot hold: a run summary (the answer is a last history row instead), tags, and config values
added after the run's first row (the config is stored once). String values (the verdict) are kept in that row,
where the API and exports see them, but the dashboard charts numbers only: the verdict is read in the Markdown.
The current run is a context variable, so it is invisible from another thread.
"""

from __future__ import annotations

import contextvars
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_distprof.trackers._base import (
    ANSWER_TAG,
    ARTIFACT_TYPE,
    FINDINGS_TABLE_KEY,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    STEP_KEY,
    Answer,
    NoRun,
    answer_numbers,
    answer_strings,
    answer_summary,
    artifact_name,
    attachable,
    log_live,
    table_rows,
)

if TYPE_CHECKING:
    from trackio import Run

LIBRARY = "trackio"
LABEL = "Trackio"


def _current_run() -> Run:
    from trackio import context_vars

    run = context_vars.current_run.get()
    if run is None:
        raise NoRun("no Trackio run open in this context (trackio.init was not called, or finish was)")
    return run


def live(figures: dict[str, float], step: int) -> None:
    """The finite figures, in one row with ``train/global_step = step``."""
    log_live(_current_run(), figures, step)


def text(tag: str, sentence: str, step: int) -> None:
    """A ``trackio.Markdown`` under ``tag`` (shown on the dashboard's Reports page), in a row with
    ``train/global_step``. Not ``trackio.alert``: that prints to the terminal (where our log already said it)
    and posts to the user's alert webhook, which a profiler hint must not do."""
    import trackio

    run = _current_run()
    run.log({tag: trackio.Markdown(f"**Step {step}:** {sentence}"), STEP_KEY: step})


def answer(result: Answer, traces: list[Path]) -> None:
    """The answer into the current run (see :func:`write`)."""
    write(_current_run(), result, traces)


def write(run: Run, result: Answer, traces: list[Path]) -> None:
    """The answer into ``run``.

    - one row with ``train/global_step = result.step``: the figures, the string summary values,
      ``hf_distprof/answer`` (a ``trackio.Markdown``), and ``hf_distprof/findings`` (a ``trackio.Table``);
    - an artifact ``hf_distprof-<run name>`` of type ``hf_distprof-report`` (Trackio 0.30+): ``answer.md``, the
      artifact files, and the traces under ``traces/`` when asked. Trackio copies the files into its
      content-addressed store when logging, so the temporary ``answer.md`` may go right after.
    """
    import trackio

    row: dict[str, Any] = {**answer_numbers(result), **answer_strings(result)}
    row[ANSWER_TAG] = trackio.Markdown(result.text)
    columns, rows = table_rows(result)
    if columns:
        row[FINDINGS_TABLE_KEY] = trackio.Table(columns=columns, data=rows)
    row[STEP_KEY] = result.step
    run.log(row)

    artifact = trackio.Artifact(
        artifact_name(run.name),
        type=ARTIFACT_TYPE,
        description="hf_distprof's answer for this run: report, analysis and timing files",
        metadata={SCHEMA_KEY: SCHEMA_VERSION, "step": result.step, **answer_summary(result)},
    )
    with tempfile.TemporaryDirectory(prefix="hf_distprof-trackio-") as scratch:
        markdown = Path(scratch) / "answer.md"
        markdown.write_text(result.text, encoding="utf-8")
        artifact.add_file(markdown, name="answer.md")
        for path, name in attachable(result.artifacts):
            if path.is_dir():
                artifact.add_dir(path, name=name)
            else:
                artifact.add_file(path, name=name)
        for path, name in attachable(traces):
            if path.is_dir():
                artifact.add_dir(path, name=f"traces/{name}")
            else:
                artifact.add_file(path, name=f"traces/{name}")
        run.log_artifact(artifact)


def after_the_fact(result: Answer, run_dir: Path, run_id: str | None, project: str | None) -> str:
    """The answer of a finished run: into the Trackio run named ``run_id`` (Trackio resumes runs by name, as the
    TrackioCallback does), else into a new run named after ``run_dir``; the one place where a Trackio run is
    started.

    ``trackio.init`` finishes whatever run is current and replaces it; it runs here inside a copy of the context,
    with no current run, so the caller's own run (if any) is neither finished nor replaced.
    """
    import trackio

    project_name = project or "huggingface"  # the Trainer's default TrainingArguments.project
    run_name = run_id or run_dir.name
    module_config = trackio.config  # init rebinds this module global to the new run's config: put it back

    def send() -> str:
        from trackio import context_vars
        from trackio.utils import TRACKIO_DIR

        context_vars.current_run.set(None)
        run = trackio.init(
            project=project_name,
            name=run_name,
            resume="allow",
            auto_log_cpu=False,
            auto_log_gpu=False,
            embed=False,
        )
        try:
            write(run, result, [])
        finally:
            run.finish()
        space = context_vars.current_space_id.get()
        where = f"Space {space}" if space else f"local store {TRACKIO_DIR}"
        return f"Trackio run {run.name} in project {project_name}: {where}"

    try:
        return contextvars.copy_context().run(send)
    finally:
        trackio.config = module_config
