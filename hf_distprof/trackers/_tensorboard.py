"""TensorBoard: the answer as a text tag, its figures as scalars, and an hparams session, in one log folder.

TensorBoard has no "run" to find: the caller names the folder (the Trainer's ``TENSORBOARD_LOGGING_DIR`` or
ours beside it, see :func:`hf_distprof.tensorboard.tensorboard_dir`). Live figures and warnings are not written
here: the step timer already writes them through its own shared writer.
"""

from __future__ import annotations

from pathlib import Path

from hf_distprof.trackers._base import (
    ANSWER_TAG,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Answer,
    Skip,
    answer_numbers,
    answer_strings,
    as_number,
    summary_name,
)

LIBRARY = "tensorboard"
LABEL = "TensorBoard"


def answer(result: Answer, tensorboard_dir: Path | None) -> None:
    """Write ``result`` into ``tensorboard_dir`` (see :func:`write`); a Skip when no folder is given."""
    if tensorboard_dir is None:
        raise Skip("no TensorBoard folder given")
    write(Path(tensorboard_dir), result)


def write(log_dir: Path, result: Answer) -> None:
    """One event file in ``log_dir`` holding the whole answer at ``result.step``.

    - text ``hf_distprof/answer``: the Markdown (the tag is exactly that: torch's ``add_text`` would append
      ``/text_summary``);
    - one scalar per figure (:func:`~hf_distprof.trackers._base.answer_numbers`);
    - an hparams session whose hparams are the schema version and the string summary values (verdict, ...) and
      whose metrics are the numeric summary values: the HPARAMS tab then lists runs side by side. The session is
      written into ``log_dir`` itself, not into the timestamped sub-run that ``SummaryWriter.add_hparams`` makes,
      so the metrics it names are the scalars of this very run.
    """
    import tensorboard  # noqa: F401  # the writer's own dependency, imported first so a missing one says so
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams, text

    numbers = answer_numbers(result)
    metric_names = [summary_name(key) for key, value in result.summary.items() if as_number(value) is not None]
    hparam_values: dict[str, str | int] = {SCHEMA_KEY: SCHEMA_VERSION, **answer_strings(result)}

    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        events = writer._get_file_writer()  # the raw writer, for summaries SummaryWriter has no method for
        markdown = text(ANSWER_TAG, result.text)
        markdown.value[0].tag = ANSWER_TAG
        events.add_summary(markdown, result.step)
        for name, value in numbers.items():
            writer.add_scalar(name, value, result.step)
        experiment, session_start, session_end = hparams(
            hparam_values, {name: numbers[name] for name in metric_names if name in numbers}
        )
        for summary in (experiment, session_start, session_end):
            events.add_summary(summary, result.step)
        writer.flush()
    finally:
        writer.close()


def after_the_fact(result: Answer, run_dir: Path) -> str:
    """Write ``result`` into ``run_dir / "tensorboard"``; the line that says where."""
    log_dir = run_dir / "tensorboard"
    write(log_dir, result)
    return f"TensorBoard: {log_dir} (text {ANSWER_TAG}, scalars at step {result.step}, HPARAMS tab)"
