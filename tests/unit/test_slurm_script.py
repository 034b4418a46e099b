"""local_scripts/slurm/train_lambda.sbatch: it parses, launches torchrun itself, and expands per-node variables on
each node (run here with stand-ins for srun, scontrol and torchrun that record what each node was asked to run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from ..conftest import REPO_ROOT

SBATCH = REPO_ROOT / "local_scripts" / "slurm" / "train_lambda.sbatch"

# srun with --ntasks-per-node=1 on 2 nodes: the command once per node, with that node's SLURM_NODEID.
FAKE_SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
for node in 0 1; do SLURM_NODEID=$node SLURM_PROCID=$node "$@" || exit $?; done
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] && printf 'gpu-a17\\ngpu-a18\\n'
"""
FAKE_TORCHRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_OUT/node$SLURM_NODEID.args"
echo "$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" > "$FAKE_OUT/node$SLURM_NODEID.env"
"""


def test_it_parses_and_launches_with_torchrun_not_with_a_launcher_of_ours():
    bash = shutil.which("bash")
    assert bash is not None
    check = subprocess.run([bash, "-n", str(SBATCH)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = SBATCH.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "torchrun" in code and "srun" in code
    assert not re.search(r"train_lambda\.sh|train_lambda_with_profiling|accelerate launch|hf-distprof", code)
    assert re.search(r"^#SBATCH --nodes=2$", text, re.M) and re.search(r"^#SBATCH --ntasks-per-node=1$", text, re.M)


def test_each_node_runs_torchrun_with_its_own_node_id_and_the_shared_run_name(tmp_path):
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("torchrun", FAKE_TORCHRUN)):
        (fakes / name).write_text(body)
        (fakes / name).chmod(0o755)
    env = {"PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}", "FAKE_OUT": str(tmp_path), "HOME": str(tmp_path),
           "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu-a[17-18]",
           "SLURM_SUBMIT_DIR": "/shared/repo"}
    proc = subprocess.run(["bash", str(SBATCH), "--max-steps", "50", "--profile-ranks", "0,8"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for node in (0, 1):
        args = (tmp_path / f"node{node}.args").read_text().splitlines()
        assert args == [
            "--nnodes", "2", "--nproc-per-node", "8",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "gpu-a17:29500", "--rdzv-id", "4242",
            "--max-restarts", "2",
            "--log-dir", f"/shared/repo/slurm_logs/job4242/node{node}", "--tee", "3",
            "/shared/repo/python_scripts/train_modernBERT.py",
            "--enable-profiling", "--profiler-output-dir", "/shared/repo/profiler_traces",
            "--profiler-run-name", "job4242", "--max-steps", "50", "--profile-ranks", "0,8",
        ]
        assert (tmp_path / f"node{node}.env").read_text().strip() == "1"
        assert f"node {node} (" in proc.stderr
    # Outside a SLURM job it stops at once and says why.
    outside = subprocess.run(["bash", str(SBATCH)], env={"PATH": env["PATH"]}, capture_output=True, text=True)
    assert outside.returncode != 0 and "submit this script with sbatch" in outside.stderr
