"""The end-of-run block: what rank 0 prints at train end in any script that uses build_callbacks."""

from __future__ import annotations

import types
from pathlib import Path

from hf_distprof.callbacks.summary import BANNER, RunSummaryCallback, trainer_tensorboard_dir, where_to_look
from hf_distprof.config import ProfilingArguments

from . import fake_trainer


def test_the_block_names_each_trace_summary_and_the_commands(tmp_path):
    run = tmp_path / "P" / "run"
    run.mkdir(parents=True)
    for name in ("rank1_h_step3-4.pt.trace.json.gz", "rank0_h_step3-4.pt.trace.json.gz", "timing_summary.json",
                 "manifest.json", "rank0_h_step3-4_summary.txt"):
        (run / name).write_text("x")
    tb = [tmp_path / "out" / "runs" / "hf_distprof_run", tmp_path / "out" / "runs"]
    assert where_to_look([run], tb, profiling=True).splitlines() == [
        "", "=" * 78, BANNER,
        f"  run folder: {run}  (2 trace(s))",
        "    rank0_h_step3-4.pt.trace.json.gz",
        "    rank1_h_step3-4.pt.trace.json.gz",
        "    summaries: timing_summary.json, manifest.json; per-rank log: rank<R>.log",
        f"  TensorBoard events: {tb[0]}",
        f"  TensorBoard events: {tb[1]}",
        "",
        "View them:",
        f"  tensorboard --logdir {tmp_path / 'out' / 'runs'}          # scalars",
        f"  open https://ui.perfetto.dev and drag in a trace from {run}",
        f"  pip install torch-tb-profiler && tensorboard --logdir {run.parent}",
        f"  hf-distprof analyze {run}               # where the step time goes",
        f"  hf-distprof analyze {run} --report {run / 'report'}   # Markdown/HTML with plots",
        "=" * 78,
    ]


def test_without_traces_or_tensorboard_only_what_exists_is_named(tmp_path):
    lines = where_to_look([tmp_path], [], profiling=False).splitlines()
    assert f"  run folder: {tmp_path}  (0 trace(s))" in lines
    assert not [line for line in lines if "tensorboard" in line or "perfetto" in line]
    assert f"  hf-distprof analyze {tmp_path}               # where the step time goes" in lines


def test_the_trainers_tensorboard_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    args = types.SimpleNamespace(report_to=["tensorboard"], output_dir=str(tmp_path))
    assert trainer_tensorboard_dir(args) == tmp_path / "runs"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "/tb/here")
    assert trainer_tensorboard_dir(args) == Path("/tb/here")
    assert trainer_tensorboard_dir(types.SimpleNamespace(report_to="none", output_dir=".")) is None


def test_printed_once_at_train_end_on_rank_0(tmp_path, capsys):
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    args = ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "P"),
                              profiler_run_name="run")
    summary = RunSummaryCallback(args)
    fake_trainer.run([StepTimerCallback(args), summary], 3, tmp_path)
    out = capsys.readouterr().out
    assert out.count(BANNER) == 1 and summary.printed is not None
    assert f"  run folder: {tmp_path / 'P' / 'run'}  (0 trace(s))" in summary.printed
