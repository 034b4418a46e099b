"""Send hf_distprof's figures and its answer to the experiment trackers a Trainer run reports to.

## Where the answer goes

`TrainingArguments.report_to` decides: `"tensorboard"`, `"wandb"`, `"mlflow"`, `"trackio"`, a list of them,
`"all"` (those of the four that are installed) or `"none"`. hf_distprof writes into the run that the Trainer's
own integration callback opened (TensorBoardCallback, WandbCallback, MLflowCallback, TrackioCallback), beside the
loss, and never opens a run of its own during training: with no run open, nothing is sent ("skipped: no run
open"). Every name starts with `hf_distprof/`, except the live figures, which keep the names the step timer
gives them (`timing/step_s`, `timing/imbalance_pct`, `throughput/tokens_per_s`, ...). These names are version 1
of the scheme (`SCHEMA_VERSION`, recorded as `hf_distprof/schema_version`).

**During training, at each logging step** (`send_live`, `send_text`):

- TensorBoard: nothing from here; the step timer writes its scalars and warning texts itself.
- W&B: the figures in a history row with `train/global_step` = the step; a warning as a row `(step, text)`
  of the table named after its tag.
- MLflow: the figures as metrics at step = the global step; a warning as a line `[tag] text` of the artifact
  `hf_distprof/events/step<N>.txt`.
- Trackio: the figures in a row with `train/global_step` = the step; a warning as a Markdown under its tag
  (the dashboard's Reports page).

W&B and Trackio rows carry `train/global_step` instead of an explicit step, as the Trainer's own rows do: their
built-in step counts `log` calls. W&B runs opened by the Trainer already plot every metric against
`train/global_step`; in Trackio, choose it as the X-axis.

**At the end of the run** (`send_answer`), at the run's last step, with the key figures
(`hf_distprof/exposed_comm_pct`, `hf_distprof/whatif/<name>_s`, ...), the headline values (`verdict`,
`slowest_rank`, ..., named `hf_distprof/<name>`), the findings table, the Markdown answer and the report files
(report.html, analysis.json, timing_summary.json, ...):

- TensorBoard (the folder given): the Markdown as the text `hf_distprof/answer`; the figures as scalars; an
  HPARAMS session with the text headline values (and `hf_distprof/schema_version`) as hparams and the numeric
  ones as its metrics, so that runs sit side by side in the HPARAMS tab. No files: TensorBoard holds none.
- W&B (`wandb.run`): the figures and the table `hf_distprof/findings` in a history row; the headline values in
  `run.summary`; an artifact `hf_distprof-<run id>` of type `hf_distprof-report` with `answer.md` and the files.
- MLflow (the active run): the figures as metrics; the headline values as tags (text, searchable); the
  artifacts `hf_distprof/answer.md`, `hf_distprof/findings.json` (`{"columns": ..., "data": ...}`) and
  `hf_distprof/<file>` for each file.
- Trackio (the current run): one row with the figures, the text headline values, the Markdown
  `hf_distprof/answer` and the table `hf_distprof/findings`; an artifact `hf_distprof-<run name>` of type
  `hf_distprof-report` with `answer.md` and the files. Trackio has no run summary and no tags.

Traces are attached only when asked (`include_traces`): under `traces/` in the W&B and Trackio artifacts, under
`hf_distprof/traces/` in MLflow.

Headline values that are numbers are also logged as figures under `hf_distprof/<name>`, so that runs can be
sorted and compared by them. Figures that are not finite numbers are left out. MLflow names may only hold letters,
digits, `_ - . /` and spaces: other characters become `_` there.

**After the fact**: `hf-distprof analyze RUN --log-to wandb|mlflow|tensorboard|trackio` sends a finished run's
answer the same way, into the tracker run whose id is given (W&B: the run id, resumed; MLflow: the run id;
Trackio: the run name), else into a new run named after the run folder (Trackio, which knows runs by name, adds
to an earlier run of that name), the only case where hf_distprof starts a run. TensorBoard: the folder
`RUN/tensorboard`.

**When a tracker fails**: a tracker whose library is missing, or that raises, costs one warning (logger
`hf_distprof.trackers`) per tracker and process, never an exception; the training goes on. `send_answer` returns
what happened to each tracker: `"sent"`, `"skipped: why"` or `"failed: why"`.

**Timing**: in `on_train_end` the Trainer's Trackio callback finishes its run, and its MLflow callback ends the
run it started; both run before the callbacks passed to `Trainer(callbacks=...)`, so the answer must be sent
before that point to reach them. MLflow's active run and Trackio's current run belong to the thread that opened
them: send from the thread that runs the callbacks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType

from hf_distprof.trackers import _mlflow, _tensorboard, _trackio, _wandb
from hf_distprof.trackers._base import (
    ANSWER_TAG,
    ARTIFACT_TYPE,
    FINDINGS_KEY,
    FINDINGS_TABLE_KEY,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    STEP_KEY,
    Answer,
    NoRun,
    Skip,
    forget_warnings,
    logger,
    summary_name,
    warn_once,
)

__all__ = [
    "ANSWER_TAG",
    "ARTIFACT_TYPE",
    "FINDINGS_KEY",
    "FINDINGS_TABLE_KEY",
    "SCHEMA_KEY",
    "RENAMED_BY_TRAINER",
    "renamed_by_trainer",
    "SCHEMA_VERSION",
    "STEP_KEY",
    "SUPPORTED",
    "Answer",
    "forget_warnings",
    "resolve",
    "send_after_the_fact",
    "send_answer",
    "send_live",
    "send_text",
    "summary_name",
]

_ADAPTERS: dict[str, ModuleType] = {
    "tensorboard": _tensorboard,
    "wandb": _wandb,
    "mlflow": _mlflow,
    "trackio": _trackio,
}
SUPPORTED: tuple[str, ...] = tuple(_ADAPTERS)
"""The trackers hf_distprof sends to, by their ``report_to`` names."""

_PIP_NAMES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny", "trackio": "trackio"}

NO_RUN = "skipped: no run open"


def _installed(tracker: str) -> bool:
    """Whether the Trainer would report to ``tracker`` under ``report_to="all"``: its library can be found (and,
    for MLflow, ``DISABLE_MLFLOW_INTEGRATION`` is not set, as transformers checks)."""
    if tracker == "mlflow" and os.environ.get("DISABLE_MLFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    try:
        return importlib.util.find_spec(_ADAPTERS[tracker].LIBRARY) is not None
    except (ImportError, ValueError):  # a half-removed package, or a module set to None
        return False


def _requested(report_to: str | Iterable[str] | None) -> list[str]:
    """Every tracker name ``report_to`` asks for, lower-cased, in order, without repeats; ``"all"`` stands for
    the supported trackers that are installed, ``"none"`` for nothing. Names may also be given comma-separated
    in one string, as on a command line."""
    if report_to is None:
        return []
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    names = [part.strip().lower() for item in items for part in str(item).split(",") if part.strip()]
    out: list[str] = []
    for name in names:
        expanded = [t for t in SUPPORTED if _installed(t)] if name == "all" else [] if name == "none" else [name]
        out.extend(t for t in expanded if t not in out)
    return out


def resolve(report_to: str | list[str] | None) -> list[str]:
    """The trackers of ``report_to`` that hf_distprof sends to, in order.

    ``"all"`` becomes the supported trackers that are installed; ``"none"``, None and an empty list become
    ``[]``; names of trackers we do not serve (``"comet_ml"``, ...) are left out.
    """
    return [name for name in _requested(report_to) if name in _ADAPTERS]


def _attempt(tracker: str, what: str, call: Callable[[], object], *, warn_without_run: bool) -> str:
    """Run one adapter call and say how it went, turning every problem into a status and at most one warning
    per tracker. A missing run (or TensorBoard folder) warns only for the end-of-run answer: during training it
    is normal on every rank but the first, and before the Trainer's callback has opened the run."""
    adapter = _ADAPTERS[tracker]
    try:
        importlib.import_module(adapter.LIBRARY)
    except ImportError as err:
        pip_name = _PIP_NAMES[tracker]
        warn_once(
            tracker,
            f"hf_distprof cannot send {what} to {adapter.LABEL}: the {adapter.LIBRARY} library cannot be imported "
            f"({err}); pip install {pip_name}. Nothing more is sent to {adapter.LABEL} from this process.",
        )
        return f"skipped: {adapter.LIBRARY} is not installed (pip install {pip_name})"
    try:
        call()
    except NoRun as err:
        message = f"hf_distprof did not send {what} to {adapter.LABEL}: {err}; it never starts a run itself."
        if warn_without_run:
            warn_once(tracker, message)
        else:
            logger.debug(message)
        return NO_RUN
    except Skip as err:
        message = f"hf_distprof did not send {what} to {adapter.LABEL}: {err}."
        if warn_without_run:
            warn_once(tracker, message)
        else:
            logger.debug(message)
        return f"skipped: {err}"
    except Exception as err:  # any failure of a tracker is its own: the caller (training) must go on
        warn_once(
            tracker,
            f"hf_distprof could not send {what} to {adapter.LABEL}: {type(err).__name__}: {err}. Later problems "
            f"with {adapter.LABEL} are logged at DEBUG only.",
        )
        logger.debug("the failure in full", exc_info=True)
        return f"failed: {type(err).__name__}: {err}"
    return "sent"


RENAMED_BY_TRAINER = ("wandb", "trackio")
"""Trackers whose Trainer integration renames every key it logs (``train/<key>``, transformers' ``rewrite_logs``):
the live figures the step timer adds to the logs reach them as ``train/timing/step_s``; :func:`send_live` adds them
under their own names. MLflow's and TensorBoard's integrations keep the names (and the step timer writes TensorBoard
itself)."""


def renamed_by_trainer(report_to: str | list[str] | None) -> list[str]:
    """The trackers of ``report_to`` in :data:`RENAMED_BY_TRAINER`."""
    return [t for t in resolve(report_to) if t in RENAMED_BY_TRAINER]


def send_live(
    report_to: str | list[str] | None,
    figures: Mapping[str, float],
    step: int,
    *,
    tensorboard_dir: Path | None = None,
) -> None:
    """Send one logging step's figures (``timing/step_s``, ``throughput/tokens_per_s``, ...) under their own
    names into the history of every tracker run ``report_to`` names, at ``step`` (see the module text).

    TensorBoard is skipped: the step timer writes its scalars itself (``tensorboard_dir`` is accepted for a
    uniform call and not used). Never raises; a tracker's problem costs one warning per process.
    """
    del tensorboard_dir
    values = dict(figures)
    for tracker in resolve(report_to):
        if tracker == "tensorboard":
            continue
        live = functools.partial(_ADAPTERS[tracker].live, values, step)
        _attempt(tracker, "live figures", live, warn_without_run=False)


def send_text(
    report_to: str | list[str] | None,
    tag: str,
    text: str,
    step: int,
    *,
    tensorboard_dir: Path | None = None,
) -> None:
    """Send a live event, one sentence (a warning) at ``step``, to every tracker run ``report_to`` names.

    W&B: a row ``(step, text)`` of the INCREMENTAL table ``tag``; MLflow: a line ``[tag] text`` of the artifact
    ``hf_distprof/events/step<step>.txt``; Trackio: a ``trackio.Markdown`` under ``tag``; TensorBoard: a text event
    ``tag`` in ``tensorboard_dir`` (rank 0's writer), skipped without one (the step timer and the memory logger write
    their text themselves). No tracker's alert feature is used: a profiler hint must not page anyone. Never raises.
    """
    for tracker in resolve(report_to):
        if tracker == "tensorboard":
            if tensorboard_dir is not None:
                _attempt(tracker, "a warning", functools.partial(_text_event, tensorboard_dir, tag, text, step),
                         warn_without_run=False)
            continue
        event = functools.partial(_ADAPTERS[tracker].text, tag, text, step)
        _attempt(tracker, "a warning", event, warn_without_run=False)


def _text_event(folder: Path, tag: str, text: str, step: int) -> None:
    from hf_distprof import tensorboard  # (it imports torch: the package's import stays light)

    writer = tensorboard.get_writer(folder)
    if writer is not None:
        writer.add_text(tag, text, step)
        writer.flush()


def send_answer(
    report_to: str | list[str] | None,
    answer: Answer,
    *,
    tensorboard_dir: Path | None = None,
    include_traces: list[Path] | None = None,
) -> dict[str, str]:
    """Send the end-of-run answer to every tracker ``report_to`` names (what lands where: the module text).

    Args:
        report_to: ``TrainingArguments.report_to``.
        answer: What the analysis says.
        tensorboard_dir: The TensorBoard folder to write into (needed for ``"tensorboard"``).
        include_traces: Trace files to attach beside the report files (W&B, MLflow, Trackio); none by default,
            as traces can be large.

    Returns:
        ``{tracker: "sent" | "skipped: why" | "failed: why"}`` for every tracker ``report_to`` asks for,
        including those hf_distprof does not serve. Never raises.
    """
    traces = list(include_traces or [])
    outcome: dict[str, str] = {}
    for tracker in _requested(report_to):
        adapter = _ADAPTERS.get(tracker)
        if adapter is None:
            outcome[tracker] = f"skipped: hf_distprof does not send to {tracker} (only to {', '.join(SUPPORTED)})"
            logger.debug("report_to names %s: %s", tracker, outcome[tracker])
            continue
        call: Callable[[], object]
        if tracker == "tensorboard":
            call = functools.partial(_tensorboard.answer, answer, tensorboard_dir)
        else:
            call = functools.partial(adapter.answer, answer, traces)
        outcome[tracker] = _attempt(tracker, "its answer", call, warn_without_run=True)
    return outcome


def send_after_the_fact(
    tracker: str,
    answer: Answer,
    run_dir: Path,
    *,
    run_id: str | None = None,
    project: str | None = None,
) -> str:
    """Send a finished run's answer (``hf-distprof analyze RUN --log-to TRACKER``).

    Into the tracker's run ``run_id`` when given (W&B: resumed with ``resume="allow"``; MLflow: through
    ``MlflowClient``, its status left alone; Trackio: the run of that name, resumed), else into a new run named
    ``run_dir.name`` in ``project``. Without ``project``, where the Trainer would put it: W&B ``WANDB_PROJECT``,
    else ``"huggingface"``; Trackio ``"huggingface"``; MLflow ``MLFLOW_EXPERIMENT_ID``, else
    ``MLFLOW_EXPERIMENT_NAME``, else the default experiment. Trackio knows runs by name: a run of that name that
    exists already gets the answer added.
    This is the only place hf_distprof starts a tracker run, and only because the user asked for it.
    TensorBoard: the folder ``run_dir / "tensorboard"`` (``run_id`` and ``project`` are not used).

    Returns:
        One line saying where the answer went, or ``"<tracker>: skipped: why"`` / ``"<tracker>: failed: why"``
        (with one warning) when it did not.

    Raises:
        ValueError: ``tracker`` is not one of :data:`SUPPORTED` (a usage error, not a tracker failure).
    """
    name = tracker.strip().lower()
    adapter = _ADAPTERS.get(name)
    if adapter is None:
        raise ValueError(f"cannot log to {tracker!r}: hf_distprof sends to {', '.join(SUPPORTED)}")
    where: list[str] = []

    def call() -> None:
        if name == "tensorboard":
            where.append(_tensorboard.after_the_fact(answer, Path(run_dir)))
        else:
            where.append(adapter.after_the_fact(answer, Path(run_dir), run_id, project))

    status = _attempt(name, "the run's answer", call, warn_without_run=True)
    return where[0] if status == "sent" and where else f"{name}: {status}"
