"""ProfilerCallback on CPU, in-process: window names, step events, cut-short windows, failures."""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import TrainerCallback

from hf_distprof import ProfilerCallback, ProfilingArguments
from hf_distprof.callbacks.profiler import callback as profiler_module
from hf_distprof.callbacks.profiler.schedule import schedule_warning, traced_steps

from ..conftest import REPO_ROOT
from . import fake_trainer

# A fixed host name, so that expected file names are written out rather than computed by the code under test
# (rank 3 on another host: test_rank_identity).
HOST = "node-0"


@pytest.fixture(autouse=True)
def fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"{HOST}.cluster.local")


def prof_args(tmp_path: Path, **kw) -> ProfilingArguments:
    return ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "traces"),
                              profiler_record_shapes=False, **kw)


def profiler_steps(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))


def files(run_dir: Path) -> list[str]:
    """The run folder's files, the per-rank log (tested in test_paths) and the run manifest (test_manifest) left out."""
    return sorted(p.name for p in run_dir.iterdir() if not p.name.endswith(".log") and "manifest" not in p.name)


# Written at train start by every run whose callbacks see a model (hf_distprof.callbacks.parallelism).
PARALLELISM = "parallelism.json"


@pytest.mark.parametrize(
    ("schedule", "max_steps", "windows"),
    [
        (dict(profiler_wait_steps=1, profiler_warmup_steps=1, profiler_active_steps=2), 6, [(3, 4)]),
        (dict(profiler_skip_first=2, profiler_wait_steps=0, profiler_warmup_steps=1, profiler_active_steps=1), 6,
         [(4, 4)]),
        (dict(profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=1, profiler_repeat=2), 10,
         [(2, 2), (4, 4)]),
        # repeat 0 = until the end; the third window (8-9) is cut short by the end of training at step 8.
        (dict(profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=2, profiler_repeat=0), 8,
         [(2, 3), (5, 6), (8, 8)]),
    ],
    ids=["one-window", "skip-first", "repeat-2", "repeat-until-end"],
)
def test_each_window_writes_one_trace_and_summary_named_by_its_steps(tmp_path, schedule, max_steps, windows):
    import warnings

    import torch.profiler.profiler as torch_profiler

    cb = ProfilerCallback(prof_args(tmp_path, **schedule))
    # torch's advice at a second window's start ("set acc_events=True", once per process) is not for our users: each
    # window is exported at its end (a trial: every rank printed it with --profiler-repeat 3).
    torch_profiler._WARNINGS_SHOWN.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fake_trainer.run([cb], max_steps, tmp_path)
    assert not [w for w in caught if "Profiler clears events" in str(w.message)]
    expected = []
    for first, last in windows:
        expected += [f"rank0_{HOST}_step{first}-{last}.pt.trace.json.gz",
                     f"rank0_{HOST}_step{first}-{last}.pt.trace.json.gz.compact.msgpack",
                     f"rank0_{HOST}_step{first}-{last}_summary.txt"]
    assert cb.run_dir is not None
    assert files(cb.run_dir) == sorted([*expected, PARALLELISM])
    for first, last in windows:
        trace = cb.run_dir / f"rank0_{HOST}_step{first}-{last}.pt.trace.json.gz"
        # ProfilerStep numbers are the Trainer's global steps; each recorded step appears exactly once.
        assert profiler_steps(trace) == sorted(f"ProfilerStep#{s}" for s in range(first, last + 1))
    summary = (cb.run_dir / f"rank0_{HOST}_step{windows[0][0]}-{windows[0][1]}_summary.txt").read_text()
    assert "Top 25 operators by self CPU time (hf_distprof's own ranges left out)" in summary
    assert "aten::addmm" in summary and "hf_distprof/" not in summary


def test_idle_steps_before_a_window_take_the_short_path_and_the_window_still_opens(tmp_path, monkeypatch):
    # 300 steps skipped: the flags' schedule is looked ahead 256 steps at a time, so the window past the second look
    # opens where the schedule says, and the steps before it skip the schedule's calls.
    cb = ProfilerCallback(prof_args(tmp_path, profiler_skip_first=300, profiler_wait_steps=1, profiler_warmup_steps=0,
                                    profiler_active_steps=1))
    advanced = []
    advance = profiler_module.ProfilerCallback._advance
    monkeypatch.setattr(profiler_module.ProfilerCallback, "_advance",
                        lambda self, prof: (advanced.append(prof.step_num), advance(self, prof))[1])
    fake_trainer.run([cb], 303, tmp_path)
    assert cb.run_dir is not None
    trace = cb.run_dir / f"rank0_{HOST}_step302-302.pt.trace.json.gz"
    assert profiler_steps(trace) == ["ProfilerStep#302"]
    # The full path at step 1 (into step 2, then one look ahead: idle through 258), at 258 (idle through 300), then on
    # the window's eve (301: step() into it; 302's export takes the record-and-save branch; 303 is the last step).
    assert advanced == [1, 258, 301]


def test_run_folders_never_collide(tmp_path):
    a, b = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=0, profiler_warmup_steps=0,
                                      profiler_active_steps=1, profiler_run_name="exp")), None
    fake_trainer.run([a], 2, tmp_path)
    b = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=0, profiler_warmup_steps=0,
                                   profiler_active_steps=1, profiler_run_name="exp"))
    fake_trainer.run([b], 2, tmp_path)
    assert a.run_dir is not None and b.run_dir is not None
    assert (a.run_dir.name, b.run_dir.name) == ("exp", "exp-1")
    assert files(a.run_dir) == files(b.run_dir) == [PARALLELISM, f"rank0_{HOST}_step1-1.pt.trace.json.gz",
                                                    f"rank0_{HOST}_step1-1.pt.trace.json.gz.compact.msgpack",
                                                    f"rank0_{HOST}_step1-1_summary.txt"]


def test_close_mid_window_flushes_the_recorded_steps(tmp_path):
    cb = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=1, profiler_warmup_steps=1, profiler_active_steps=3))
    fake_trainer.run([cb], 10, tmp_path, stop_after=4)  # steps 3-5 are active; training "dies" after step 4
    cb.close()  # what the atexit hook and the SIGTERM handler call
    assert cb.run_dir is not None
    trace = cb.run_dir / f"rank0_{HOST}_step3-4.pt.trace.json.gz"
    assert files(cb.run_dir) == [PARALLELISM, trace.name, trace.name + ".compact.msgpack",
                                 f"rank0_{HOST}_step3-4_summary.txt"]
    # Step 5 had begun when training died: its partial record is kept too.
    assert profiler_steps(trace) == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    # The trace names itself by its file, not by the hidden temporary file it was written to first.
    with gzip.open(trace, "rt") as fh:
        assert json.load(fh)["traceName"] == str(trace)
    cb.close()  # idempotent
    # The analysis reads the steps the name says: step 5 never ran (a trial's "median step" of 1.5 ms, or a 633 ms
    # wait for a dead peer), from the compact file and from the trace alike.
    from hf_distprof.analysis import AnalysisOptions, analyze_paths

    for compact in (True, False):
        (rank,) = analyze_paths([trace], AnalysisOptions(workers=1), read_compact=compact).ranks
        assert [s.step for s in rank.steps] == [3, 4], compact


def test_closing_before_the_window_writes_nothing(tmp_path):
    cb = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=5))
    fake_trainer.run([cb], 3, tmp_path)
    assert cb.run_dir is not None and files(cb.run_dir) == [PARALLELISM]


def test_ranks_outside_profile_ranks_build_no_profiler(tmp_path):
    cb = ProfilerCallback(prof_args(tmp_path, profile_ranks="1,2", profiler_wait_steps=0, profiler_warmup_steps=0))
    fake_trainer.run([cb], 4, tmp_path, end=False)
    assert cb.prof is None
    assert cb.run_dir is not None and files(cb.run_dir) == [PARALLELISM]


def test_a_failed_export_is_one_warning_and_training_goes_on(tmp_path, caplog):
    cb = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=1, profiler_warmup_steps=0,
                                    profiler_active_steps=1, profiler_repeat=2))
    args = fake_trainer.training_args(tmp_path)
    state = fake_trainer.TrainerState()
    state.max_steps = 5
    cb.on_train_begin(args, state, fake_trainer.TrainerControl())
    assert cb.run_dir is not None
    shutil.rmtree(cb.run_dir)  # the folder vanishes (unmounted, cleaned up): nowhere to write
    cb.run_dir.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        for step in range(1, 6):
            state.global_step = step
            cb.on_step_end(args, state, fake_trainer.TrainerControl())
    warnings = [r.getMessage() for r in caplog.records if "could not write profiler trace" in r.getMessage()]
    # Two windows (steps 2 and 4), two failed exports, one warning each, no exception.
    assert len(warnings) == 2
    assert "training goes on" in warnings[0] and f"rank0_{HOST}_step2-2" in warnings[0]
    assert cb._failed_exports == 2 and cb.written == []
    # This rank's part of the run manifest claims no window it did not write.
    assert cb._manifest is not None and cb._manifest.part["windows"] == []


def test_schedule_warning_texts():
    args = ProfilingArguments()  # first active step = 0 + 5 + 2 + 1 = 8, 3 active steps: 8-10
    assert schedule_warning(args, 10) is None
    nothing = schedule_warning(args, 7)
    assert nothing is not None and "record nothing" in nothing and "first active step is step 8" in nothing
    cut = schedule_warning(args, 9)
    assert cut is not None and "steps 8-10" in cut and "steps 8-9 only" in cut
    # Resumed from step 30: the schedule counts from there (a trial's resumed runs had no warning at all).
    assert schedule_warning(args, 40, offset=30) is None
    assert schedule_warning(args, 36, offset=30) == (
        "the profiler will record nothing: training stops at step 36 but the first active step is step 38 (30, where "
        "training resumed, + --profiler-skip-first 0 + --profiler-wait-steps 5 + --profiler-warmup-steps 2 + 1). "
        "Lower those flags or raise --max-steps; the schedule is left as given.")
    assert schedule_warning(args, 39, offset=30) == ("the profiler window is cut short: it records steps 38-40 but "
                                                    "training stops at step 39; the trace will hold steps 38-39 only.")
    # --profiler-repeat 3 (a trial: window 2 cut short and window 3 never started, nothing said). Windows record
    # steps 13-16, 29-32 and 45-48 (a cycle of 10 + 2 + 4 steps).
    three = ProfilingArguments(enable_profiling=True, profiler_repeat=3, profiler_wait_steps=10,
                               profiler_warmup_steps=2, profiler_active_steps=4)
    assert schedule_warning(three, 48) is None
    assert schedule_warning(three, 30) == (
        "--profiler-repeat 3: training stops at step 30, so window 2 is cut short (it records steps 29-32; the trace "
        "will hold steps 29-30) and window 3 records nothing; the 3 windows need 48 steps. Raise --max-steps or lower "
        "--profiler-repeat.")
    assert "so windows 2-3 record nothing;" in (schedule_warning(three, 28) or "")
    # The first window cut short too: the others said with it (a review).
    assert "so window 1 is cut short (it records steps 13-16; the trace will hold step 13) and windows 2-3 record " \
        "nothing;" in (schedule_warning(three, 13) or "")
    assert "window 3 is cut short (it records steps 45-48; the trace will hold step 45);" in (
        schedule_warning(three, 45) or "")
    assert schedule_warning(ProfilingArguments(enable_profiling=True, profiler_repeat=0), 12) is None  # until the end


def test_traced_steps_follow_the_schedule():
    args = ProfilingArguments(enable_profiling=True, profiler_wait_steps=2, profiler_warmup_steps=1,
                              profiler_active_steps=3, profiler_repeat=2)
    traced = traced_steps(args)
    # wait 1-2, warmup 3, active 4-6; wait 7-8, warmup 9, active 10-12; then nothing.
    assert [s for s in range(1, 20) if traced(s)] == [3, 4, 5, 6, 9, 10, 11, 12]
    resumed = traced_steps(args, offset=100)  # resumed at global_step 100: the schedule starts after it
    assert [s for s in range(95, 120) if resumed(s)] == [103, 104, 105, 106, 109, 110, 111, 112]
    assert not any(traced_steps(ProfilingArguments())(s) for s in range(1, 50))  # profiling off
    # Training ends before the first active step (step 4; resumed at 100: 104): no profiler, no step traced.
    assert [s for s in range(1, 20) if traced_steps(args, max_steps=4)(s)] == [3, 4, 5, 6, 9, 10, 11, 12]
    assert not any(traced_steps(args, max_steps=3)(s) for s in range(1, 20))
    assert not any(traced_steps(args, offset=100, max_steps=103)(s) for s in range(95, 120))
    # --profile-ranks naming no rank of the world: no rank traces, no step is the profiler's (a trial: "the profiler
    # slows the steps it traces by 2.00x" on a 2-rank run with --profile-ranks 5 and no trace).
    five = ProfilingArguments(enable_profiling=True, profiler_wait_steps=2, profiler_warmup_steps=1,
                              profiler_active_steps=3, profile_ranks="5")
    assert not any(traced_steps(five, world_size=2)(s) for s in range(1, 20))
    assert [s for s in range(1, 8) if traced_steps(five, world_size=8)(s)] == [3, 4, 5, 6]


def test_schedule_that_never_reaches_active_warns_once_and_keeps_the_schedule(tmp_path, caplog):
    cb = ProfilerCallback(prof_args(tmp_path))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 3, tmp_path)
    hits = [r for r in caplog.records if "record nothing" in r.getMessage()]
    assert len(hits) == 1
    assert cb.args.profiler_wait_steps == 5 and cb.args.profiler_warmup_steps == 2
    # No profiler was started for warm-up steps that no window follows (a trial's max_steps=7: steps 6-7 warmed up,
    # and step 7's profiler start and stop read as a 231% imbalance).
    assert cb.prof is None and cb.run_dir is not None and files(cb.run_dir) == [PARALLELISM]


def test_a_run_too_short_for_the_schedule_profiles_only_the_windows_asked_for(tmp_path):
    # --profile-on-demand keeps the profiler for its windows, but the schedule's warm-up (steps 6-7 of a 7-step run)
    # is not spent: the step timer, which counts no step of it as traced, and the profiler agree.
    cb = ProfilerCallback(prof_args(tmp_path, profile_on_demand=True))
    actions: dict[int, str] = {}

    class Spy(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if cb.prof is not None:
                actions[state.global_step + 1] = cb.prof.current_action.name

    fake_trainer.run([cb, Spy()], 7, tmp_path)
    assert set(actions.values()) == {"NONE"} and sorted(actions) == list(range(1, 8))
    assert not any(traced_steps(cb.args, 0, 7)(s) for s in range(1, 8))


CRASH_SCRIPT = textwrap.dedent(
    """
    import os, signal, socket, sys
    from pathlib import Path
    socket.gethostname = lambda: {host!r}
    sys.path.insert(0, {tests!r})
    from unit import fake_trainer
    from hf_distprof import ProfilerCallback, ProfilingArguments

    out = Path(sys.argv[1])
    cb = ProfilerCallback(ProfilingArguments(enable_profiling=True, profiler_output_dir=str(out),
                          profiler_run_name="run", profiler_wait_steps=1, profiler_warmup_steps=1,
                          profiler_active_steps=5, profiler_record_shapes=False))
    fake_trainer.run([cb], 20, out, stop_after=4)
    if sys.argv[2] == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    raise RuntimeError("boom in step 5")
    """
)


@pytest.mark.parametrize("how", ["sigterm", "exception"])
def test_sigterm_or_exception_mid_window_flushes_the_trace(tmp_path, how):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT.format(tests=str(REPO_ROOT / "tests"), host=HOST))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), how], capture_output=True,
                          text=True, env=env, timeout=120)
    if how == "sigterm":
        assert proc.returncode == -signal.SIGTERM, proc.stderr
    else:
        assert proc.returncode == 1 and "boom in step 5" in proc.stderr
    run_dir = tmp_path / "out" / "run"
    # The compact summary too: the signal's handler waits for its thread. The exception leaves its traceback, the
    # signal when and where it stopped the rank.
    assert files(run_dir) == sorted([PARALLELISM, *(["rank0_exception.txt"] if how == "exception" else []),
                                     *(["rank0_stopped.txt"] if how == "sigterm" else []),
                                     f"rank0_{HOST}_step3-4.pt.trace.json.gz",
                                     f"rank0_{HOST}_step3-4.pt.trace.json.gz.compact.msgpack",
                                     f"rank0_{HOST}_step3-4_summary.txt"])
    assert profiler_steps(run_dir / f"rank0_{HOST}_step3-4.pt.trace.json.gz")[:2] == ["ProfilerStep#3",
                                                                                      "ProfilerStep#4"]


def test_activities_are_cpu_plus_cuda_only_when_the_build_and_a_device_have_it(monkeypatch):
    from torch.profiler import ProfilerActivity

    monkeypatch.setattr(profiler_module.torch.cuda, "is_available", lambda: False)
    assert profiler_module.supported_activities() == [ProfilerActivity.CPU]
    monkeypatch.setattr(profiler_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiler_module.torch.profiler, "supported_activities",
                        lambda: {ProfilerActivity.CPU, ProfilerActivity.CUDA})
    assert profiler_module.supported_activities() == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    # A CPU-only build with a (fake) device: asking for CUDA would only warn, so it is not asked for.
    monkeypatch.setattr(profiler_module.torch.profiler, "supported_activities", lambda: {ProfilerActivity.CPU})
    assert profiler_module.supported_activities() == [ProfilerActivity.CPU]


@pytest.mark.gpu
def test_gpu_trace_has_kernels_and_the_summary_ranks_by_device_time(tmp_path):
    cb = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=1, profiler_warmup_steps=1, profiler_active_steps=2))
    fake_trainer.run([cb], 4, tmp_path, device="cuda")
    assert cb.run_dir is not None
    trace = cb.run_dir / f"rank0_{HOST}_step3-4.pt.trace.json.gz"
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    summary = (cb.run_dir / f"rank0_{HOST}_step3-4_summary.txt").read_text()
    assert "Top 25 operators by self device time" in summary


def test_after_close_the_scripts_own_signal_handlers_are_back(tmp_path):
    import signal as signal_module

    def mine(signum, frame):
        pass

    before = {s: signal_module.signal(s, mine) for s in (signal_module.SIGTERM, signal_module.SIGINT)}
    try:
        cb = ProfilerCallback(prof_args(tmp_path, profiler_wait_steps=1, profiler_warmup_steps=1,
                                        profiler_active_steps=2))
        fake_trainer.run([cb], 4, tmp_path)  # close() at train end runs inside a deferred block
        assert signal_module.getsignal(signal_module.SIGTERM) is mine
        assert signal_module.getsignal(signal_module.SIGINT) is mine
    finally:
        for s, handler in before.items():
            signal_module.signal(s, handler)


def test_the_window_summary_leaves_out_hf_distprof_s_own_ranges(tmp_path):
    # A trial: "hf_distprof/backward 34.69%" opened the table of operators by self CPU time (the step timer's phase
    # ranges: spans whose self time is the waits between ops).
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    args = prof_args(tmp_path, profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=2)
    cb = ProfilerCallback(args)
    timer = StepTimerCallback(args)
    cb.step_timer = timer
    fake_trainer.run([cb, timer], 4, tmp_path)
    assert cb.run_dir is not None
    trace = cb.run_dir / f"rank0_{HOST}_step2-3.pt.trace.json.gz"
    with gzip.open(trace, "rt") as fh:
        names = {e.get("name", "") for e in json.load(fh)["traceEvents"]}
    assert any(name.startswith("hf_distprof/") for name in names)  # the ranges are in the trace
    summary = (cb.run_dir / f"rank0_{HOST}_step2-3_summary.txt").read_text()
    assert "aten::addmm" in summary and "hf_distprof/" not in summary
