"""hf_distprof.core.signals: SIGTERM/SIGINT wait for a write; atomic writes leave no temporary file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hf_distprof import dist, paths
from hf_distprof.core import signals

from ..conftest import REPO_ROOT


def test_a_signal_inside_the_block_reaches_the_old_handler_once_after_it():
    seen: list[tuple[int, str]] = []
    stage = "before"
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append((signum, stage)))
    try:
        with signals.deferred() as pending:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # twice: still one delivery
            stage = "inside"
            assert pending == [signal.SIGTERM] and seen == []
            stage = "after"
        assert seen == [(signal.SIGTERM, "after")]
        assert signal.getsignal(signal.SIGTERM) is not None and seen == [(signal.SIGTERM, "after")]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_without_a_signal_the_handlers_are_put_back_unchanged():
    before = {s: signal.getsignal(s) for s in signals.TERMINATION_SIGNALS}
    with signals.deferred() as pending:
        assert all(signal.getsignal(s) not in (before[s],) for s in signals.TERMINATION_SIGNALS)
    assert pending == []
    assert {s: signal.getsignal(s) for s in signals.TERMINATION_SIGNALS} == before


def test_a_handler_installed_inside_the_block_stays_and_gets_the_held_signal():
    seen: list[str] = []
    old = signal.getsignal(signal.SIGTERM)
    try:
        with signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("new"))
        assert seen == ["new"]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_nested_blocks_hand_the_signal_outwards():
    seen: list[str] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: seen.append("outer handler"))
    try:
        with signals.deferred() as outer:
            with signals.deferred() as inner:
                os.kill(os.getpid(), signal.SIGINT)
            assert inner == [signal.SIGINT] and outer == [signal.SIGINT] and seen == []
        assert seen == ["outer handler"]
    finally:
        signal.signal(signal.SIGINT, old)


def test_outside_the_main_thread_the_block_changes_nothing():
    result: dict[str, object] = {}

    def body() -> None:
        with signals.deferred() as pending:
            result["pending"] = pending
            result["handler"] = signal.getsignal(signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert result == {"pending": [], "handler": before}


WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from hf_distprof import paths
    # SIGINT as an interactive shell leaves it (KeyboardInterrupt): a shell that ignores SIGINT (a background job
    # of a script, nohup) passes SIG_IGN on to its children, and a SIGINT would then do nothing here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target = Path(sys.argv[1])
    with paths.atomic_path(target) as tmp:
        tmp.write_text("first half ")
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        with tmp.open("a") as fh:
            fh.write("second half")
    print("not reached")
    """
)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_an_atomic_write_ends_the_process_after_the_file_is_whole(tmp_path, name):
    target = tmp_path / "out" / "file.txt"
    target.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", WRITER, str(target), name], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == -getattr(signal, name), proc.stderr
    assert "not reached" not in proc.stdout
    assert target.read_text() == "first half second half"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.txt"]


def test_temporary_files_are_recognised_and_only_stale_ones_removed(tmp_path):
    run = tmp_path / "run-a"
    run.mkdir()
    with paths.atomic_path(run / "x.pt.trace.json.gz", suffix=".json.gz") as tmp:
        assert paths.is_temp_file(tmp) and tmp.name.startswith(".x.pt.trace.json.gz.")
        stale, fresh = run / tmp.name.replace(".x.", ".y."), run / tmp.name.replace(".x.", ".z.")
    stale.write_text("killed write")
    fresh.write_text("write in progress")
    old = time.time() - paths.STALE_TEMP_AGE_S - 5
    os.utime(stale, (old, old))
    keep = [run / ".hidden_config", run / "rank0_h_step1-2.pt.trace.json.gz"]
    for path in keep:
        path.write_text("user file")
    assert not any(paths.is_temp_file(p) for p in keep)
    assert paths.remove_stale_temp_files(tmp_path) == [stale]
    assert sorted(p.name for p in run.iterdir()) == sorted([fresh.name, "x.pt.trace.json.gz", *(p.name for p in keep)])


def test_a_temporary_file_of_a_dead_writer_on_this_host_goes_after_a_minute_not_an_hour(tmp_path):
    run = tmp_path / "run-a"
    run.mkdir()
    with paths.atomic_path(run / "rank0_h_step1-2.pt.trace.json.gz", suffix=".json.gz") as tmp:
        assert f".~{os.getpid()}@{dist.get_hostname()}~" in tmp.name and tmp.name.endswith(".tmp.json.gz")
        template = tmp.name
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited and reaped: no process has this pid now (pids wrap only after ~4M)
    mine = f"~{os.getpid()}@{dist.get_hostname()}~"
    files = {
        "dead": template.replace(mine, f"~{dead_pid}@{dist.get_hostname()}~"),
        "dead-but-fresh": template.replace(mine, f"~{dead_pid}@{dist.get_hostname()}~").replace(".rank0", ".rank1"),
        "alive": template.replace(mine, f"~{os.getppid()}@{dist.get_hostname()}~"),
        "other-host": template.replace(mine, f"~{dead_pid}@{dist.get_hostname()}x~"),
        "unnamed-writer": ".rank0_h_step1-2.pt.trace.json.gz.k3j2.tmp.json.gz",
    }
    for key, name in files.items():
        (run / name).write_text("killed write")
        age = 30 if key == "dead-but-fresh" else 2 * paths.DEAD_WRITER_AGE_S
        os.utime(run / name, (time.time() - age, time.time() - age))
    assert paths.remove_stale_temp_files(tmp_path) == [run / files["dead"]]
    kept = [n for k, n in files.items() if k != "dead"]
    assert sorted(p.name for p in run.iterdir()) == sorted([*kept, "rank0_h_step1-2.pt.trace.json.gz"])


def test_a_new_run_folder_clears_stale_temp_files_of_earlier_runs(tmp_path):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    leftover = earlier / ".rank0_h_step3-4.pt.trace.json.gz.abc123.tmp.json.gz"
    leftover.write_text("partial")
    old = time.time() - 2 * paths.STALE_TEMP_AGE_S
    os.utime(leftover, (old, old))
    run_dir = paths.resolve_run_dir(tmp_path, "next", owner=object())
    assert run_dir == tmp_path / "next"
    assert not leftover.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "next"]


def test_a_signal_s_arrival_is_kept_per_signal_and_forgotten_once_a_handler_took_it():
    # The review: one record for every signal (a SIGINT held after a SIGTERM overwrote it), and a SIGTERM a script's
    # handler took lent its time and stack to a later one's stop file.
    import signal as sig
    import sys

    from hf_distprof.core import signals

    frame = sys._getframe()
    signals.note_arrival(sig.SIGTERM, frame)
    first = signals.arrival(sig.SIGTERM)
    signals.note_arrival(sig.SIGINT, None)
    signals.note_arrival(sig.SIGTERM, None)  # the same SIGTERM raised again after its block: its first arrival kept
    assert signals.arrival(sig.SIGTERM) == first and first is not None
    assert first[1][-1].name == "test_a_signal_s_arrival_is_kept_per_signal_and_forgotten_once_a_handler_took_it"
    signals.forget_arrival(sig.SIGTERM)
    signals.forget_arrival(sig.SIGINT)
    assert signals.arrival(sig.SIGTERM) is None and signals.arrival(sig.SIGINT) is None
