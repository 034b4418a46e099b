"""ProfilerCallback under SIGTERM and SIGINT at every moment of a window: whole traces, no temp file, no false alarm.

Each case runs the callback in a child process (the fake trainer: real torch ops, no Trainer) that signals itself
at one moment, and checks what the run folder holds afterwards, the exit status and the log.
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

from ..conftest import REPO_ROOT
from .. import reliability

HOST = dist.get_hostname()

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from torch.profiler import profile
    from unit import fake_trainer
    from hf_distprof import ProfilerCallback, ProfilingArguments

    out, signame, moment = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    signum = getattr(signal, signame)

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
        from hf_distprof.analysis import compact
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
    stop_after = {{"before": 1, "inside": 3}}.get(moment)
    fake_trainer.run([cb], 6, out, stop_after=stop_after)
    if stop_after is not None:
        os.kill(os.getpid(), signum)
    print("survived the signal", flush=True)
    """
)

TRACE_3_5 = f"rank0_{HOST}_step3-5.pt.trace.json.gz"
SUMMARY_3_5 = f"rank0_{HOST}_step3-5_summary.txt"
TRACE_3 = f"rank0_{HOST}_step3-3.pt.trace.json.gz"
SUMMARY_3 = f"rank0_{HOST}_step3-3_summary.txt"
COMPACT = ".compact.msgpack"

MOMENTS = {"before": "before the window", "inside": "inside the window",
           "stop": "between the window's stop and its export", "export": "during the trace export",
           "summary": "during the summary after it", "compact": "while its compact summary is written"}
# moment -> the files the run folder must hold afterwards (besides parallelism.json and rank0.log).
# Each trace's compact summary too: its thread is joined before the signal takes effect.
EXPECTED = {
    "before": [],  # no window started: nothing to write
    "inside": [TRACE_3, SUMMARY_3, TRACE_3 + COMPACT],  # cut short after step 3: a whole partial trace
    "stop": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # the signal waits for the whole end of the window
    "export": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # the signal waits for the export
    "summary": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # and for the summary after it
    "compact": [TRACE_3_5, SUMMARY_3_5, TRACE_3_5 + COMPACT],  # and for the compact summary's thread
}


def trace_steps(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})


@pytest.mark.parametrize(
    ("signame", "moment"),
    [("SIGTERM", moment) for moment in EXPECTED] + [("SIGINT", "inside"), ("SIGINT", "export")],
)
def test_a_signal_at_any_moment_leaves_whole_traces_and_the_signals_status(tmp_path, signame, moment):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(REPO_ROOT / "tests")))
    tmpdir = tmp_path / "tmp"  # torch gzips through a temporary file here
    tmpdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmpdir)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), signame, moment],
                          capture_output=True, text=True, env=env, timeout=120)
    run_dir = tmp_path / "out" / "run"
    names = sorted(p.name for p in run_dir.iterdir())
    # Ours are hidden files in the run folder; torch's are *.json files in TMPDIR (it gzips through one).
    temp_left = [n for n in names if n.startswith(".")] + sorted(p.name for p in tmpdir.glob("*.json"))
    expected = EXPECTED[moment]
    reliability.record(f"{signame} {MOMENTS[moment]} (1 rank)", survived=proc.returncode == -getattr(signal, signame),
                       expected=len(expected), present=sum(n in names for n in expected), temp_left=len(temp_left))
    assert proc.returncode == -getattr(signal, signame), proc.stderr[-3000:]
    assert "survived the signal" not in proc.stdout
    # The run manifest: this rank's part only (rank 0 combines the parts at train end, which never came).
    assert names == sorted(["parallelism.json", "rank0.log", f"manifest_rank0_{HOST}.json", *expected])
    assert temp_left == []
    for false_alarm in ("could not write", "already saved", "stopping the profiler failed"):
        assert false_alarm not in proc.stderr
    if expected:
        # "inside": step 4 had begun (its range opens when step 3 ends) when the signal came; it is in the trace,
        # cut short, and the file is named by the steps that completed.
        steps = [3, 4] if moment == "inside" else [3, 4, 5]
        assert trace_steps(run_dir / expected[0]) == [f"ProfilerStep#{n}" for n in steps]
        assert (run_dir / expected[1]).read_text().startswith("hf_distprof profiler summary: rank 0 of 1")
