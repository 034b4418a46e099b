"""``--profile-ranks auto`` on a real 4-rank run (torchrun, gloo, a real Trainer): one rank's forward is slowed, and
the window is traced on that rank and exactly one other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof import dist

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
TINY = Path(__file__).with_name("tiny_trainer.py")
SLOW_RANK = 2


def test_auto_traces_the_slowed_rank_and_the_median_rank_only(tmp_path):
    # Steps 2-4 are timed untraced on every rank (step 1 is the step timer's warm-up); the first capture agreement
    # comes at step 5 (it sends the steps finished before it) and is read at step 6, the last read before the window
    # (warm-up 7, recorded 8-9): logging every 500 steps changes nothing.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port", str(free_port()),
           str(TINY), "--output-dir", str(tmp_path / "trainer"), "--use-cpu", "true", "--report-to", "none",
           "--disable-tqdm", "true", "--save-strategy", "no", "--logging-steps", "500", "--max-steps", "9",
           "--per-device-train-batch-size", "4", "--enable-profiling", "--profiler-record-shapes", "false",
           "--profiler-output-dir", str(tmp_path / "P"), "--profiler-run-name", "run", "--profile-ranks", "auto",
           "--profiler-wait-steps", "6", "--profiler-warmup-steps", "1", "--profiler-active-steps", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TINY_SLOW_FORWARD": f"{SLOW_RANK}:0.1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "P" / "run"
    record = json.loads((run_dir / "profile_ranks.json").read_text())
    assert record["world_size"] == 4 and len(record["windows"]) == 1
    window = record["windows"][0]
    assert (window["window_first"], window["view_step"], window["slowest"], window["steps"]) == (7, 6, SLOW_RANK,
                                                                                                 [2, 3, 4])
    other = window["median"]
    assert other in {0, 1, 3} and window["ranks"] == sorted([SLOW_RANK, other])
    assert window["own_work_s"][str(SLOW_RANK)] > 0.1
    traces = sorted(p.name for p in run_dir.glob("*.pt.trace.json.gz"))
    assert traces == sorted(f"rank{r}_{HOST}_step8-9.pt.trace.json.gz" for r in (SLOW_RANK, other)), traces
    log = (run_dir / "rank0.log").read_text()
    assert f"--profile-ranks auto: the window from step 7 is traced on ranks {min(SLOW_RANK, other)}, " \
           f"{max(SLOW_RANK, other)}; why: rank {SLOW_RANK} is the slowest (median pre-sync work " in log
