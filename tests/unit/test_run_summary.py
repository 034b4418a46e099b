"""The end-of-run block: what rank 0 prints at train end in any script that uses build_callbacks."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from hf_distprof.callbacks.summary import BANNER, RunSummaryCallback, trainer_tensorboard_dir, where_to_look
from hf_distprof.config import ProfilingArguments

from . import fake_trainer


def test_the_block_names_each_trace_summary_and_the_commands(tmp_path):
    run = tmp_path / "P" / "run"
    run.mkdir(parents=True)
    # (a trial: step16 listed before step7, as text sorts; the memory views' per-rank files left out of the block)
    for name in ("rank1_h_step3-4.pt.trace.json.gz", "rank0_h_step16-18.pt.trace.json.gz",
                 "rank0_h_step7-9.pt.trace.json.gz", "timing_summary.json", "manifest.json",
                 "rank0_h_step7-9_summary.txt", "manifest_rank0_h.json", "timing_rank0.jsonl", "timing_rank1.jsonl",
                 "rank1_memory_stats.yaml", "rank0.log"):
        (run / name).write_text("x")
    # A clean rank's crash file lies there, empty, until its process exits; an atomic write's temp file: not listed.
    (run / "rank0_crash.txt").write_text("")
    (run / ".timing_rank0.jsonl.~1@h.tmp").write_text("x")
    tb = [tmp_path / "out" / "runs" / "hf_distprof_run", tmp_path / "out" / "runs"]
    assert where_to_look([run], tb, profiling=True).splitlines() == [
        "", "=" * 78, BANNER,
        f"  run folder: {run}  (3 trace(s))",
        "    rank0_h_step7-9.pt.trace.json.gz",
        "    rank0_h_step16-18.pt.trace.json.gz",
        "    rank1_h_step3-4.pt.trace.json.gz",
        "    summaries: timing_summary.json, manifest.json; per-rank files: rank<R>.log, timing_rank<R>.jsonl, "
        "rank<R>_memory_stats.yaml",
        f"  TensorBoard events: {tb[0]}",
        f"  TensorBoard events: {tb[1]}",
        "",
        "View them:",
        f"  tensorboard --logdir {tmp_path / 'out' / 'runs'}          # scalars",
        f"  Perfetto: in a browser, https://ui.perfetto.dev, drag in a trace from {run}",
        f"  pip install torch-tb-profiler && tensorboard --logdir {run.parent}",
        f"  hf-distprof analyze {run}               # where the step time goes",
        f"  hf-distprof analyze {run} --report {run / 'report'}   # Markdown/HTML with plots",
        "=" * 78,
    ]


def test_a_stall_the_watchdog_dumped_is_named_with_the_command_that_reads_it(tmp_path):
    # A trial: a 25 s stall dumped by --hang-timeout (no --hang-abort: training went on); the block said nothing of it.
    run = tmp_path / "run"
    run.mkdir()
    (run / "timing_rank0.jsonl").write_text("x")
    (run / "hang_rank1_h.txt").write_text("hf_distprof hang dump")
    (run / "hang_rank0_h.faulthandler.txt").write_text("")  # a backstop never written: none
    lines = where_to_look([run], [], profiling=False).splitlines()
    assert "    hang dumps: hang_rank1_h.txt (a step stalled past --hang-timeout; training went on)" in lines
    assert lines[-2] == f"  hf-distprof hang-report {run}               # where the stalled step was stuck"
    # An earlier attempt's, in a folder a restarted job reuses: not this run's.
    assert not [line for line in where_to_look([run], [], profiling=False, since=time.time() + 60).splitlines()
                if "hang" in line]
    (run / "hang_rank1_h.txt").unlink()
    assert not [line for line in where_to_look([run], [], profiling=False).splitlines() if "hang" in line]


def test_a_report_already_written_for_the_trackers_is_named_not_written_again(tmp_path):
    # The run's report (written at train end when report_to names a tracker): named; the --report line would
    # overwrite it.
    import os

    trace = tmp_path / "rank0_h_step3-4.pt.trace.json.gz"
    trace.write_text("x")
    os.utime(trace, (1_000_000, 1_000_000))
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.html").write_text("<html>")
    lines = where_to_look([tmp_path], [], profiling=True).splitlines()
    assert (f"  report: {tmp_path / 'report' / 'report.html'}   # open it in a browser: the report, with plots "
            "(already written)") in lines
    assert not [line for line in lines if "--report" in line]
    # An earlier run's report in a reused run folder (--profiler-run-name): older than this run's traces, not named.
    os.utime(trace, None)
    os.utime(tmp_path / "report" / "report.html", (1_000_000, 1_000_000))
    lines = where_to_look([tmp_path], [], profiling=True).splitlines()
    assert [line for line in lines if "--report" in line] and not [line for line in lines if "already written" in line]


def test_without_traces_or_tensorboard_only_what_exists_is_named(tmp_path):
    # Memory logging alone printed no step-timer table: "the step timer's table is above" was said of nothing (a trial).
    lines = where_to_look([tmp_path], [], profiling=False).splitlines()
    assert f"  no trace in {tmp_path}: nothing for hf-distprof analyze (--enable-profiling takes them)" in lines
    (tmp_path / "timing_summary.json").write_text("{}")  # the step timer's summary: its table was printed
    lines = where_to_look([tmp_path], [], profiling=False).splitlines()
    assert f"  run folder: {tmp_path}  (0 trace(s))" in lines
    assert not [line for line in lines if "tensorboard" in line or "perfetto" in line]
    # analyze reads traces: no command that would stop with an error.
    assert not [line for line in lines if line.startswith("  hf-distprof analyze")]
    assert (f"  no trace in {tmp_path}: nothing for hf-distprof analyze (--enable-profiling takes them); the step "
            "timer's table is above") in lines
    profiled = where_to_look([tmp_path], [], profiling=True).splitlines()
    assert f"  no trace in {tmp_path}: nothing for hf-distprof analyze; the step timer's table is above" in profiled
    # Profiling asked for, no window recorded: no viewer to drag a trace into (a trial read "(0 trace(s))", then
    # "drag in a trace from ...").
    assert not [line for line in profiled if "perfetto" in line or "torch-tb-profiler" in line]


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


def test_a_rank_that_trains_alone_under_a_launcher_s_rank_1_prints_no_block(tmp_path, capsys, monkeypatch):
    # A trial: accelerate launch --multi_gpu on a machine without GPUs and no --use_cpu: each rank trains alone and
    # calls itself process 0; both printed the block. The launcher's RANK says which one is rank 0.
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    monkeypatch.setenv("RANK", "1")
    args = ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "P"),
                              profiler_run_name="run")
    summary = RunSummaryCallback(args)
    fake_trainer.run([StepTimerCallback(args), summary], 3, tmp_path)
    assert BANNER not in capsys.readouterr().out and summary.printed is None


def opened_by(line: str) -> list[Path]:
    """The folders a ``tensorboard`` line of the block opens, read as TensorBoard reads its flags."""
    from tensorboard.backend.event_processing.data_ingester import _parse_event_files_spec

    command = line.split("#")[0].split()
    assert command[:2] in (["tensorboard", "--logdir"], ["tensorboard", "--logdir_spec"]) and len(command) == 3
    if command[1] == "--logdir":
        return [Path(command[2])]
    return [Path(p) for p in _parse_event_files_spec(command[2])]


def tensorboard_lines(block: str) -> tuple[list[str], str]:
    lines = block.splitlines()
    listed = [line.split("TensorBoard events: ", 1)[1] for line in lines if "TensorBoard events: " in line]
    (command,) = [line.split("#")[0].strip() for line in lines if line.strip().startswith("tensorboard --logdir")]
    return listed, command


def test_a_folder_given_absolute_and_relative_is_listed_once_and_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "out" / "runs" / "20261127-101010_vm"
    folder.mkdir(parents=True)
    listed, command = tensorboard_lines(where_to_look([], [folder, Path("out/runs/20261127-101010_vm")], False))
    assert listed == [str(folder)]
    # Its parent: the Trainer's earlier runs beside it.
    assert command == f"tensorboard --logdir {tmp_path / 'out' / 'runs'}"


@pytest.mark.parametrize("layout", ["siblings", "nested", "far apart", "far apart, same name"])
def test_the_tensorboard_line_opens_every_folder_it_lists(tmp_path, monkeypatch, layout):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "out" / "runs"
    folders = {
        "siblings": [runs / "hf_distprof_run", runs / "20261127_vm"],
        "nested": [runs / "hf_distprof_run", Path("out/runs")],
        # A common parent of these would be / (everything on the machine): the line names each folder instead.
        "far apart": [tmp_path / "a" / "b" / "c" / "tb", Path("/tmp") / "elsewhere_tb"],
        "far apart, same name": [tmp_path / "x" / "y" / "z" / "tb", tmp_path / "tb"],
    }[layout]
    listed, command = tensorboard_lines(where_to_look([], folders, False))
    assert listed == [str(f.absolute()) for f in folders]
    opened = opened_by(command)
    for folder in listed:
        assert any(Path(folder) == o or o in Path(folder).parents for o in opened), (folder, command)
    if layout.startswith("far apart"):
        assert command.startswith("tensorboard --logdir_spec ")
        assert sorted(opened) == sorted(Path(f) for f in listed)  # exactly these, nothing scanned besides
    else:
        assert opened == [runs]


def test_the_trainers_folder_written_relative_is_not_listed_beside_ours(tmp_path, monkeypatch, capsys):
    # The demo: $TENSORBOARD_LOGGING_DIR relative, our writer on the same folder made absolute.
    from hf_distprof import tensorboard
    from hf_distprof.callbacks import summary as summary_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "outputs/runs/20261127-101010_vm")
    ours = tmp_path / "outputs" / "runs" / "20261127-101010_vm"
    monkeypatch.setattr(tensorboard, "open_folders", lambda: [ours])
    callback = summary_module.RunSummaryCallback(ProfilingArguments(enable_step_timing=True))
    args = types.SimpleNamespace(report_to=["tensorboard"], output_dir="outputs")
    state = types.SimpleNamespace(is_world_process_zero=True)
    callback.on_train_end(args, state, None)
    listed, command = tensorboard_lines(capsys.readouterr().out)
    assert listed == [str(ours)]
    assert command == f"tensorboard --logdir {tmp_path / 'outputs' / 'runs'}"


def test_a_second_train_call_lists_its_own_tensorboard_folder_and_files_only(tmp_path, capsys):
    # A trial's notebook-style script called train() twice: the second block listed the first call's TensorBoard
    # folder too, and its rank0.log said "profiler wrote: " the first call's trace as well.
    from hf_distprof import ProfilerCallback, tensorboard
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="run",
                              profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=1)
    timer, summary, profiler = StepTimerCallback(args), RunSummaryCallback(args), ProfilerCallback(args)
    try:
        for _ in range(2):
            fake_trainer.run([profiler, timer, summary], 3, tmp_path)
        listed, _ = tensorboard_lines(summary.printed)
        assert [Path(p).name for p in listed] == ["hf_distprof_run-1"]
        assert [p.parent.name for p in profiler.written] == ["run-1", "run-1"]  # its trace and summary
    finally:
        tensorboard.close_writers()
    capsys.readouterr()
