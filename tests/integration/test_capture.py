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


def test_a_stall_profile_now_and_sigusr1_each_open_one_window_on_both_ranks(tmp_path):
    # Every step sleeps 0.2 s inside the step (a steady median). Agreement every 2 steps; windows of 1 warm-up +
    # 2 recorded steps; the regular schedule never starts.
    # Step 10: rank 1 stalls 1.5 s (its peer waits for it in the gradient all-reduce) -> warm-up 11, recorded 12-13.
    # Step 14: rank 0 stalls 1 s, but --max-anomaly-captures 1 is used up -> no window.
    # Step 16: rank 0 touches PROFILE_NOW (both ranks see it: one run folder) -> 17, 18-19.
    # Step 20: rank 1 gets SIGUSR1 -> 21, 22-23.
    proc = torchrun(
        tmp_path, "--max-steps", "24", "--logging-steps", "2", "--profiler-wait-steps", "1000",
        "--profiler-warmup-steps", "1", "--profiler-active-steps", "2", "--profile-on-anomaly", "--profile-on-demand",
        env={"TINY_STALL": "all:*:0.2,1:10:1.5,0:14:1", "TINY_TRIGGER": "0:16:touch,1:20:usr1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "P" / "run"
    windows = [(12, 13), (18, 19), (22, 23)]
    for rank in (0, 1):
        names = sorted(p.name for p in run_dir.glob(f"rank{rank}_*.pt.trace.json.gz"))
        assert names == sorted(f"rank{rank}_{HOST}_step{a}-{b}.pt.trace.json.gz" for a, b in windows), names
        for a, b in windows:
            assert profiler_steps(run_dir / f"rank{rank}_{HOST}_step{a}-{b}.pt.trace.json.gz") == [a, b]
    assert not (run_dir / "PROFILE_NOW").exists()
    log = (run_dir / "rank0.log").read_text()
    opened = [line.split("] ", 1)[1] for line in log.splitlines() if "profiling window opened" in line]
    assert [line.split(":", 1)[0] for line in opened] == [
        f"profiling window opened at step {step}" for step in (10, 16, 20)
    ], opened
    assert "recorded 12-13, on every profiling rank; why: --profile-on-anomaly (anomaly capture 1 of 1; over " \
           "--anomaly-factor 2): rank " in opened[0]
    assert "'s step 10 took " in opened[0]
    assert opened[1].endswith("recorded 18-19, on every profiling rank; why: on demand: PROFILE_NOW on ranks 0, 1")
    assert opened[2].endswith("recorded 22-23, on every profiling rank; why: on demand: SIGUSR1 on rank 1")
