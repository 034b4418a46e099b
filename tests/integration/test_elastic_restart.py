"""A 2-rank run restarted by torchelastic keeps both attempts' files: the restart writes into its own run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof.analysis.read.manifest import load_manifest

from ..conftest import REPO_ROOT
from .test_reliability import TINY, summary, trace

pytestmark = pytest.mark.integration

# torchrun sets TORCHELASTIC_RESTART_COUNT in every worker (0, then 1 after a restart): the fault is armed on the
# first attempt only, so the restart trains to the end.
FIRST_ATTEMPT_ONLY = f"""
import os, runpy, sys
if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
    del os.environ["TINY_FAULT"]
sys.argv[0] = {str(TINY)!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_torchelastic_restart_writes_a_new_run_folder_and_keeps_the_first_attempts(tmp_path: Path) -> None:
    # Attempt 0: both ranks trace steps 2-3, then rank 1 raises after step 5; torchrun stops rank 0 and starts both
    # again (--max-restarts 1). Attempt 1: the same command, same --profiler-run-name, trains its 6 steps.
    script = tmp_path / "first_attempt_fails.py"
    script.write_text(FIRST_ATTEMPT_ONLY)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", str(script), "--output-dir", str(tmp_path / "trainer"), "--use-cpu", "true",
           "--report-to", "none", "--disable-tqdm", "true", "--save-strategy", "no",
           "--max-steps", "6", "--logging-steps", "1", "--enable-profiling", "--profiler-record-shapes", "false",
           "--profiler-wait-steps", "1", "--profiler-warmup-steps", "0", "--profiler-active-steps", "2",
           "--profiler-output-dir", str(tmp_path / "P"), "--profiler-run-name", "run"]
    # Through the store torchrun shares with its workers, a restart can read the earlier attempt's gloo addresses
    # and fail to connect (3 restarts in 5 failed so, torch 2.13); with a store per attempt (as the sbatch example
    # also asks for) none in 10 did.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TINY_FAULT": "1:5:raise",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "simulated crash after step 5" in proc.stderr  # the restart came from the fault, on attempt 0

    assert sorted(p.name for p in (tmp_path / "P").iterdir()) == ["run", "run-attempt1"]
    expected = sorted(name for r in (0, 1)
                      for name in (trace(r, 2, 3), trace(r, 2, 3) + ".compact.msgpack", summary(r, 2, 3)))
    for name in ("run", "run-attempt1"):
        found = sorted(p.name for p in (tmp_path / "P" / name).glob("rank*_step*"))
        assert found == expected, (name, found)

    first, second = load_manifest(tmp_path / "P" / "run"), load_manifest(tmp_path / "P" / "run-attempt1")
    assert first is not None and second is not None
    assert not first["complete"] and first["unfinished_ranks"] == [0, 1]  # stopped by the fault before train end
    assert second["complete"] and second["run_name"] == "run-attempt1"
    assert first["job"]["launcher"] == second["job"]["launcher"] == "torchelastic"
    assert (first["job"]["torchelastic_restart_count"], second["job"]["torchelastic_restart_count"]) == (0, 1)
    assert first["job"]["torchelastic_run_id"] == second["job"]["torchelastic_run_id"]
