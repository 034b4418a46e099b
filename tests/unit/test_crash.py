"""A rank that dies leaves its stack (hf_distprof.crash) and the report reads it (hf_distprof.runs.hang_report): the
file armed per run folder, removed at a clean exit when empty, a script's own faulthandler left alone; crash files
parsed (the thread that got the signal, a native thread, an empty file, a file that is no crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from hf_distprof import crash
from hf_distprof.runs.hang_report import hang_report, parse_crash, parse_exception, parse_stopped

SEGV = """Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/site-packages/hf_distprof/callbacks/profiler/compact_export.py", line 40 in _write

Current thread 0x00007f0000000002 (most recent call first):
  File "/site-packages/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "/home/me/train.py", line 17 in train_step
  File "/home/me/train.py", line 30 in <module>

Extension modules: torch._C (total: 1)
"""

ABORT_NATIVE = """Fatal Python error: Aborted

Current thread 0x00007f0000000003 (most recent call first):
  <no Python frame>

Thread 0x00007f0000000004 (most recent call first):
  File "/home/me/train.py", line 40 in <module>
"""


@pytest.fixture
def handler(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in for the faulthandler module (pytest enables the real one for itself)."""
    fake = types.SimpleNamespace(enabled=False, file=None, calls=[])
    fake.is_enabled = lambda: fake.enabled

    def enable(file, all_threads):  # type: ignore[no-untyped-def]
        fake.enabled, fake.file = True, file
        fake.calls.append(("enable", Path(file.name).name, all_threads))

    def disable():  # type: ignore[no-untyped-def]
        fake.enabled = False
        fake.calls.append(("disable",))

    fake.enable, fake.disable = enable, disable
    monkeypatch.setattr(crash, "faulthandler", fake)
    monkeypatch.setattr(crash, "_FILE", None)
    monkeypatch.setattr(crash, "_PATH", None)
    return fake


def test_the_crash_file_is_armed_per_run_folder_and_removed_when_empty(tmp_path: Path, handler) -> None:  # type: ignore[no-untyped-def]
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    assert crash.record_crashes(first, 3) == first / "rank3_crash.txt" and (first / "rank3_crash.txt").exists()
    assert handler.calls == [("enable", "rank3_crash.txt", True)]  # every thread's stack
    assert crash.record_crashes(first, 3) == first / "rank3_crash.txt" and len(handler.calls) == 1  # the same
    # A second train() in the same process takes it over; the first, empty, is gone.
    assert crash.record_crashes(second, 3) == second / "rank3_crash.txt"
    assert not (first / "rank3_crash.txt").exists() and crash.current() == second / "rank3_crash.txt"
    # A crash writes into it: at a (later, clean) exit the file stays.
    handler.file.write("Fatal Python error: Aborted\n")
    handler.file.flush()
    crash.finish()
    assert (second / "rank3_crash.txt").read_text() == "Fatal Python error: Aborted\n" and not handler.enabled
    crash.finish()  # twice: nothing to do


def test_a_scripts_own_faulthandler_is_left_alone_and_an_unwritable_folder_is_one_warning(tmp_path: Path,
                                                                                           handler) -> None:  # type: ignore[no-untyped-def]
    handler.enabled = True  # python -X faulthandler: the user's, to stderr
    assert crash.record_crashes(tmp_path, 0) is None and handler.calls == []
    handler.enabled = False
    assert crash.record_crashes(tmp_path / "missing", 0) is None and handler.calls == []


def test_a_crash_file_says_what_killed_the_rank_and_where(tmp_path: Path) -> None:
    (tmp_path / "rank1_crash.txt").write_text(SEGV)
    got = parse_crash(tmp_path / "rank1_crash.txt")
    assert got is not None and (got.rank, got.fatal, got.signal) == (1, "Segmentation fault", "SIGSEGV")
    assert str(got.dump.user_frame) == "/home/me/train.py:17 in train_step"  # the thread that got the signal
    report = hang_report(tmp_path)  # crash files alone: no hang dump needed
    assert report.lines == [
        f"crash report: {tmp_path} (1 rank(s) died of a fatal signal)",
        "rank 1 died of Segmentation fault (SIGSEGV) at /home/me/train.py:17 in train_step; every thread's stack: "
        "rank1_crash.txt",
        "  innermost frame: /site-packages/torch/autograd/graph.py:829 in _engine_run_backward",
    ]
    # A C++ thread's abort: no Python frame on the thread that died.
    (tmp_path / "rank0_crash.txt").write_text(ABORT_NATIVE)
    (tmp_path / "rank2_crash.txt").write_text("")  # killed outright (SIGKILL) or never crashed: nothing to say
    report = hang_report(tmp_path)
    assert sorted(report.crashes) == [0, 1]
    assert report.lines[1] == ("rank 0 died of Aborted (SIGABRT) in a thread without Python frames (native code: a C++ "
                               "thread, a library's own); every thread's stack: rank0_crash.txt")


def test_no_crash_and_no_hang_dump_is_an_error_naming_both_and_a_bad_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "rank0_crash.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no rank\\*_crash.txt with a stack"):
        hang_report(tmp_path)
    (tmp_path / "rank1_crash.txt").write_text("hello\n")
    with pytest.raises(ValueError, match="rank1_crash.txt: no 'Fatal Python error' line"):
        hang_report(tmp_path)
    with pytest.raises(ValueError, match="not a crash file"):
        parse_crash(tmp_path / "crash.txt")


RAISES = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from hf_distprof import crash

    def collate(batch):
        raise RuntimeError("boom in step 5")

    crash.record_crashes(Path(sys.argv[1]), 1)
    if sys.argv[2] == "interrupt":
        raise KeyboardInterrupt
    collate([1, 2])
    """
)


@pytest.mark.parametrize("how", ["raise", "interrupt"])
def test_an_uncaught_exception_leaves_its_traceback_and_the_report_names_the_rank_that_raised_first(
        tmp_path: Path, how: str) -> None:
    # A trial: rank 1 raised in its collator; its traceback reached only torchrun's console, rank1.log was empty and
    # hang-report found nothing to say.
    script = tmp_path / "train.py"
    script.write_text(RAISES)
    env = {**os.environ, "PYTHONPATH": str(Path(crash.__file__).parents[1])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), how], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == (1 if how == "raise" else -2) and "Traceback" in proc.stderr  # printed as before
    if how == "interrupt":  # a stop, not a crash
        assert not (tmp_path / "rank1_exception.txt").exists() and not (tmp_path / "rank1_crash.txt").exists()
        return
    assert not (tmp_path / "rank1_crash.txt").exists()  # (no fatal signal: emptied and removed at exit)
    text = (tmp_path / "rank1_exception.txt").read_text()
    assert text.splitlines()[0].startswith("hf_distprof: rank 1 on host ")
    assert text.endswith("RuntimeError: boom in step 5\n") and 'raise RuntimeError("boom in step 5")' in text
    raised = parse_exception(tmp_path / "rank1_exception.txt")
    assert raised is not None and raised.exception == "RuntimeError: boom in step 5"
    assert (raised.dump.user_frame.file, raised.dump.user_frame.line, raised.dump.user_frame.func) == (
        str(script), 7, "collate")
    # Rank 0 raised 0.25 s later (its collective failed when rank 1 died): rank 1 is named first.
    head = text.splitlines()[0]
    host = head.split(" on host ", 1)[1].split(" ", 1)[0]
    later = float(head.rsplit("(unix ", 1)[1].rstrip(")")) + 0.25

    def rank0_raised(on: str) -> None:
        (tmp_path / "rank0_exception.txt").write_text(
            f"hf_distprof: rank 0 on host {on} ended by an uncaught exception at 2026-11-29T15:50:01.250000 (unix "
            f"{later:.6f})\nTraceback (most recent call last):\n  File \"/home/me/train.py\", line 30, in <module>\n"
            "    trainer.train()\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n")

    rank0_raised(host)
    lines = hang_report(tmp_path).lines
    assert lines[0] == f"exception report: {tmp_path} (2 rank(s) ended by an uncaught exception)"
    assert lines[1].startswith(f"rank 1 raised RuntimeError: boom in step 5 at {script}:7 in collate: raise "
                               "RuntimeError(\"boom in step 5\") (first, ")
    assert lines[2].startswith("rank 0 raised RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by "
                               "peer at /home/me/train.py:30 in <module>: trainer.train() (0.25 s after rank 1 "
                               "raised, ")
    assert lines[3] == ("=> rank 1 raised first: the others' exceptions followed it (a rank that dies fails its "
                        "peers' collectives)")
    # On two hosts the order is each host's clock: said so.
    rank0_raised(host + "-other")
    assert hang_report(tmp_path).lines[3] == (
        "=> rank 1 raised first by its host's clock; the ranks are on 2 hosts, whose clocks can differ by more than "
        "these gaps: read the exceptions, the first cause is the one that is not a failed collective")
    # A rank that died of a signal too: its time is unknown, so no rank is named first.
    (tmp_path / "rank2_crash.txt").write_text(SEGV)
    assert not any(line.startswith("=>") for line in hang_report(tmp_path).lines)


FORKS = textwrap.dedent(
    """
    import faulthandler, os, signal, sys
    from pathlib import Path
    from hf_distprof import crash

    crash.record_crashes(Path(sys.argv[1]), 1)
    child = os.fork()
    if child == 0:  # a DataLoader worker: its own fatal signal is not the rank's crash
        os._exit(0 if crash.current() is None and not faulthandler.is_enabled() else 3)
    print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), crash.current().name, faulthandler.is_enabled())
    """
)


def test_a_forked_worker_does_not_write_into_the_rank_s_crash_file(tmp_path: Path) -> None:
    # The review: faulthandler stayed pointed at rank1_crash.txt in forked children, so a worker's segfault read as
    # the rank's crash (and the file was kept, the analysis saying the rank crashed).
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    env = {**os.environ, "PYTHONPATH": str(Path(crash.__file__).parents[1])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.stdout.split() == ["0", "rank1_crash.txt", "True"], proc.stderr[-2000:]


def test_a_rank_killed_without_a_word_is_named_before_the_exception_its_death_caused(tmp_path: Path, monkeypatch
                                                                                     ) -> None:
    # A trial: rank 1 killed by SIGKILL; rank 0's collective then failed ("Connection reset by peer"), and hang-report
    # named rank 0's exception "first" and rank 1 nowhere.
    import json

    from hf_distprof.core.files import get_hostname
    from hf_distprof.runs import hang_report as module

    def part(rank: int, status: str, pid: int = 999_999_999, host: str = get_hostname()) -> None:
        (tmp_path / f"manifest_rank{rank}_{host}.json").write_text(json.dumps(
            {"format": "hf_distprof.manifest.part", "version": 1, "rank": rank, "world_size": 2, "host": host,
             "pid": pid, "status": status}))

    part(0, "running")
    part(1, "running")
    (tmp_path / "rank0_exception.txt").write_text(
        "hf_distprof: rank 0 on host node0 ended by an uncaught exception at 2026-11-29T15:50:01.250000 (unix "
        "1795000000.250000)\nTraceback (most recent call last):\n  File \"/home/me/train.py\", line 30, in <module>\n"
        "    trainer.train()\nRuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection reset by peer\n")
    (tmp_path / "rank1_crash.txt").write_text("")  # armed at train start; SIGKILL leaves it empty
    report = hang_report(tmp_path)
    assert report.silent == {1: "killed"}
    assert report.lines == [
        f"exception report: {tmp_path} (1 rank(s) ended by an uncaught exception)",
        "rank 0 raised RuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection reset by peer at "
        "/home/me/train.py:30 in <module>: trainer.train() (2026-11-29T15:50:01.250000); its traceback: "
        "rank0_exception.txt",
        "rank 1 never reached train end and left no exception, crash stack or hang dump: killed without a chance to "
        "write: SIGKILL (the out-of-memory killer, or a launcher's or scheduler's kill; see dmesg and the launcher's "
        "log)",
        "=> look at rank 1 first: the exceptions of the others, if any, can be what followed (a rank that dies fails "
        "its peers' collectives: \"Connection reset by peer\", \"Connection closed\")",
    ]
    # The manifest writes the short host name: a host with a dotted name is this host all the same (a review: every
    # rank read as dead there), and a rank still running on it is not called dead.
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "vm.cluster.local")
    part(1, "running", os.getpid(), host="vm")
    assert module.get_hostname() == "vm" and hang_report(tmp_path).silent == {}
    (tmp_path / "manifest_rank1_vm.json").unlink()
    monkeypatch.undo()
    part(1, "running", os.getpid())
    assert hang_report(tmp_path).silent == {}
    # On another host its process cannot be checked: killed, or still running.
    (tmp_path / f"manifest_rank1_{get_hostname()}.json").unlink()
    part(1, "running", host="elsewhere")
    assert hang_report(tmp_path).silent == {1: "killed or running"}
    assert "or still running (its process cannot be checked: on another host, or no manifest part gives its pid" \
        in hang_report(tmp_path).text
    # Without a manifest part (a run without the profiler writes none), the empty crash file is the evidence.
    (tmp_path / "manifest_rank1_elsewhere.json").unlink()
    assert hang_report(tmp_path).silent == {1: "killed or running"}
    # SIGTERM's default action tidies the crash file first: stopped, most often by the launcher after another rank
    # failed (a review: such ranks were named first, "look at ranks 0, 1, 3 first", where rank 2 raised).
    part(1, "running")
    (tmp_path / "rank1_crash.txt").unlink()
    report = hang_report(tmp_path)
    assert report.silent == {1: "stopped"}
    assert "stopped by a signal (SIGTERM: a launcher stops the other ranks once one fails; or the scheduler) or " \
           "os._exit; its last words are in rank1.log" in report.text
    assert not any(line.startswith("=>") for line in report.lines)
    part(1, "finished")
    assert hang_report(tmp_path).silent == {}
    # Without any rank that ended otherwise, no rank is called dead (a run still going): no report.
    (tmp_path / "rank0_exception.txt").unlink()
    part(1, "running")
    with pytest.raises(FileNotFoundError):
        hang_report(tmp_path)


def test_ranks_the_launcher_stopped_after_one_raised_leave_that_one_named_first(tmp_path: Path) -> None:
    import json

    for rank in range(4):
        (tmp_path / f"manifest_rank{rank}_n.json").write_text(json.dumps(
            {"rank": rank, "world_size": 4, "host": "n", "pid": 999_999_999, "status": "running"}))
    (tmp_path / "rank2_exception.txt").write_text(
        "hf_distprof: rank 2 on host n ended by an uncaught exception at 2026-11-29T15:50:01.250000 (unix "
        "1795000000.250000)\nTraceback (most recent call last):\n  File \"/home/me/train.py\", line 7, in collate\n"
        "    raise RuntimeError('boom')\nRuntimeError: boom\n")
    report = hang_report(tmp_path)
    assert report.silent == {0: "stopped", 1: "stopped", 3: "stopped"}
    assert not any("look at" in line for line in report.lines)


STOPS = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from hf_distprof import crash
    from hf_distprof.core import signals

    crash.record_crashes(Path(sys.argv[1]), 1)
    signals.at_default_death(lambda: None, guard=True)  # a callback's rows to write (the step timer's): the stand-in

    def train_step():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)

    train_step()
    """
)


def test_a_rank_stopped_by_sigterm_leaves_when_and_where_and_is_named_before_the_exceptions_that_followed(
        tmp_path: Path) -> None:
    # Left alone last session: a rank stopped by a user's SIGTERM, whose peer then raised "Connection closed", was
    # listed as "stopped" and the peer's exception named first; nothing recorded when a rank was stopped.
    script = tmp_path / "train.py"
    script.write_text(STOPS)
    env = {**os.environ, "PYTHONPATH": str(Path(crash.__file__).parents[1])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == -15, proc.stderr[-2000:]  # SIGTERM's default action, as without hf_distprof
    assert not (tmp_path / "rank1_crash.txt").exists()  # stopped, not crashed
    stopped = parse_stopped(tmp_path / "rank1_stopped.txt")
    assert stopped is not None and (stopped.rank, stopped.signal) == (1, "SIGTERM")
    # Where the signal found the rank, not the handler that wrote the file.
    assert (stopped.dump.user_frame.file, stopped.dump.user_frame.func) == (str(script), "train_step")
    assert all("hf_distprof/crash.py" not in f.file and "core/signals.py" not in f.file
               for f in stopped.dump.main_stack)
    host = stopped.dump.host

    def rank0_raised(after: float) -> None:
        (tmp_path / "rank0_exception.txt").write_text(
            f"hf_distprof: rank 0 on host {host} ended by an uncaught exception at 2026-11-30T02:00:00.000000 (unix "
            f"{stopped.unix + after:.6f})\nTraceback (most recent call last):\n  File \"/home/me/train.py\", line 30, "
            "in <module>\n    trainer.train()\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by "
            "peer\n")

    rank0_raised(0.25)
    report = hang_report(tmp_path)
    assert sorted(report.stopped) == [1] and report.silent == {}
    assert report.lines[:2] == [f"exception report: {tmp_path} (1 rank(s) ended by an uncaught exception)",
                                f"stop report: {tmp_path} (1 rank(s) stopped by a signal)"]
    assert report.lines[2] == (f"rank 1 was stopped by SIGTERM at {script}:11 in train_step: os.kill(os.getpid(), "
                               f"signal.SIGTERM) (first, {stopped.stamp}); every thread's stack then: "
                               "rank1_stopped.txt")
    assert report.lines[3].startswith("rank 0 raised RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection "
                                      "closed by peer at /home/me/train.py:30 in <module>: trainer.train() (0.25 s "
                                      "after rank 1 was stopped, ")
    assert report.lines[4] == ("=> rank 1 was stopped by SIGTERM first: the others' exceptions followed the stop (a "
                               "rank that ends fails its peers' collectives); who sent the signal (a user, the "
                               "scheduler, a launcher) is in their logs")
    # The launcher's stop after a rank raised: the exception stays first.
    rank0_raised(-0.8)
    lines = hang_report(tmp_path).lines
    assert lines[2].startswith("rank 0 raised RuntimeError") and "(first, " in lines[2]
    assert "(0.80 s after rank 0 raised, " in lines[3]
    assert lines[4] == ("=> rank 0 raised first: the others' exceptions followed it (a rank that dies fails its peers' "
                        "collectives) and the launcher stopped the rest")
    # Every rank stopped within a moment, none raised: the job was stopped.
    (tmp_path / "rank0_exception.txt").unlink()
    text = (tmp_path / "rank1_stopped.txt").read_text()
    (tmp_path / "rank0_stopped.txt").write_text(text.replace("rank 1 on", "rank 0 on", 1).replace(
        f"(unix {stopped.unix:.6f})", f"(unix {stopped.unix + 0.05:.6f})", 1))
    lines = hang_report(tmp_path).lines
    assert lines[0] == f"stop report: {tmp_path} (2 rank(s) stopped by a signal)"
    assert lines[-1] == ("=> no rank raised: 2 ranks were stopped by a signal within 0.05 s, rank 1 first: the whole "
                         "job stopped (a scheduler, a user), or rank 1 stopped alone and then the launcher stopping "
                         "the rest")


def test_only_a_signal_leaves_a_stop_file(tmp_path: Path, handler) -> None:  # type: ignore[no-untyped-def]
    from hf_distprof.core import signals

    crash.record_crashes(tmp_path, 2)
    seen = []

    def note() -> None:
        seen.append(signals.stopping_signal())

    signals.at_default_death(note)
    try:
        signals.before_default_death()  # --hang-abort's exit: its hang dump says why
        assert seen == [None] and not (tmp_path / "rank2_stopped.txt").exists()
        assert not (tmp_path / "rank2_crash.txt").exists()  # tidied all the same
        crash.record_crashes(tmp_path, 2)
        signals.before_default_death(signal.SIGINT)
        assert seen == [None, signal.SIGINT] and signals.stopping_signal() is None
        assert (tmp_path / "rank2_stopped.txt").read_text().startswith("hf_distprof: rank 2 on host ")
        assert " stopped by SIGINT at " in (tmp_path / "rank2_stopped.txt").read_text()
    finally:
        signals.forget_at_default_death(note)
        signals.forget_at_default_death(crash._stopped)
        crash.finish()
    with pytest.raises(ValueError, match="rank3_stopped.txt: no 'hf_distprof: rank R ... stopped by SIGNAL at"):
        (tmp_path / "rank3_stopped.txt").write_text("hello\n")
        parse_stopped(tmp_path / "rank3_stopped.txt")


def test_a_script_s_own_faulthandler_still_leaves_the_stop_file(tmp_path: Path) -> None:
    # The review: with PYTHONFAULTHANDLER=1 (some clusters set it) hf_distprof writes no crash file, and the stop
    # file was tied to it: the rank then read as a silent "stopped".
    script = tmp_path / "train.py"
    script.write_text(STOPS)
    env = {**os.environ, "PYTHONPATH": str(Path(crash.__file__).parents[1]), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == -15, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".txt") == ["rank1_stopped.txt"]
    stopped = parse_stopped(tmp_path / "rank1_stopped.txt")
    assert stopped is not None and stopped.dump.user_frame.func == "train_step"


HELD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from hf_distprof import crash
    from hf_distprof.core import signals

    crash.record_crashes(Path(sys.argv[1]), 1)
    signals.at_default_death(lambda: None, guard=True)

    def export():
        with signals.deferred():  # a trace's export: the signal waits for it
            os.kill(os.getpid(), signal.SIGTERM)
            print(time.time(), flush=True)
            time.sleep(1.0)

    export()
    """
)


def test_the_stop_file_says_when_the_signal_arrived_and_where_not_when_it_took_effect(tmp_path: Path) -> None:
    # Trial U: with a profiler window open, the stop file's time was the export's end (0.7 s after the kill) and its
    # place hf_distprof's close(): the signal is held while the trace is written.
    script = tmp_path / "train.py"
    script.write_text(HELD)
    env = {**os.environ, "PYTHONPATH": str(Path(crash.__file__).parents[1])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == -15, proc.stderr[-2000:]
    sent = float(proc.stdout.split()[0])
    stopped = parse_stopped(tmp_path / "rank1_stopped.txt")
    assert stopped is not None and sent - 0.5 < stopped.unix <= sent  # when it arrived, not a second later
    assert (stopped.dump.user_frame.func, stopped.dump.user_frame.line) == ("export", 12)
