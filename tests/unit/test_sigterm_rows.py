"""A rank stopped by SIGTERM with no profiler window holding it (the step timer or the memory logger alone, a rank
outside ``--profile-ranks``; torchrun stops the other ranks so when one fails) keeps the rows it timed: SIGTERM's
default action runs what the callbacks registered first (:func:`hf_distprof.core.signals.at_default_death`), and
leaves no empty crash file. A script's own handler is left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ..conftest import REPO_ROOT

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from unit import fake_trainer
    from hf_distprof import ProfilingArguments, build_callbacks

    out, how = Path(sys.argv[1]), sys.argv[2]
    if how == "own-handler":
        signal.signal(signal.SIGTERM, lambda signum, frame: print("the script's handler", flush=True))
    profiled = how == "profile-ranks"  # --enable-profiling --profile-ranks 1: this rank 0 takes no window
    args = ProfilingArguments(enable_step_timing=True, enable_memory_logging=True, memory_log_steps=1,
                              profiler_output_dir=str(out), profiler_run_name="run", enable_profiling=profiled,
                              profile_ranks="1" if profiled else None)
    fake_trainer.run(build_callbacks(args), 20, out, stop_after=4)
    if how == "stuck":  # the main thread blocked in native code (a collective waiting for a dead rank)
        import ctypes
        libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeros
        libc.pthread_mutex_lock(mutex)
        print("blocked", flush=True)
        libc.pthread_mutex_lock(mutex)  # again: blocks for good, and no signal interrupts it
    if how == "fork":  # a forked child (a multiprocessing worker) stopped by SIGTERM: the parent's rows are not its own
        child = os.fork()
        if child == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(7)
        print("child", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    print("survived the signal", flush=True)
    """
)


def _run(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "stopped.py"
    script.write_text(SCRIPT.format(tests=str(REPO_ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, str(script), str(tmp_path / "out"), how], capture_output=True, text=True,
                          env=env, timeout=180)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("how", ["default", "profile-ranks"])
def test_sigterm_without_a_profiler_keeps_the_timed_rows_and_leaves_no_crash_file(tmp_path: Path, how: str) -> None:
    proc = _run(tmp_path, how)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert "survived" not in proc.stdout
    run = tmp_path / "out" / "run"
    # (It lost every row since the last logging step, and left an empty rank0_crash.txt: "only a rank that crashed".)
    assert _steps(run / "timing_rank0.jsonl") == [1, 2, 3, 4]
    assert _steps(run / "memory_rank0.jsonl") == [1, 2, 3, 4]
    assert not (run / "rank0_crash.txt").exists()


def test_sigterm_on_a_rank_stuck_in_native_code_still_writes_the_rows_and_ends_it(tmp_path: Path) -> None:
    # The stand-in is a Python handler, which runs only when the main thread runs Python: a rank blocked in a
    # collective would have waited for the launcher's SIGKILL (30 s later, exit -9) instead of ending at once.
    script = tmp_path / "stopped.py"
    script.write_text(SCRIPT.format(tests=str(REPO_ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out"), "stuck"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "blocked\n"
        time.sleep(0.5)  # into the native call
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM
        assert time.monotonic() - started < 15  # the grace, not a launcher's SIGKILL
    finally:
        proc.kill()
    run = tmp_path / "out" / "run"
    assert _steps(run / "timing_rank0.jsonl") == [1, 2, 3, 4] and _steps(run / "memory_rank0.jsonl") == [1, 2, 3, 4]


def test_a_forked_child_stopped_by_sigterm_writes_none_of_the_parent_s_rows(tmp_path: Path) -> None:
    proc = _run(tmp_path, "fork")
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0] == "child -15"  # the child ended by the signal, as without hf_distprof
    run = tmp_path / "out" / "run"
    assert _steps(run / "timing_rank0.jsonl") == [1, 2, 3, 4]  # once: by the parent (the child wrote them too)
    assert _steps(run / "memory_rank0.jsonl") == [1, 2, 3, 4]


PROFILED_FORK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from unit import fake_trainer
    from hf_distprof import ProfilingArguments, build_callbacks

    out = Path(sys.argv[1])
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(out), profiler_run_name="run",
                              profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=3,
                              profiler_record_shapes=False)
    fake_trainer.run(build_callbacks(args), 6, out, stop_after=2)  # inside the window of steps 2-4
    child = os.fork()
    if child == 0:  # a DataLoader worker stopped with the job
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(7)
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    print(status, sorted(p.name for p in (out / "run").glob("*.pt.trace.json.gz")), flush=True)
    os._exit(0)  # the rank itself exports nothing here
    """
)


def test_a_forked_child_of_a_profiled_rank_exports_none_of_its_windows(tmp_path: Path) -> None:
    # The review: the profiler's SIGTERM handler ran in forked DataLoader workers too, exporting the rank's window
    # under the rank's name from a copy of its profiler.
    script = tmp_path / "forks.py"
    script.write_text(PROFILED_FORK.format(tests=str(REPO_ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.stdout.split(" ", 1) == ["-15", "[]\n"], proc.stdout + proc.stderr[-2000:]


def test_a_script_s_own_sigterm_handler_is_left_alone(tmp_path: Path) -> None:
    proc = _run(tmp_path, "own-handler")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[:2] == ["the script's handler", "survived the signal"]


def test_sigterm_s_default_action_is_back_when_nothing_guarded_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_distprof.core import signals

    monkeypatch.setattr(signals, "_GUARDED", [])  # (what earlier tests in this process left registered)
    monkeypatch.setattr(signals, "_BEFORE_DEATH", [])
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        calls: list[str] = []

        def rows() -> None:
            calls.append("rows")

        signals.at_default_death(lambda: None)  # unguarded (as the crash file's tidying): no stand-in
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signals.at_default_death(rows, guard=True)
        assert signal.getsignal(signal.SIGTERM) is signals._flush_then_die
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the profiler's close puts the default back)
        signals.rearm()
        assert signal.getsignal(signal.SIGTERM) is signals._flush_then_die
        signals.forget_at_default_death(rows)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and calls == []
    finally:
        signal.signal(signal.SIGTERM, old)


def test_the_last_writes_run_one_caller_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The review: the watch thread and the main thread's handler could both write the rows at once (a main thread
    # back from a 3 s native call after the watch's 2 s grace), tearing or doubling lines.
    import threading

    from hf_distprof.core import signals

    spans: list[tuple[float, float]] = []

    def write() -> None:
        began = time.monotonic()
        time.sleep(0.2)
        spans.append((began, time.monotonic()))

    monkeypatch.setattr(signals, "_BEFORE_DEATH", [write])
    monkeypatch.setattr(signals, "_OWNER", {write: os.getpid()})
    callers = [threading.Thread(target=signals.before_default_death) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(5)
    (a0, a1), (b0, b1) = sorted(spans)
    assert len(spans) == 2 and a1 <= b0  # one after the other (each write is idempotent), never both at once
