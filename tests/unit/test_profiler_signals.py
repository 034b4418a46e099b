"""ProfilerCallback under SIGTERM and SIGINT at every moment of a window: whole traces, no temp file, no false alarm.

Each case runs the callback in its own process (the fake trainer: real torch ops, no Trainer) that signals itself at
one moment, and checks what the run folder holds afterwards, the exit status and the log. One driver process
imports torch and transformers once and forks a process per case (an import per case cost ~5 s each).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_distprof import dist
from hf_distprof.runs.hang_report import parse_stopped

from .. import reliability
from ..conftest import REPO_ROOT

HOST = dist.get_hostname()
SIGNALS = ("SIGTERM", "SIGINT")

DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from torch.profiler import profile
    from unit import fake_trainer
    from hf_distprof import ProfilerCallback, ProfilingArguments

    def scenario(out, signum, moment):
        def signal_self_then(original):
            def wrapper(*args, **kwargs):
                os.kill(os.getpid(), signum)  # delivered at once unless something holds it back
                return original(*args, **kwargs)
            return wrapper

        if moment == "export":
            profile.export_chrome_trace = signal_self_then(profile.export_chrome_trace)
        if moment == "summary":
            profile.key_averages = signal_self_then(profile.key_averages)
        if moment == "compact":  # on the thread writing the compact summary, after the trace and its summary
            from hf_distprof.analysis.read import compact
            compact.encode = signal_self_then(compact.encode)
        if moment == "stop":  # between the window's stop_trace and its export, inside the profiler's step()
            stop_trace = profile.stop_trace
            def stop_then_signal(self):
                stop_trace(self)
                os.kill(os.getpid(), signum)
            profile.stop_trace = stop_then_signal
        # Window: steps 3-5 (wait 1, warmup 1, active 3); the fake trainer runs 6 steps. Three active steps, so that
        # "inside" (after step 3) stops the profiler in RECORD, not in the window's last step (RECORD_AND_SAVE).
        cb = ProfilerCallback(ProfilingArguments(enable_profiling=True, profiler_output_dir=str(out),
                              profiler_run_name="run", profiler_wait_steps=1, profiler_warmup_steps=1,
                              profiler_active_steps=3, profiler_record_shapes=False))
        stop_after = {{"before": 1, "first": 2, "inside": 3, "last": 4}}.get(moment)
        fake_trainer.run([cb], 6, out, stop_after=stop_after)
        if stop_after is not None:
            os.kill(os.getpid(), signum)
        print("survived the signal", flush=True)

    # SIGINT as an interactive shell leaves it (KeyboardInterrupt): a shell that ignores SIGINT (a background job
    # of a script, nohup) passes SIG_IGN on to its children, and the SIGINT cases would then test nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root = Path(sys.argv[1])
    fake_trainer.training_args(root)  # its first call imports most of transformers: once, before forking
    status = {{}}
    for case in sys.argv[2:]:
        signame, moment = case.split("-")
        folder = root / case
        (folder / "tmp").mkdir(parents=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            log = os.open(folder / "output.txt", os.O_WRONLY | os.O_CREAT)
            os.dup2(log, 1)
            os.dup2(log, 2)
            tempfile.tempdir = os.environ["TMPDIR"] = str(folder / "tmp")  # torch gzips through a file there
            try:
                scenario(folder / "out", getattr(signal, signame), moment)
            except KeyboardInterrupt:
                # What CPython does when a KeyboardInterrupt ends the program: finalize (the atexit handlers run),
                # then die of SIGINT.
                import atexit
                atexit._run_exitfuncs()
                sys.stderr.flush()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        status[case] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(status))
    """
)

TRACE_3_5 = f"rank0_{HOST}_step3-5.pt.trace.json.gz"
SUMMARY_3_5 = f"rank0_{HOST}_step3-5_summary.txt"
TRACE_3 = f"rank0_{HOST}_step3-3.pt.trace.json.gz"
SUMMARY_3 = f"rank0_{HOST}_step3-3_summary.txt"
COMPACT = ".compact.msgpack"

TRACE_3_4 = f"rank0_{HOST}_step3-4.pt.trace.json.gz"
SUMMARY_3_4 = f"rank0_{HOST}_step3-4_summary.txt"

MOMENTS = {"before": "before the window", "first": "inside the window's first step",
           "inside": "inside the window", "last": "in the window's last step",
           "stop": "between the window's stop and its export", "export": "during the trace export",
           "summary": "during the summary after it", "compact": "while its compact summary is written"}
# moment -> the files the run folder must hold afterwards (besides parallelism.json and rank0.log).
# Each trace's compact summary too: its thread is joined before the signal takes effect.
EXPECTED = {
    "before": [],  # no window started: nothing to write
    "first": [],  # no step of the window ended: nothing to name a trace by (it was named step2-2, a warm-up step)
    "inside": [TRACE_3, SUMMARY_3, TRACE_3 + COMPACT],  # cut short after step 3: a whole partial trace
    "last": [TRACE_3_4, SUMMARY_3_4, TRACE_3_4 + COMPACT],  # cut in step 5, whose action is to stop and save
    "stop": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # the signal waits for the whole end of the window
    "export": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # the signal waits for the export
    "summary": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # and for the summary after it
    "compact": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # and for the compact summary's thread
}


def trace_steps(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})


CASES = [f"{signame}-{moment}" for signame in SIGNALS for moment in EXPECTED]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """Every case run once: the folder holding one subfolder per case, and each case's exit status."""
    root = tmp_path_factory.mktemp("signals")
    script = root / "driver.py"
    script.write_text(DRIVER.format(tests=str(REPO_ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(root), *CASES], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_a_signal_at_any_moment_leaves_whole_traces_and_the_signals_status(outcomes, case):
    root, status = outcomes
    signame, moment = case.split("-")
    run_dir = root / case / "out" / "run"
    output = (root / case / "output.txt").read_text(errors="replace")
    names = sorted(p.name for p in run_dir.iterdir())
    # Ours are hidden files in the run folder; torch's are *.json files in TMPDIR (it gzips through one).
    temp_left = [n for n in names if n.startswith(".")] + sorted(p.name for p in (root / case / "tmp").glob("*.json"))
    expected = EXPECTED[moment]
    survived = status[case] == -getattr(signal, signame)
    reliability.record(f"{signame} {MOMENTS[moment]} (1 rank)", survived=survived, expected=len(expected),
                       present=sum(n in names for n in expected), temp_left=len(temp_left))
    assert survived, output[-3000:]
    assert "survived the signal" not in output
    # The run manifest: this rank's part only (rank 0 combines the parts at train end, which never came).
    # SIGTERM's default action ends the rank: when and where, in its stop file (SIGINT raises KeyboardInterrupt).
    stop = ["rank0_stopped.txt"] if signame == "SIGTERM" else []
    assert names == sorted(["parallelism.json", "rank0.log", f"manifest_rank0_{HOST}.json", *expected, *stop])
    if stop:
        stopped = parse_stopped(run_dir / stop[0])
        assert stopped is not None and stopped.signal == "SIGTERM" and stopped.dump.main_stack
    assert temp_left == []
    for false_alarm in ("could not write", "already saved", "stopping the profiler failed", "Traceback"):
        assert false_alarm not in output
        assert false_alarm not in (run_dir / "rank0.log").read_text()
    # Where the signal cut a window short, one line says so (a Ctrl-C left only a traceback through our handler).
    cut = [line for line in output.splitlines() if "during a profiler window: the window was stopped" in line]
    if moment in ("inside", "last"):
        assert len(cut) == 1 and (f"{signame} during a profiler window: the window was stopped and its steps so far "
                                  f"written ({expected[0]}, in {run_dir}; hf-distprof analyze reads them)") in cut[0]
    else:
        assert cut == []
    if expected:
        # "inside": step 4 had begun (its range opens when step 3 ends) when the signal came; it is in the trace,
        # cut short, and the file is named by the steps that completed ("last": the same with step 5).
        steps = {"inside": [3, 4], "last": [3, 4, 5]}.get(moment, [3, 4, 5])
        assert trace_steps(run_dir / expected[0]) == [f"ProfilerStep#{n}" for n in steps]
        assert (run_dir / expected[1]).read_text().startswith("hf_distprof profiler summary: rank 0 of 1")
