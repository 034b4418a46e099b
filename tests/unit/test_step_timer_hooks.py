"""StepTimerCallback driven hook by hook: which on_log calls gather, and failures that must not escape."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_distprof import ProfilingArguments, StepTimerCallback
from hf_distprof.callbacks import step_timer
from tests.unit.fake_trainer import training_args


class Run:
    """One callback, one tiny model, and every all_gather_object call recorded with its global_step."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
        self.gathers: list[int] = []
        self.state = TrainerState()
        self.control = TrainerControl()
        self.args = training_args(tmp_path)

        def one_rank_gather(obj: Any) -> list[Any]:
            self.gathers.append(self.state.global_step)
            return [obj]

        real_async = step_timer.dist.all_gather_json_async

        def one_rank_async(obj: Any, cap: int) -> Any:
            self.gathers.append(self.state.global_step)
            return real_async(obj, cap)  # no process group: nothing is sent

        monkeypatch.setattr(step_timer.dist, "all_gather_object", one_rank_gather)
        monkeypatch.setattr(step_timer.dist, "all_gather_json_async", one_rank_async)
        prof = ProfilingArguments(
            enable_step_timing=True, profiler_output_dir=str(tmp_path / "prof"), profiler_run_name="run"
        )
        self.callback = StepTimerCallback(prof)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        self.callback.on_train_begin(self.args, self.state, self.control, model=self.model)

    def step(self, should_log: bool = False) -> None:
        cb, args, state, control = self.callback, self.args, self.state, self.control
        cb.on_step_begin(args, state, control)
        self.model(torch.randn(3, 4)).sum().backward()
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_optimizer_step(args, state, control)
        state.global_step += 1
        control.should_log = should_log  # what DefaultFlowCallback.on_step_end decided, before our hook
        cb.on_step_end(args, state, control)

    def log(self, logs: dict[str, float]) -> None:
        self.control.should_log = False  # CallbackHandler.on_log resets it before calling the callbacks
        self.callback.on_log(self.args, self.state, self.control, logs=logs)

    def end(self) -> None:
        self.callback.on_train_end(self.args, self.state, self.control)


def test_only_the_trainers_logging_steps_gather(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    run.step()
    run.step(should_log=True)
    run.log({"loss": 1.0})  # the Trainer's log of step 2: every rank is here
    run.log({"eval_loss": 1.0})  # evaluation metrics at the same step
    run.step()
    run.log({"custom": 1.0})  # `if trainer.is_world_process_zero(): trainer.log(...)`: rank 0 only
    run.step()
    run.log({"eval_loss": 0.5})
    run.end()
    # The parallelism report at train start, the logging step, then the end-of-run gather; nothing else.
    assert run.gathers == [0, 0, 2, 4]
    lines = (run.callback.run_dir / "timing_rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]


def test_a_log_at_a_later_step_does_not_use_a_stale_logging_flag(tmp_path, monkeypatch):
    run = Run(tmp_path, monkeypatch)
    run.step(should_log=True)  # flagged, but the Trainer's log never comes (e.g. it was skipped)
    run.step()
    run.log({"custom": 1.0})  # rank 0 only, at step 2: must not gather for step 1's flag
    run.step(should_log=True)
    run.log({"loss": 1.0})
    # Train start: run folder, parallelism report; step 1's gather, started at its on_step_end on every rank (each
    # rank's DefaultFlowCallback flagged it) and read when step 3's starts; step 3's. None for the log at step 2.
    assert run.gathers == [0, 0, 1, 3]


class FullDiskFile:
    """A text file on a full disk: every write, flush or close raises ENOSPC (as chosen)."""

    def __init__(self, fail_write: bool = True, fail_close: bool = False) -> None:
        self.name = "/full/timing_rank0.jsonl"
        self.fail_write, self.fail_close = fail_write, fail_close
        self.writes = 0
        self.closed = False

    def write(self, text: str) -> int:
        self.writes += 1
        if self.fail_write:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_stops_the_jsonl_with_one_warning_and_the_gathers_go_on(tmp_path, monkeypatch, caplog):
    run = Run(tmp_path, monkeypatch)
    jsonl = run.callback._jsonl
    assert jsonl is not None and jsonl.file is not None
    jsonl.file.close()
    full = FullDiskFile()
    jsonl.file = full  # type: ignore[assignment]
    with caplog.at_level("WARNING"):
        for step in range(1, 7):
            run.step(should_log=step % 2 == 0)
            if step % 2 == 0:
                run.log({"loss": 1.0})
        run.end()
    # Train start, every logging step and the end, as on the ranks with disk space.
    assert run.gathers == [0, 0, 2, 4, 6, 6]
    assert full.writes == 1 and full.closed  # tried once, then the file was given up
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "No space left" in warnings[0] and str(jsonl.path) in warnings[0]
    assert jsonl.path.name == "timing_rank0.jsonl"
    summary = run.callback.summary
    assert summary is not None and summary["per_rank"][0]["steps"] == 5  # the timing itself went on


def test_a_close_that_fails_at_train_end_is_one_warning(tmp_path, monkeypatch, caplog):
    run = Run(tmp_path, monkeypatch)
    jsonl = run.callback._jsonl
    assert jsonl is not None and jsonl.file is not None
    jsonl.file.close()
    full = FullDiskFile(fail_write=False, fail_close=True)
    jsonl.file = full  # type: ignore[assignment]
    run.step(should_log=True)
    run.log({"loss": 1.0})
    with caplog.at_level("WARNING"):
        run.end()  # must not raise
    assert full.writes == 1 and full.closed and jsonl.file is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot close" in warnings[0] and "No space left" in warnings[0]
    assert (run.callback.run_dir / "timing_summary.json").exists()


def test_without_a_run_folder_timing_goes_on_without_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(step_timer.paths, "resolve_run_dir", lambda *args, **kwargs: None)
    run = Run(tmp_path, monkeypatch)
    assert run.callback.run_dir is None and run.callback._jsonl is None
    for step in range(1, 5):
        run.step(should_log=step == 4)
    run.log({"loss": 1.0})
    run.end()
    assert run.gathers == [0, 4, 4]
    assert run.callback.summary is not None and run.callback.summary["steps_in_means"] == 3
    assert "no run folder, no files" in capsys.readouterr().out
    assert not (tmp_path / "prof").exists()
    # TensorBoard scalars still go to the Trainer's output folder.
    assert [p.name for p in (tmp_path / "trainer_out" / "runs").iterdir()] == ["hf_distprof_run"]
