"""MLflow: into ``mlflow.active_run()``, the run the Trainer's MLflowCallback (or the user) started.

Everything goes through an ``MlflowClient`` with that run's id, never through the fluent ``mlflow.log_*``
functions: those start a run of their own when none is active, which we must never do. Metrics are logged at
the global step, as the MLflowCallback logs them.

``mlflow.active_run()`` is per thread: call from the thread that runs the Trainer's callbacks.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hf_distprof.trackers._base import (
    ANSWER_TAG,
    FINDINGS_KEY,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Answer,
    NoRun,
    answer_numbers,
    attachable,
    numbers_of,
    plain,
    summary_name,
    table_rows,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

LIBRARY = "mlflow"
LABEL = "MLflow"

ARTIFACT_DIR = "hf_distprof"
EVENTS_DIR = "hf_distprof/events"

# MLflow's own limits (mlflow.utils.validation): names, tag values, and entries per log_batch.
_MAX_NAME = 250
_MAX_TAG_VALUE = 8000
_METRICS_PER_BATCH = 1000
_TAGS_PER_BATCH = 100
_BAD_NAME_CHARS = re.compile(r"[^/\w.\- ]")  # what MLflow accepts on every OS (no ':' on Windows)

_events: dict[str, tuple[int, list[str]]] = {}  # run id -> (step, the event lines of that step so far)
_events_lock = threading.Lock()


def mlflow_name(name: str) -> str:
    """``name`` as MLflow accepts it: characters outside letters, digits, ``_ - . / space`` become ``_``, and
    at most 250 characters. Our own names pass unchanged; a what-if named ``fsdp+prefetch`` becomes
    ``fsdp_prefetch`` here rather than failing the whole batch."""
    return _BAD_NAME_CHARS.sub("_", name)[:_MAX_NAME]


def _active_run_id() -> str:
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise NoRun("no MLflow run active in this thread (mlflow.active_run() is None)")
    return str(run.info.run_id)


def _client() -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient()


def _log_metrics(client: MlflowClient, run_id: str, figures: dict[str, float], step: int) -> None:
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    metrics = [Metric(mlflow_name(key), value, stamp, step) for key, value in figures.items()]
    for start in range(0, len(metrics), _METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + _METRICS_PER_BATCH])


def live(figures: dict[str, float], step: int) -> None:
    """The finite figures as metrics of the active run at ``step``."""
    run_id = _active_run_id()
    numbers = numbers_of(figures)
    if numbers:
        _log_metrics(_client(), run_id, numbers, step)


def text(tag: str, sentence: str, step: int) -> None:
    """The artifact ``hf_distprof/events/step<step>.txt``: one ``[tag] sentence`` line per event of that step.

    An artifact, not a tag: a tag holds one value, and events of different steps must all stay. MLflow cannot
    append to an artifact, so the file is rewritten with every line of its step so far.
    """
    run_id = _active_run_id()
    with _events_lock:
        last_step, lines = _events.get(run_id, (step, []))
        if last_step != step:
            lines = []
        lines = [*lines, f"[{tag}] {sentence}"]
        _events[run_id] = (step, lines)
    _client().log_text(run_id, "\n".join(lines) + "\n", f"{EVENTS_DIR}/step{step}.txt")


def answer(result: Answer, traces: list[Path]) -> None:
    """The answer into the active run (see :func:`write`)."""
    run_id = _active_run_id()
    write(_client(), run_id, result, traces)


def write(client: MlflowClient, run_id: str, result: Answer, traces: list[Path]) -> None:
    """The answer into the run ``run_id``.

    - metrics: the figures at ``result.step``;
    - tags ``hf_distprof/<name>``: every summary value that is not None, as text (so runs can be searched:
      ``tags."hf_distprof/verdict" = 'comm-bound'``), and ``hf_distprof/schema_version``;
    - artifacts under ``hf_distprof/``: ``answer.md``, ``findings.json`` (``{"columns", "data"}``, the layout of
      ``mlflow.log_table``, which needs pandas), each artifact file, and the traces under ``traces/`` when asked.
    """
    from mlflow.entities import RunTag

    _log_metrics(client, run_id, answer_numbers(result), result.step)
    tags = [RunTag(SCHEMA_KEY, str(SCHEMA_VERSION))]
    for key, value in result.summary.items():
        if value is not None:
            tags.append(RunTag(mlflow_name(summary_name(key)), str(plain(value))[:_MAX_TAG_VALUE]))
    for start in range(0, len(tags), _TAGS_PER_BATCH):
        client.log_batch(run_id, tags=tags[start : start + _TAGS_PER_BATCH])

    client.log_text(run_id, result.text, f"{ANSWER_TAG}.md")
    columns, rows = table_rows(result)
    if columns:
        client.log_dict(run_id, {"columns": columns, "data": rows}, f"{FINDINGS_KEY}.json")
    _attach(client, run_id, attachable(result.artifacts), ARTIFACT_DIR)
    _attach(client, run_id, attachable(traces), f"{ARTIFACT_DIR}/traces")


def _attach(client: MlflowClient, run_id: str, items: list[tuple[Path, str]], under: str) -> None:
    for path, name in items:
        if path.is_dir():
            client.log_artifacts(run_id, str(path), f"{under}/{name}")
        else:  # name ends with the file's own name, which log_artifact keeps
            folder = os.path.dirname(name)
            client.log_artifact(run_id, str(path), f"{under}/{folder}" if folder else under)


def _experiment_id(client: MlflowClient, project: str | None) -> str:
    """The experiment ``project`` (created if new); without one, the experiment the MLflowCallback would use
    (``MLFLOW_EXPERIMENT_ID``, then ``MLFLOW_EXPERIMENT_NAME``), else MLflow's default experiment."""
    from mlflow.environment_variables import MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME
    from mlflow.tracking.default_experiment import DEFAULT_EXPERIMENT_ID

    name = project
    if name is None:
        env_id = MLFLOW_EXPERIMENT_ID.get()
        if env_id:
            return str(env_id)
        name = MLFLOW_EXPERIMENT_NAME.get()
    if not name:
        return DEFAULT_EXPERIMENT_ID
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    return str(client.create_experiment(name))


def after_the_fact(result: Answer, run_dir: Path, run_id: str | None, project: str | None) -> str:
    """The answer of a finished run: into the MLflow run ``run_id`` (its status left as it is), else into a new,
    finished run named after ``run_dir``; the one place where an MLflow run is started."""
    import mlflow

    client = _client()
    uri = mlflow.get_tracking_uri()
    if run_id is not None:
        run = client.get_run(run_id)  # raises when there is no such run
        write(client, run_id, result, [])
        return f"MLflow run {run_id} ({run.info.run_name}) at {uri}"

    experiment_id = _experiment_id(client, project)
    run = client.create_run(experiment_id, run_name=run_dir.name, tags={"hf_distprof/run_dir": str(run_dir)})
    new_id = str(run.info.run_id)
    try:
        write(client, new_id, result, [])
    except BaseException:
        client.set_terminated(new_id, "FAILED")
        raise
    client.set_terminated(new_id, "FINISHED")
    return f"MLflow run {new_id} ({run_dir.name}) in experiment {experiment_id} at {uri}"
