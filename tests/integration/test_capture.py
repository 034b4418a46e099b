"""Windows opened while a real 2-rank run trains (torchrun, gloo, a real Trainer): by a stall, by PROFILE_NOW and
by SIGUSR1, with no regular window in the run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from hf_distprof import dist

from .test_reliability import torchrun

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()


def profiler_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as fh:
        names = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    return sorted(int(n.split("#")[1]) for n in names)


def window_steps(run_dir: Path, rank: int) -> list[tuple[int, int]]:
    names = sorted(p.name for p in run_dir.glob(f"rank{rank}_*.pt.trace.json.gz"))
    steps = [tuple(int(x) for x in name.split("_step")[1].split(".")[0].split("-")) for name in names]
    return sorted((a, b) for a, b in steps)


def test_a_stall_profile_now_and_sigusr1_each_open_one_window_on_both_ranks_whatever_the_logging_interval(tmp_path):
    # The Trainer's default logging interval (500): capture agrees on its own cadence (every 1-5 steps, measured).
    # Every step sleeps 0.2 s inside the step (a steady median); windows of 1 warm-up + 2 recorded steps; the regular
    # schedule never starts.
    # Step 12: rank 1 stalls 1.5 s (its peer waits for it in the gradient all-reduce) -> recorded by step 20.
    # Step 20: rank 0 stalls 1 s (5x), but --max-anomaly-captures 1 is used up -> no window.
    # Step 24: rank 0 touches PROFILE_NOW (both ranks see it: one run folder) -> recorded from step 25-32.
    # Step 34: rank 1 gets SIGUSR1 -> recorded from step 35-42.
    proc = torchrun(
        tmp_path, "--max-steps", "45", "--logging-steps", "500", "--profiler-wait-steps", "1000",
        "--profiler-warmup-steps", "1", "--profiler-active-steps", "2", "--profile-on-anomaly", "--profile-on-demand",
        # 4x, not the default 2x: a 0.2 s step of a loaded 2-core host must not pass for the stall (7.5x).
        "--anomaly-factor", "4",
        env={"TINY_STALL": "all:*:0.2,1:12:1.5,0:20:1", "TINY_TRIGGER": "0:24:touch,1:34:usr1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "P" / "run"
    windows = window_steps(run_dir, 0)
    assert window_steps(run_dir, 1) == windows  # the same steps on every rank
    assert len(windows) == 3, windows
    (a1, b1), (a2, b2), (a3, b3) = windows
    # Recording starts within 8 steps of the cause: at most 5 steps to the next agreement, 1 for its gather to be
    # read, 1 warm-up step; never before the cause has been seen.
    assert 13 < a1 <= 20 and 25 < a2 <= 32 and 35 < a3 <= 42, windows
    for rank in (0, 1):
        for a, b in windows:
            assert b == a + 1
            assert profiler_steps(run_dir / f"rank{rank}_{HOST}_step{a}-{b}.pt.trace.json.gz") == [a, b]
    assert not (run_dir / "PROFILE_NOW").exists()
    # The console (rank 0's) says when and why each window opened.
    opened = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if "profiling window opened" in line]
    assert len(opened) == 3, opened
    assert f"recorded {a1}-{b1}, on every profiling rank; why: --profile-on-anomaly (anomaly capture 1 of 1; over " \
           "--anomaly-factor 4): rank " in opened[0]
    assert "'s step 12 took " in opened[0]
    assert opened[1].endswith(f"recorded {a2}-{b2}, on every profiling rank; why: on demand: PROFILE_NOW on ranks 0, 1")
    assert opened[2].endswith(f"recorded {a3}-{b3}, on every profiling rank; why: on demand: SIGUSR1 on rank 1")
