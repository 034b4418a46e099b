"""Faults on real 2-rank runs (torchrun, gloo, a real Trainer on a tiny model): what survives, what is lost.

Each test injects one fault, records its outcome in the reliability table (``tests/reliability.py``, printed at
the end of the session and quoted in DEVELOPING.md), then asserts: the run behaved as promised, every file
written before the fault is whole, and no temporary file is left.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_distprof import dist
from hf_distprof.analysis.read.manifest import load_manifest, missing_files
from hf_distprof.runs.hang_report import hang_report

from .. import reliability
from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
TINY = Path(__file__).with_name("tiny_trainer.py")
FALSE_ALARMS = ("could not write profiler trace", "already saved", "stopping the profiler failed")


# What every hf_distprof warning about a failed write, close or measurement says (a step timer's verdict on a slow
# step, which a busy machine may bring, is not one).
FAILURE_WORDS = ("could not", "cannot", "failed", "not measured", "already saved")


def failure_warnings(proc: subprocess.CompletedProcess[str], run_dir: Path) -> list[str]:
    """The lines in which hf_distprof, on the console or in the rank logs, says that something failed."""
    logs = "".join((run_dir / f"rank{r}.log").read_text() for r in (0, 1) if (run_dir / f"rank{r}.log").is_file())
    return [line for line in (proc.stderr + logs).splitlines()
            if "hf_distprof" in line and any(word in line for word in FAILURE_WORDS)]


def torchrun(tmp_path: Path, *flags: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (),
             timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node 2 tiny_trainer.py`` with profiling into ``tmp_path/P/run``."""
    cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), str(TINY), "--output-dir", str(tmp_path / "trainer"),
           "--use-cpu", "true", "--report-to", "none", "--disable-tqdm", "true", "--save-strategy", "no",
           "--logging-steps", "1", "--enable-profiling", "--profiler-record-shapes", "false",
           "--profiler-output-dir", str(tmp_path / "P"), "--profiler-run-name", "run", *flags]
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=tmp_path)


def trace(rank: int, first: int, last: int) -> str:
    return f"rank{rank}_{HOST}_step{first}-{last}.pt.trace.json.gz"


def summary(rank: int, first: int, last: int) -> str:
    return f"rank{rank}_{HOST}_step{first}-{last}_summary.txt"


def whole(path: Path) -> bool:
    """A trace that gunzips and parses with its events, or a non-empty summary."""
    try:
        if path.name.endswith(".json.gz"):
            with gzip.open(path, "rt") as fh:
                return bool(json.load(fh)["traceEvents"])
        return path.stat().st_size > 0
    except (OSError, ValueError, KeyError):
        return False


def profiler_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as fh:
        names = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    return sorted(int(n.split("#")[1]) for n in names)


def window_files(run_dir: Path, rank: int, default: str) -> list[str]:
    """The rank's trace of its one window and its summary; ``default`` names the trace when there is none (lost)."""
    found = sorted(p.name for p in run_dir.glob(f"rank{rank}_*.pt.trace.json.gz"))
    name = found[0] if found else default
    return [name, name.replace(".pt.trace.json.gz", "_summary.txt")]


def outcome(fault: str, run_dir: Path, expected: list[str], survived: bool) -> list[str]:
    """Record the fault in the table and return the temporary files left."""
    names = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    temp = [n for n in names if n.startswith(".")]
    reliability.record(fault, survived=survived, expected=len(expected),
                       present=sum(whole(run_dir / n) for n in expected if n in names), temp_left=len(temp))
    return temp


def test_sigterm_to_torchrun_mid_window_flushes_both_ranks_without_a_false_alarm(tmp_path):
    # Window: steps 3-22; rank 0 sends SIGTERM to torchrun after step 5, torchrun forwards it to both ranks.
    proc = torchrun(tmp_path, "--max-steps", "40", "--profiler-wait-steps", "1", "--profiler-warmup-steps", "1",
                    "--profiler-active-steps", "20", env={"TINY_FAULT": "0:5:term-launcher", "TINY_STEP_S": "0.05"})
    run_dir = tmp_path / "P" / "run"
    traces = {r: sorted(run_dir.glob(f"rank{r}_*.pt.trace.json.gz")) for r in (0, 1)}
    expected = [name for r in (0, 1) for name in window_files(run_dir, r, trace(r, 3, 5))]
    temp = outcome("SIGTERM to torchrun mid-window (2 ranks)", run_dir, expected, proc.returncode != 0)
    assert proc.returncode != 0
    assert "SIGTERM" in proc.stderr  # torchrun: "Received Signals.SIGTERM death signal, shutting down workers"
    assert temp == []
    for rank in (0, 1):
        assert len(traces[rank]) == 1, traces
        steps = profiler_steps(traces[rank][0])
        # Cut short a step or two after step 5; the name holds the steps that completed.
        assert steps[0] == 3 and 5 <= steps[-1] <= 8, steps
        assert traces[rank][0].name == trace(rank, 3, steps[-1] - 1) or traces[rank][0].name == trace(
            rank, 3, steps[-1]), traces[rank][0].name
        assert whole(traces[rank][0])
        assert (run_dir / traces[rank][0].name.replace(".pt.trace.json.gz", "_summary.txt")).is_file()
    for alarm in FALSE_ALARMS:
        assert alarm not in proc.stderr + proc.stdout
        assert alarm not in "".join((run_dir / f"rank{r}.log").read_text() for r in (0, 1))
    assert failure_warnings(proc, run_dir) == []  # from no callback: a stop is not a failure
    # Each rank left when and where the signal found it; no rank raised.
    report = hang_report(run_dir)
    assert sorted(report.stopped) == [0, 1] and {s.signal for s in report.stopped.values()} == {"SIGTERM"}
    assert report.lines[-1].startswith("=> no rank raised: 2 ranks were stopped by a signal within ")


def test_a_rank_stopped_alone_is_named_before_what_followed_on_its_peer(tmp_path):
    # A user's `kill` of rank 1 (SIGTERM) when step 5 ends, no window open: rank 0's next collective fails ("Connection
    # closed by peer"), or torchrun, seeing rank 1 end, stops it first. Either way rank 1's stop came first.
    proc = torchrun(tmp_path, "--max-steps", "40", "--profiler-wait-steps", "30",
                    env={"TINY_FAULT": "1:5:term", "TINY_STEP_S": "0.05"})
    run_dir = tmp_path / "P" / "run"
    assert proc.returncode != 0
    report = hang_report(run_dir)
    assert report.stopped[1].signal == "SIGTERM" and report.silent == {}, report.text
    stop = next(line for line in report.lines if line.startswith("rank 1 was stopped by SIGTERM"))
    assert f"at {TINY}:" in stop and " in on_step_end: " in stop and "(first, " in stop, report.text
    verdict = [line for line in report.lines if line.startswith("=>")]
    assert verdict[0].startswith(("=> rank 1 was stopped by SIGTERM first: the others' exceptions followed the stop",
                                  "=> no rank raised: 2 ranks were stopped by a signal within ")), report.text
    assert "rank 1 first" in verdict[0] or "rank 1 was stopped by SIGTERM first" in verdict[0]


def test_sigterm_during_an_export_waits_for_the_trace_on_both_ranks(tmp_path):
    # Window: steps 3-12, exported at the end of step 12; rank 0 signals torchrun from inside its export.
    proc = torchrun(tmp_path, "--max-steps", "40", "--profiler-wait-steps", "1", "--profiler-warmup-steps", "1",
                    "--profiler-active-steps", "10", env={"TINY_FAULT": "0:export:term-launcher",
                                                          "TINY_STEP_S": "0.05"})
    run_dir = tmp_path / "P" / "run"
    expected = [trace(0, 3, 12), summary(0, 3, 12), *window_files(run_dir, 1, trace(1, 3, 12))]
    temp = outcome("SIGTERM to torchrun during an export (2 ranks)", run_dir, expected, proc.returncode != 0)
    assert proc.returncode != 0 and "SIGTERM" in proc.stderr
    assert temp == []
    assert profiler_steps(run_dir / trace(0, 3, 12)) == list(range(3, 13))
    assert whole(run_dir / summary(0, 3, 12))
    # Rank 1 got the signal at the same moment: before, during or after its own export of the same window.
    rank1 = sorted(run_dir.glob("rank1_*.pt.trace.json.gz"))
    assert [p.name for p in rank1] in ([trace(1, 3, 12)], [trace(1, 3, 11)]), rank1
    assert whole(rank1[0]) and profiler_steps(rank1[0])[0] == 3
    assert whole(run_dir / expected[3]), expected[3]
    for alarm in FALSE_ALARMS:
        assert alarm not in proc.stderr + proc.stdout
        assert alarm not in "".join((run_dir / f"rank{r}.log").read_text() for r in (0, 1))
    assert failure_warnings(proc, run_dir) == []


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_dead_or_crashed_rank_costs_no_file_already_written(tmp_path, how):
    # Windows 3-4 and 7-8 (wait 2, active 2, repeat 2); rank 1 dies (SIGKILL) or raises after step 7.
    proc = torchrun(tmp_path, "--max-steps", "12", "--profiler-wait-steps", "2", "--profiler-warmup-steps", "0",
                    "--profiler-active-steps", "2", "--profiler-repeat", "2", env={"TINY_FAULT": f"1:7:{how}"})
    run_dir = tmp_path / "P" / "run"
    before = [trace(r, 3, 4) for r in (0, 1)] + [summary(r, 3, 4) for r in (0, 1)]
    fault = "rank 1 killed (SIGKILL) mid-window" if how == "kill" else "exception on rank 1 mid-window"
    temp = outcome(f"{fault} (2 ranks)", run_dir, before, proc.returncode != 0)
    assert proc.returncode != 0
    assert temp == []
    assert all(whole(run_dir / name) for name in before), sorted(p.name for p in run_dir.iterdir())
    if how == "kill":
        # torchrun's error summary names the dead rank and its signal.
        root_cause = proc.stderr[proc.stderr.index("Root Cause"):]
        assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9 .*\(SIGKILL\)", root_cause), root_cause
    else:
        assert "simulated crash after step 7" in proc.stderr
        # The crashed rank flushed its cut window (step 7) on the way out, and left its traceback; hang-report names it
        # first (rank 0, if it raised, did so after: its collective failed when rank 1 died).
        assert whole(run_dir / trace(1, 7, 7))
        assert (run_dir / "rank1_exception.txt").read_text().endswith(
            "RuntimeError: simulated crash after step 7\n")
        assert hang_report(run_dir).lines[1].startswith("rank 1 raised RuntimeError: simulated crash after step 7 at ")
    # The survivor flushed its cut second window too.
    survivor = sorted(p.name for p in run_dir.glob("rank0_*.pt.trace.json.gz"))
    assert survivor[0] == trace(0, 3, 4) and len(survivor) == 2 and survivor[1].startswith(f"rank0_{HOST}_step7-")
    assert all(whole(run_dir / n) for n in survivor)
    # No manifest.json (train end never came); the ranks' parts assemble into one that lists every file still there.
    manifest = load_manifest(run_dir)
    assert manifest is not None and not manifest["complete"] and manifest["unfinished_ranks"] == [0, 1]
    second = [0] if how == "kill" else [0, 1]  # a killed rank never finished its second window
    assert [(w["first"], w["ranks"]) for w in manifest["windows"]] == [(3, [0, 1]), (7, second)]
    assert missing_files(manifest, run_dir) == []


def test_resumed_run_counts_the_schedule_from_the_checkpoint_step(tmp_path):
    first = torchrun(tmp_path, "--max-steps", "4", "--save-strategy", "steps", "--save-steps", "4",
                     "--enable-profiling", "false")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = tmp_path / "trainer" / "checkpoint-4"
    assert checkpoint.is_dir()
    # Resumed at step 4: wait 1 (step 5), active 2 -> steps 6-7.
    proc = torchrun(tmp_path, "--max-steps", "9", "--resume-from-checkpoint", str(checkpoint),
                    "--profiler-wait-steps", "1", "--profiler-warmup-steps", "0", "--profiler-active-steps", "2")
    run_dir = tmp_path / "P" / "run"
    expected = [trace(r, 6, 7) for r in (0, 1)] + [summary(r, 6, 7) for r in (0, 1)]
    temp = outcome("resume from a checkpoint (2 ranks)", run_dir, expected, proc.returncode == 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert temp == []
    assert sorted(p.name for p in run_dir.glob("*.pt.trace.json.gz")) == [trace(0, 6, 7), trace(1, 6, 7)]
    for rank in (0, 1):
        assert profiler_steps(run_dir / trace(rank, 6, 7)) == [6, 7]
        timing = [json.loads(line)["step"] for line in (run_dir / f"timing_rank{rank}.jsonl").read_text().splitlines()]
        assert timing == [5, 6, 7, 8, 9]


# Runs torchrun in a private mount namespace. "readonly-start": the output folder is read-only from the start.
# "full": the output folder is a 32 MiB tmpfs, filled up once both
# ranks wrote their first window. "readonly": once both ranks wrote their first window, a read-only tmpfs is
# mounted over the run folder (files already open stay writable, as on a remount that a busy folder refuses;
# nothing new can be created), and taken off again before the run folder is copied out for the test to read.
NAMESPACE_SCRIPT = textwrap.dedent(
    """
    set -u
    out="$1"; fault="$2"; shift 2
    mkdir -p "$out"
    if [ "$fault" = full ]; then mount -t tmpfs -o size=32m tmpfs "$out" || exit 97; fi
    if [ "$fault" = readonly-start ]; then
        mount -t tmpfs -o ro tmpfs "$out" || exit 96
        "$@"; status=$?
        umount "$out"
        exit $status
    fi
    "$@" &
    pid=$!
    for _ in $(seq 600); do
        # The first window is written: both ranks' summaries and compact summaries (written on a thread).
        [ "$(ls "$out"/run/*_step3-4_summary.txt "$out"/run/*_step3-4.pt.trace.json.gz.compact.msgpack 2>/dev/null \
            | wc -l)" = 4 ] && break
        sleep 0.1
    done
    if [ "$fault" = full ]; then
        dd if=/dev/zero of="$out/filler" bs=64k 2>/dev/null
    else
        mount -t tmpfs -o ro tmpfs "$out/run" || exit 98
    fi
    wait $pid; status=$?
    [ "$fault" = full ] || umount "$out/run"
    mkdir -p "$out.copy" && cp -a "$out/run" "$out.copy/"
    exit $status
    """
)


def namespaces_work() -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt 2>/dev/null || "
                            "mount -t tmpfs tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize("fault", ["full", "readonly"])
def test_disk_full_or_unwritable_folder_mid_run_is_one_warning_and_training_goes_on(tmp_path, fault):
    if shutil.which("unshare") is None or not namespaces_work():
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to make a full or read-only file system")
    script = tmp_path / "ns.sh"
    script.write_text(NAMESPACE_SCRIPT)
    # Windows 3-4 and 7-8; the fault comes once both ranks wrote the first one.
    proc = torchrun(tmp_path, "--max-steps", "10", "--profiler-wait-steps", "2", "--profiler-warmup-steps", "0",
                    "--profiler-active-steps", "2", "--profiler-repeat", "2", "--profiler-with-stack", "true",
                    prefix=("unshare", "-rm", "bash", str(script), str(tmp_path / "P"), fault),
                    env={"TINY_STEP_S": "0.1"})
    run_dir = tmp_path / "P.copy" / "run"
    before = [trace(r, 3, 4) for r in (0, 1)] + [summary(r, 3, 4) for r in (0, 1)]
    what = "disk full during export" if fault == "full" else "output folder read-only mid-run"
    temp = outcome(f"{what} (2 ranks)", run_dir, before, proc.returncode == 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert temp == []
    assert all(whole(run_dir / n) for n in before)
    assert not list(run_dir.glob("*step7-8*"))
    warnings = [line for line in proc.stderr.splitlines()
                if "hf_distprof.callbacks.profiler.callback" in line and "could not write profiler trace" in line]
    assert len(warnings) == 2 and all("training goes on" in w for w in warnings), proc.stderr[-3000:]
    reason = "No space left on device" if fault == "full" else "Read-only file system"
    assert all(reason in w for w in warnings), warnings


def test_an_output_folder_unwritable_from_the_start_is_one_warning_per_rank_and_training_goes_on(tmp_path):
    if shutil.which("unshare") is None or not namespaces_work():
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to make a read-only file system")
    script = tmp_path / "ns.sh"
    script.write_text(NAMESPACE_SCRIPT)
    proc = torchrun(tmp_path, "--max-steps", "6", "--profiler-wait-steps", "1", "--profiler-warmup-steps", "0",
                    "--profiler-active-steps", "2",
                    prefix=("unshare", "-rm", "bash", str(script), str(tmp_path / "P"), "readonly-start"))
    survived = proc.returncode == 0
    reliability.record("output folder read-only from the start (2 ranks)", survived=survived, expected=0, present=0,
                       temp_left=0)
    assert survived, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines()
                if "cannot create a run folder in --profiler-output-dir" in line]
    assert len(warnings) == 2 and all("Read-only file system" in w and "training goes on" in w for w in warnings), (
        proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    assert "'train_loss'" in proc.stdout  # the Trainer's final line: all 6 steps ran
