"""The hang watchdog (fake clock, real thread and files) and hang-report (synthetic and real dumps)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hf_distprof import ProfilingArguments, build_callbacks, dist
from hf_distprof.callbacks.hang import ABORT_STATUS, HangWatchdogCallback, format_stacks
from hf_distprof.runs.hang_report import hang_report, parse_dump, parse_recorder

from ..conftest import REPO_ROOT
from . import fake_trainer

HOST = dist.get_hostname()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _wait_for(predicate, seconds=5.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _watchdog(tmp_path, clock, timeout=1.0, abort=False, exits=None):
    args = ProfilingArguments(hang_timeout=timeout, hang_abort=abort, profiler_output_dir=str(tmp_path / "out"),
                              profiler_run_name="run")
    cb = HangWatchdogCallback(args, clock=clock, exit_process=(exits.append if exits is not None else os._exit))
    state = fake_trainer.TrainerState()
    cb.on_train_begin(fake_trainer.training_args(tmp_path), state, fake_trainer.TrainerControl())
    return cb, state


def _end_step(cb, state, clock, step, at):
    clock.now = at
    state.global_step = step
    cb.on_step_end(None, state, None)


def test_only_built_when_a_timeout_is_set():
    assert not [c for c in build_callbacks(ProfilingArguments()) if isinstance(c, HangWatchdogCallback)]
    cb, _ = build_callbacks(ProfilingArguments(hang_timeout=30))  # and the end-of-run block
    assert isinstance(cb, HangWatchdogCallback)


def test_a_stall_dumps_every_threads_stack_once(tmp_path):
    clock = FakeClock()
    cb, state = _watchdog(tmp_path, clock)
    try:
        _end_step(cb, state, clock, 1, at=1.0)
        clock.now = 1.9  # within the timeout: nothing
        time.sleep(0.4)
        assert cb.dumps == []
        clock.now = 2.5  # 1.5 s since step 1 ended, timeout 1 s
        assert _wait_for(lambda: cb.dumps)
        (path,) = cb.dumps
        assert path == tmp_path / "out" / "run" / f"hang_rank0_{HOST}.txt"
        dump = parse_dump(path)
        assert dump.header["rank"] == "0" and dump.header["last_step"] == "1"
        assert dump.header["seconds_since_last_step"] == "1.5" and dump.header["timeout_s"] == "1"
        assert dump.main == f"MainThread ({threading.main_thread().ident})"
        assert any(f.func == "test_a_stall_dumps_every_threads_stack_once" for f in dump.main_stack)
        assert any(name.startswith("hf_distprof-hang-watchdog") for name in dump.threads)
        time.sleep(0.4)
        assert len(cb.dumps) == 1  # once per stall
        _end_step(cb, state, clock, 2, at=3.0)  # progress again, then a second stall
        clock.now = 4.5
        assert _wait_for(lambda: len(cb.dumps) == 2)
        assert parse_dump(path).header["last_step"] == "2"
    finally:
        cb.close()
    # The GIL-free backstop never fired: its file is gone.
    assert sorted(p.name for p in (tmp_path / "out" / "run").iterdir()) == [f"hang_rank0_{HOST}.txt", "rank0.log"]


def test_the_first_step_gets_the_start_up_allowance(tmp_path):
    clock = FakeClock()
    cb, _ = _watchdog(tmp_path, clock, timeout=1.0)
    try:
        clock.now = 4.9  # 5 timeouts before the first step may end
        time.sleep(0.4)
        assert cb.dumps == []
        clock.now = 5.1
        assert _wait_for(lambda: cb.dumps)
        assert parse_dump(cb.dumps[0]).header["last_step"] == "0"
    finally:
        cb.close()


def _abort(tmp_path) -> tuple[list[int], Any]:
    """A watchdog with --hang-abort whose rank stalls after step 7: the exit statuses it ended with, and it."""
    clock, exits = FakeClock(), []
    cb, state = _watchdog(tmp_path, clock, abort=True, exits=exits)
    try:
        _end_step(cb, state, clock, 7, at=1.0)
        clock.now = 3.0
        assert _wait_for(lambda: exits)
    finally:
        cb.close()
    return exits, cb


def test_hang_abort_ends_the_rank_with_status_3_after_dumping(tmp_path):
    exits, cb = _abort(tmp_path)
    assert exits == [ABORT_STATUS] and len(cb.dumps) == 1
    assert not list((tmp_path / "out" / "run").glob("*.faulthandler.txt"))


def test_hang_abort_first_runs_what_a_signal_s_death_would(tmp_path, monkeypatch):
    # os._exit runs no atexit handler: a trial's --hang-abort left rank{R}_crash.txt empty beside the hang dumps (the
    # guide: "a run folder holds one only for a rank that really crashed") and timing_rank{R}.jsonl empty.
    from hf_distprof.core import signals

    ran: list[str] = []

    def tidy() -> None:
        ran.append("tidied")

    monkeypatch.setattr(signals, "_BEFORE_DEATH", [tidy])
    monkeypatch.setattr(signals, "_OWNER", {tidy: os.getpid()})
    exits, _ = _abort(tmp_path)
    assert ran == ["tidied"] and exits == [ABORT_STATUS]


def test_hang_abort_ends_the_rank_even_when_its_tidying_hangs_too(tmp_path, monkeypatch):
    # A wedged driver or file system under the last rows' write must not keep the rank from ending.
    import threading

    from hf_distprof.callbacks import hang
    from hf_distprof.core import signals

    stuck = threading.Event()

    def tidy() -> None:
        stuck.wait(60)

    monkeypatch.setattr(signals, "_BEFORE_DEATH", [tidy])
    monkeypatch.setattr(signals, "_OWNER", {tidy: os.getpid()})
    monkeypatch.setattr(hang, "TIDY_S", 0.2)
    try:
        exits, _ = _abort(tmp_path)
        assert exits == [ABORT_STATUS]
    finally:
        stuck.set()


def test_steps_that_keep_ending_never_dump(tmp_path):
    clock = FakeClock()
    cb, state = _watchdog(tmp_path, clock, timeout=0.5)
    try:
        for step in range(1, 30):
            _end_step(cb, state, clock, step, at=step * 0.4)
            time.sleep(0.01)
    finally:
        cb.close()
    assert cb.dumps == []
    assert sorted(p.name for p in (tmp_path / "out" / "run").iterdir()) == ["rank0.log"]


# ---- hang-report ------------------------------------------------------------------------------------

WAITING = '''hf_distprof hang dump
rank: 0
world_size: {world}
host: h
pid: 10
last_step: 5
seconds_since_last_step: 20.4
timeout_s: 20
time: now

Thread MainThread (ident 1, main):
  File "/work/python_scripts/train.py", line 300, in main
    trainer.train()
  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2000, in training_step
    self.accelerator.backward(loss)
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 841, in _engine_run_backward
    return Variable._execution_engine.run_backward(

Thread hf_distprof-hang-watchdog (ident 2):
  File "/venv/lib/python3.11/site-packages/hf_distprof/callbacks/hang.py", line 150, in _watch
    self.dump()
'''

STUCK = '''hf_distprof hang dump
rank: 1
world_size: {world}
host: h
pid: 11
last_step: 5
seconds_since_last_step: 20.1
timeout_s: 20
time: now

Thread MainThread (ident 1, main):
  File "/work/python_scripts/train.py", line 300, in main
    trainer.train()
  File "/venv/lib/python3.11/site-packages/accelerate/data_loader.py", line 570, in __iter__
    next_batch = next(dataloader_iter)
  File "/work/python_scripts/train.py", line 207, in __call__
    threading.Event().wait()
  File "/usr/lib/python3.11/threading.py", line 629, in wait
    signaled = self._cond.wait(timeout)
'''


def _write(folder: Path, rank: int, text: str, world: int = 2) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"hang_rank{rank}_h.txt").write_text(text.format(world=world))


def test_hang_report_names_the_rank_outside_every_collective_and_its_frame(tmp_path):
    _write(tmp_path, 0, WAITING)
    _write(tmp_path, 1, STUCK)
    report = hang_report(tmp_path)
    assert report.culprits == [1] and report.world_size == 2
    assert report.lines[1:] == [
        "rank 0 (h, last step 5): in a collective or waiting for one at "
        "/venv/lib/python3.11/site-packages/torch/autograd/graph.py:841 in _engine_run_backward: "
        "return Variable._execution_engine.run_backward( (from /work/python_scripts/train.py:300 in main: "
        "trainer.train())",
        "rank 1 (h, last step 5): NOT in a collective; stuck at /work/python_scripts/train.py:207 in __call__: "
        "threading.Event().wait()",
        "=> the others wait for rank 1 at /work/python_scripts/train.py:207 in __call__: threading.Event().wait()",
    ]


def test_every_rank_in_a_collective_and_a_missing_rank_are_said(tmp_path):
    _write(tmp_path, 0, WAITING, world=3)
    _write(tmp_path, 1, WAITING.replace("rank: 0", "rank: 1"), world=3)
    report = hang_report(tmp_path)
    assert report.culprits == []
    assert report.lines[-2] == (
        "no dump from rank(s) [2]: dead, or stuck in C code holding the GIL (no backstop dump)"
    )
    assert report.lines[-1].startswith("=> every rank dumped is inside a collective") and report.lines[-1].endswith(
        "or one that died: [2]"
    )


def test_a_faulthandler_backstop_dump_stands_in_for_a_missing_one(tmp_path):
    _write(tmp_path, 0, WAITING)
    (tmp_path / "hang_rank1_h.faulthandler.txt").write_text(
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 629 in wait\n'
        '  File "/work/python_scripts/train.py", line 207 in __call__\n'
        '  File "/work/python_scripts/train.py", line 300 in main\n'
    )
    report = hang_report(tmp_path)
    assert report.culprits == [1]
    assert report.lines[2] == (
        "rank 1 (h, last step ?, faulthandler backstop): NOT in a collective; stuck at "
        "/work/python_scripts/train.py:207 in __call__"
    )


def test_an_empty_backstop_is_no_dump(tmp_path):
    # A trial: --hang-timeout with a rank that segfaulted and one that raised left both ranks' backstops armed and
    # empty: "2 rank(s) dumped", each "stuck at an empty stack". An empty one is no dump, as an empty crash file is no
    # crash: rank 0's real dump alone, rank 1 said as not dumped.
    _write(tmp_path, 0, WAITING)
    (tmp_path / "hang_rank0_h.faulthandler.txt").write_text("")
    (tmp_path / "hang_rank1_h.faulthandler.txt").write_text("")
    report = hang_report(tmp_path)
    assert report.lines[0].startswith(f"hang report: {tmp_path} (1 rank(s) dumped")
    assert not any("empty stack" in line for line in report.lines)
    for path in tmp_path.iterdir():
        path.unlink()
    (tmp_path / "hang_rank1_h.faulthandler.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no hang_rank"):
        hang_report(tmp_path)  # nothing but empty backstops: no dump at all
    with pytest.raises(FileNotFoundError, match="a file, not a run folder"):
        hang_report(tmp_path / "hang_rank1_h.faulthandler.txt")


def _recorder(folder: Path, rank: int, entries: list) -> None:
    (folder / f"flight_recorder_rank{rank}_h.pkl").write_bytes(pickle.dumps({"version": "2.9", "entries": entries}))


def test_flight_recorder_dumps_say_who_never_reached_a_collective(tmp_path):
    _write(tmp_path, 0, WAITING)
    _write(tmp_path, 1, WAITING.replace("rank: 0", "rank: 1"))
    entry = {"collective_seq_id": 41, "profiling_name": "nccl:all_reduce", "state": "completed",
             "input_sizes": [[1024]], "is_p2p": False}
    _recorder(tmp_path, 0, [entry, {**entry, "collective_seq_id": 42, "state": "started"}])
    _recorder(tmp_path, 1, [entry])
    report = hang_report(tmp_path)
    assert report.lines[-3:] == [
        "  rank 0: #42 nccl:all_reduce (started), input sizes [[1024]]",
        "  rank 1: #41 nccl:all_reduce (completed), input sizes [[1024]]",
        "  => rank(s) [1] never reached collective #42: the others wait for them there",
    ]
    # The same sequence number with different collectives: a mismatch.
    _recorder(tmp_path, 1, [entry, {**entry, "collective_seq_id": 42, "profiling_name": "nccl:all_gather"}])
    assert hang_report(tmp_path).lines[-1].startswith("  => mismatched collectives at the same sequence number")


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/hf_distprof_pwned",))


def test_a_pickle_that_is_not_plain_data_is_refused_unexecuted(tmp_path):
    path = tmp_path / "flight_recorder_rank0_h.pkl"
    path.write_bytes(pickle.dumps({"entries": [Evil()]}))
    with pytest.raises(ValueError, match=f"{path}: not a readable flight-recorder dump: refusing to load"):
        parse_recorder(path)
    assert not Path("/tmp/hf_distprof_pwned").exists()


def test_a_file_that_is_not_a_dump_is_named(tmp_path):
    (tmp_path / "hang_rank0_h.txt").write_text("something else\n")
    with pytest.raises(ValueError, match="hang_rank0_h.txt: not a hang dump written by hf_distprof"):
        hang_report(tmp_path)
    # Beside readable dumps, it is named at the end and the report stands on the others (it stopped at one bad file).
    _write(tmp_path, 1, STUCK)
    lines = hang_report(tmp_path).lines
    assert any(line.startswith("rank 1 (") for line in lines)
    assert lines[-2:] == ["could not read 1 file(s), left out of the report above:",
                          f"  {tmp_path / 'hang_rank0_h.txt'}: not a hang dump written by hf_distprof "
                          + lines[-1].split("written by hf_distprof ", 1)[1]]


def test_cli_prints_the_report_and_fails_cleanly_without_dumps(tmp_path):
    _write(tmp_path / "run", 0, WAITING)
    _write(tmp_path / "run", 1, STUCK)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cli = [sys.executable, "-m", "hf_distprof.cli.main", "hang-report"]
    ok = subprocess.run([*cli, str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and "=> the others wait for rank 1" in ok.stdout
    empty = subprocess.run([*cli, str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert empty.returncode == 2
    assert empty.stderr.startswith(f"hf-distprof hang-report: error: {tmp_path}: no hang_rank*_*.txt")


def test_format_stacks_of_a_real_thread_parses_back(tmp_path):
    ready, release = threading.Event(), threading.Event()

    def blocked_in_a_helper():
        ready.set()
        release.wait()

    worker = threading.Thread(target=blocked_in_a_helper, name="worker")
    worker.start()
    ready.wait()
    try:
        path = tmp_path / "hang_rank3_h.txt"
        path.write_text("hf_distprof hang dump\nrank: 3\n\n" + format_stacks())
        dump = parse_dump(path)
    finally:
        release.set()
        worker.join()
    (name,) = [n for n in dump.threads if n.startswith("worker")]
    # Event.wait, then Condition.wait inside it: innermost last.
    assert [f.func for f in dump.threads[name]][-3:] == ["blocked_in_a_helper", "wait", "wait"]
    assert dump.main is not None and dump.main.startswith("MainThread")


@pytest.mark.parametrize("end", ["raise", "sigterm"])
def test_a_rank_that_ends_before_train_end_leaves_no_empty_backstop(tmp_path, end):
    # A trial: --hang-timeout with a rank that raised, and a job stopped by SIGTERM: empty
    # hang_rank{R}_{host}.faulthandler.txt files stayed in the run folder (the guide: removed when never written).
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tests.unit import fake_trainer
from hf_distprof import ProfilingArguments
from hf_distprof.callbacks.hang import HangWatchdogCallback
from pathlib import Path
tmp = Path({str(tmp_path)!r})
args = ProfilingArguments(hang_timeout=30, profiler_output_dir=str(tmp / "out"), profiler_run_name="run")
cb = HangWatchdogCallback(args)
cb.on_train_begin(fake_trainer.training_args(tmp), fake_trainer.TrainerState(), fake_trainer.TrainerControl())
assert list((tmp / "out" / "run").glob("*.faulthandler.txt")), "armed"
if {end!r} == "raise":
    raise RuntimeError("boom")
os.kill(os.getpid(), signal.SIGTERM)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == (1 if end == "raise" else -15), done.stderr
    assert "armed" not in done.stderr
    assert not list((tmp_path / "out" / "run").glob("*.faulthandler.txt"))


def _stop_file(folder: Path, rank: int, unix: float, host: str = "h") -> None:
    (folder / f"rank{rank}_stopped.txt").write_text(
        f"hf_distprof: rank {rank} on host {host} stopped by SIGTERM at 2026-11-30T02:00:0{rank}.000000 (unix "
        f"{unix:.6f})\n\nThread MainThread (ident 1, main):\n  File \"/work/train.py\", line 61, in <module>\n"
        "    trainer.train()\n")


def test_stops_after_a_hang_or_beside_a_killed_rank_or_on_two_hosts_name_no_first_of_their_own(tmp_path):
    # The review: hang dumps then a cancel (every rank's stop file) gave two '=>' verdicts that disagreed; a SIGKILLed
    # rank beside stop files left a survivor labelled "first" above "=> look at rank 2 first"; and stops on two hosts
    # named a first rank by two clocks.
    hung = tmp_path / "hung"
    _write(hung, 0, WAITING)
    _write(hung, 1, STUCK)
    _stop_file(hung, 0, 1795000000.0)
    _stop_file(hung, 1, 1795000000.2)
    lines = hang_report(hung).lines
    assert [line for line in lines if line.startswith("=>")] == [
        "=> the others wait for rank 1 at /work/python_scripts/train.py:207 in __call__: threading.Event().wait()"]
    assert "rank 1 was stopped by SIGTERM at /work/train.py:61 in <module>: trainer.train() (0.20 s after rank 0 was " \
           "stopped, 2026-11-30T02:00:01.000000); every thread's stack then: rank1_stopped.txt" in lines

    killed = tmp_path / "killed"
    killed.mkdir()
    _stop_file(killed, 0, 1795000000.0)
    _stop_file(killed, 1, 1795000000.2)
    (killed / "rank2_crash.txt").write_text("")  # SIGKILL: armed, never written
    lines = hang_report(killed).lines
    assert not any("first" in line for line in lines if not line.startswith("=>")), lines
    assert lines[-1].startswith("=> look at rank 2 first")
    assert "rank 0 was stopped by SIGTERM at /work/train.py:61 in <module>: trainer.train() " \
           "(2026-11-30T02:00:00.000000); every thread's stack then: rank0_stopped.txt" in lines

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    _stop_file(hosts, 0, 1795000000.0, host="a")
    _stop_file(hosts, 1, 1795000000.5, host="b")
    lines = hang_report(hosts).lines
    assert "(first by its host's clock, " in lines[1] and "(0.50 s after rank 0 was stopped by its host's clock, " \
        in lines[2]
    assert lines[-1] == ("=> no rank raised: 2 ranks were stopped by a signal within 0.50 s by 2 hosts' clocks, which "
                         "can differ by more: the whole job stopped (a scheduler, a user), or one rank stopped alone "
                         "and then the launcher stopping the rest")


FORWARD = '''hf_distprof hang dump
rank: 1
world_size: 2
host: h
pid: 11
last_step: 15
seconds_since_last_step: 20.1
timeout_s: 20
time: now

Thread MainThread (ident 1, main):
  File "/work/train.py", line 61, in <module>
    trainer.train()
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1715, in _run_ddp_forward
    return self.module(*inputs, **kwargs)
  File "/venv/lib/python3.11/site-packages/transformers/activations.py", line 66, in forward
    return 0.5 * input * (1.0 + torch.tanh(input))
'''

MODEL_LINES = '''  File "/venv/lib/python3.11/site-packages/transformers/activations.py", line 66, in forward
    return 0.5 * input * (1.0 + torch.tanh(input))
'''
C10D_LINES = """  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501, in bcast
    work.wait()
  File "/usr/lib/python3.11/threading.py", line 320, in wait
    waiter.acquire()
"""
BROADCAST = FORWARD.replace("rank: 1", "rank: 0").replace(MODEL_LINES, C10D_LINES)


def test_a_rank_stuck_in_its_model_under_ddp_s_forward_is_not_in_a_collective(tmp_path):
    # Trial U: a rank stopped (SIGSTOP) in its forward read "in a collective ... at distributed.py:1715 in
    # _run_ddp_forward" and the report said "every rank dumped is inside a collective".
    _write(tmp_path, 0, BROADCAST)
    _write(tmp_path, 1, FORWARD)
    report = hang_report(tmp_path)
    assert report.culprits == [1]
    assert report.lines[1].startswith("rank 0 (h, last step 15): in a collective or waiting for one at "
                                      "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2501")
    assert report.lines[2:] == [
        "rank 1 (h, last step 15): NOT in a collective; stuck at /work/train.py:61 in <module>: trainer.train()",
        "=> the others wait for rank 1 at /work/train.py:61 in <module>: trainer.train()"]


def test_hf_distprof_s_own_frames_are_not_the_user_s_line_but_the_demo_recipe_is():
    from hf_distprof.runs.hang_report import Frame, RankDump

    dump = RankDump(0, "h", Path("x"), threads={"MainThread": [
        Frame("/work/train.py", 61, "<module>", "trainer.train()"),
        Frame("/work/repo/hf_distprof/callbacks/profiler/callback.py", 386, "close", "with signals.deferred():")]},
        main="MainThread")
    assert str(dump.user_frame) == "/work/train.py:61 in <module>: trainer.train()"
    dump.threads["MainThread"].append(Frame("/venv/lib/python3.11/site-packages/hf_distprof/recipe/train_mlm.py", 9,
                                            "run"))
    assert dump.user_frame.func == "run"


def test_a_functional_collective_s_wait_is_in_a_collective_and_a_checkout_named_hf_distprof_is_the_user_s():
    # The review: a funcol wait's innermost frame is torch/_ops.py (the op's dispatch), below
    # _functional_collectives.py: it read "NOT in a collective"; and a checkout in a folder named hf_distprof had its
    # own scripts taken for hf_distprof's code.
    from hf_distprof.runs.hang_report import Frame, RankDump

    site = "/venv/lib/python3.11/site-packages/torch"
    funcol = RankDump(0, "h", Path("x"), threads={"MainThread": [
        Frame("/work/tp.py", 18, "<module>", "y.wait()"),
        Frame(f"{site}/distributed/_functional_collectives.py", 144, "wait_tensor", "return torch.ops...(tensor)"),
        Frame(f"{site}/_ops.py", 1243, "__call__", "return self._op(*args, **kwargs)")]}, main="MainThread")
    assert funcol.in_collective is not None and funcol.in_collective.func == "wait_tensor"
    checkout = RankDump(0, "h", Path("x"), threads={"MainThread": [
        Frame("/home/u/hf_distprof/python_scripts/train_modernBERT.py", 15, "<module>", "run()"),
        Frame(f"{site}/nn/functional.py", 10, "pad")]}, main="MainThread")
    assert checkout.user_frame.func == "<module>"
    ours = RankDump(0, "h", Path("x"), threads={"MainThread": [
        Frame("/home/u/hf_distprof/python_scripts/train_modernBERT.py", 15, "<module>", "run()"),
        Frame("/home/u/hf_distprof/hf_distprof/timing/instrument.py", 227, "grad_ready")]}, main="MainThread")
    assert ours.user_frame.func == "<module>"


def test_every_part_of_the_package_but_the_recipe_is_hf_distprof_s_own_code():
    # So that a module added at the package's top does not read as the user's line in a stop or hang report.
    import hf_distprof
    from hf_distprof.runs.hang_report import _OURS

    root = Path(hf_distprof.__file__).parent
    for entry in root.iterdir():
        if entry.name in ("recipe", "__pycache__", "_version.py") or entry.suffix not in ("", ".py"):
            continue
        sample = f"/x/hf_distprof/{entry.name}" + ("/m.py" if entry.is_dir() else "")
        assert _OURS.search(sample), entry.name
    assert not _OURS.search("/x/hf_distprof/recipe/train_mlm.py")
