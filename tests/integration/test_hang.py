"""A hung 2-rank run: rank 1 blocks forever in its data collator; the watchdog dumps every rank's stacks,
--hang-abort ends the job by itself, and hang-report names rank 1 and the blocking frame."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hf_distprof import dist
from hf_distprof.runs.hang_report import hang_report, parse_dump

from ..conftest import REPO_ROOT
from .launch import train_lambda

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
TIMEOUT = 20


def test_a_rank_blocked_in_its_collator_is_dumped_named_and_the_job_ends(tmp_path):
    begin = time.monotonic()
    # Rank 1's 5th collator call never returns (accelerate fetches one batch ahead: during step 4).
    proc = train_lambda(
        tmp_path, "--max-steps", "50", "--hang-timeout", str(TIMEOUT), "--hang-abort", "--enable-step-timing",
        "--profiler-output-dir", "OUT", "--profiler-run-name", "hung",
        env={"SKIP_PREFLIGHT": "1", "HF_DISTPROF_SIMULATE_HANG": "1:5"}, timeout=240,
    )
    elapsed = time.monotonic() - begin
    assert proc.returncode != 0, proc.stdout[-2000:]
    run_dir = tmp_path / "OUT" / "hung"
    dumps = {r: parse_dump(run_dir / f"hang_rank{r}_{HOST}.txt") for r in (0, 1)}
    for rank, dump in dumps.items():
        assert dump.header["rank"] == str(rank) and dump.header["world_size"] == "2"
        waited = float(dump.header["seconds_since_last_step"])
        assert TIMEOUT <= waited < TIMEOUT + 10, waited  # the watchdog checks every timeout / 4
    # Both ranks ended by themselves: the start-up (tokenizer, model), a few steps, the timeout, the dumps.
    assert elapsed < 150, elapsed
    assert "--hang-abort: ending this rank with status 3" in proc.stderr
    blocked = dumps[1].user_frame
    assert blocked is not None and blocked.file.endswith("train_mlm.py") and blocked.func == "__call__"
    assert "threading.Event().wait()" in blocked.code
    assert dumps[0].in_collective is not None and dumps[1].in_collective is None

    report = hang_report(run_dir)
    assert report.culprits == [1]
    cli = subprocess.run(
        [sys.executable, "-m", "hf_distprof.cli.main", "hang-report", str(run_dir)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=60, check=True,
    ).stdout
    assert f"=> the others wait for rank 1 at {blocked}" in cli
    # No backstop file is left behind by a rank that the Python watchdog ended.
    assert not list(run_dir.glob("*.faulthandler.txt"))
