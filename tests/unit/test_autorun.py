"""``hf-distprof run``: flags checked before the command starts, the start-up hook that attaches our callbacks to every
Trainer (subclasses too) in the command's processes, no duplicates, and a sitecustomize of the user's still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from hf_distprof import autorun
from hf_distprof.cli.main import main
from hf_distprof.autorun import command_environment
from hf_distprof.config import ProfilingArguments

from ..conftest import REPO_ROOT


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profiler-wait-steps", "-1", "--", "python", "x.py"], "--profiler-wait-steps"),
        (["--profile-on-demand", "--", "python", "x.py"], "--profile-on-demand opens profiler windows: it needs"),
        (["--enable-profiling"], "no command: hf-distprof run [profiling flags] -- COMMAND"),
        (["--", "python", "x.py"], "no profiling flag switches anything on"),
        (["--enable-profiling", "--", "no-such-command-here"], "command not found: no-such-command-here"),
    ],
)
def test_bad_flags_or_commands_exit_2_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(main(["run", *argv]))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_command_gets_the_hook_first_on_its_path_and_the_flags(tmp_path):
    prof = ProfilingArguments(enable_profiling=True, profiler_active_steps=4)
    env = command_environment(prof, {"PYTHONPATH": f"/theirs{os.pathsep}/more", "KEEP": "1"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    # Only the hook in front: the user's entries keep their place ahead of site-packages.
    assert parts == [str(REPO_ROOT / "hf_distprof" / "autorun" / "pythonpath"), "/theirs", "/more"]
    assert env[autorun.PACKAGE_ROOT_ENV] == str(REPO_ROOT) and env["KEEP"] == "1"
    assert ProfilingArguments(**json.loads(env[autorun.RUN_ARGS_ENV])) == prof


def test_a_file_that_cannot_be_run_is_said_before_anything_starts(tmp_path, capsys):
    plain = tmp_path / "train.sh"
    plain.write_text("echo hi\n")
    assert main(["run", "--enable-step-timing", "--", str(plain)]) == 2
    assert f"not executable (chmod +x, or run it through bash/python): {plain}" in capsys.readouterr().err
    plain.chmod(0o755)  # executable now, but without a #! line: the kernel refuses it
    assert main(["run", "--enable-step-timing", "--", str(plain)]) == 2
    assert f"cannot run {plain}: Exec format error" in capsys.readouterr().err


class FakeHandler:
    def __init__(self, callbacks: list[object]) -> None:
        self.callbacks = callbacks


def fake_trainer_module() -> types.ModuleType:
    module = types.ModuleType("fake_trainer_module")

    class Trainer:
        def __init__(self, callbacks: list[object] | None = None, rank: int = 0) -> None:
            self.args = types.SimpleNamespace(process_index=rank)
            self.callback_handler = FakeHandler(list(callbacks or []))

        def add_callback(self, callback: object) -> None:
            self.callback_handler.callbacks.append(callback)

        def remove_callback(self, callback: object) -> None:
            self.callback_handler.callbacks.remove(callback)

    module.Trainer = Trainer
    return module


def test_every_trainer_and_subclass_gets_the_callbacks_once(monkeypatch, capsys):
    monkeypatch.setenv(autorun.RUN_ARGS_ENV, json.dumps({"enable_step_timing": True, "hang_timeout": 30.0}))
    module = fake_trainer_module()
    autorun.patch_trainer(module)
    autorun.patch_trainer(module)  # twice: still one wrapper

    class Sub(module.Trainer):
        def __init__(self) -> None:
            super().__init__()

    for trainer in (module.Trainer(), Sub()):
        assert [type(cb).__name__ for cb in trainer.callback_handler.callbacks] == [
            "StepTimerCallback", "HangWatchdogCallback", "RunSummaryCallback"]
        assert autorun.attach(trainer) == []  # once per Trainer
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hf_distprof: [RANK 0] hf-distprof run: attached StepTimerCallback, "
                             "HangWatchdogCallback, RunSummaryCallback to Trainer built at ")
    assert "test_autorun.py:" in err[0] and err[1].split(" to ", 1)[1].startswith("Sub built at ")


def test_a_trainer_that_has_our_callbacks_gets_none_and_other_ranks_stay_quiet(monkeypatch, capsys):
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    monkeypatch.setenv(autorun.RUN_ARGS_ENV, json.dumps({"enable_profiling": True}))
    module = fake_trainer_module()
    autorun.patch_trainer(module)
    mine = StepTimerCallback(ProfilingArguments(enable_step_timing=True))
    trainer = module.Trainer(callbacks=["theirs", mine])
    assert trainer.callback_handler.callbacks == ["theirs", mine]
    assert ("already has StepTimerCallback; it gets no callbacks from hf-distprof run (no duplicates), so the flags "
            "given to hf-distprof run do not apply to it: pass them to the script, whose callbacks follow its own "
            "flags") in capsys.readouterr().err
    other = module.Trainer(rank=1)
    assert len(other.callback_handler.callbacks) == 4 and capsys.readouterr().err == ""
    # A rank that trains alone (no process group: accelerate launch --multi_gpu without GPUs) is process 0 to its
    # Trainer; the launcher's RANK says it is rank 1, whose console stays quiet (a trial: both said "[RANK 0]").
    monkeypatch.setenv("RANK", "1")
    alone = module.Trainer(rank=0)
    assert len(alone.callback_handler.callbacks) == 4 and capsys.readouterr().err == ""


def test_a_callback_of_ours_added_after_the_trainer_was_built_replaces_the_attached_ones(monkeypatch, capsys):
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    monkeypatch.setenv(autorun.RUN_ARGS_ENV, json.dumps({"enable_step_timing": True}))
    module = fake_trainer_module()
    autorun.patch_trainer(module)
    trainer = module.Trainer(callbacks=["theirs"])
    assert len(trainer.callback_handler.callbacks) == 3
    mine = StepTimerCallback(ProfilingArguments(enable_step_timing=True))
    trainer.add_callback(mine)
    assert trainer.callback_handler.callbacks == ["theirs", mine]
    assert "the script added StepTimerCallback itself; the callbacks hf-distprof run attached are taken back" in \
        capsys.readouterr().err
    trainer.add_callback("another of theirs")  # nothing more to take back
    assert trainer.callback_handler.callbacks == ["theirs", mine, "another of theirs"]


SCRIPT = textwrap.dedent("""
    from transformers import Trainer, TrainingArguments
    import torch

    class MyTrainer(Trainer):
        pass

    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir="out", use_cpu=True, report_to="none")
    trainer = MyTrainer(model=model, args=args)
    print("callbacks:", [type(cb).__name__ for cb in trainer.callback_handler.callbacks][-3:])
""")


def test_a_real_script_run_under_hf_distprof_run_gets_them_and_a_users_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    # Ran by the hf-distprof process itself too (their PYTHONPATH), without our variable there.
    (theirs / "sitecustomize.py").write_text("import os\nprint('theirs ran', 'HF_DISTPROF_RUN_ARGS' in os.environ)\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(theirs)}
    proc = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "run", "--enable-step-timing", "--",
                           sys.executable, "train.py"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["theirs ran False", "theirs ran True",
                                        "callbacks: ['ProgressCallback', 'StepTimerCallback', 'RunSummaryCallback']"]
    assert f"to MyTrainer built at {tmp_path / 'train.py'}:10" in proc.stderr


PLAIN_SCRIPT = textwrap.dedent("""
    import torch
    from transformers import Trainer, TrainingArguments


    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
    args = TrainingArguments(output_dir="out", use_cpu=True, report_to="none", max_steps=3, save_strategy="no",
                             per_device_train_batch_size=4, disable_tqdm=True)
    trainer = Trainer(model=Regression(), args=args, train_dataset=data)
    trainer.train()
""")


def test_the_attach_line_is_in_the_rank_log_of_a_script_that_set_up_no_logging(tmp_path):
    # The Trainer (and the line) comes before the run folder and its rank0.log (train start): the line waits for it.
    (tmp_path / "train.py").write_text(PLAIN_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "run", "--enable-step-timing",
                           "--profiler-output-dir", "P", "--profiler-run-name", "run", "--", sys.executable,
                           "train.py"], capture_output=True, text=True, cwd=tmp_path, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = (f"[RANK 0] hf-distprof run: attached StepTimerCallback, RunSummaryCallback to Trainer built at "
            f"{tmp_path / 'train.py'}:18")
    assert proc.stderr.count(said) == 1  # on the console once, as before
    log = (tmp_path / "P" / "run" / "rank0.log").read_text().splitlines()
    # The first line of the file, once, with the rank log's own prefix; the run's own records follow.
    assert log[0].endswith(f" INFO hf_distprof.autorun: {said}") and " rank 0 " in log[0]
    assert sum(said in line for line in log) == 1
    assert any("hf_distprof.callbacks.parallelism: [RANK 0] parallelism: " in line for line in log[1:])
