"""A rank that dies leaves its stack (hf_distprof.crash): a user's plain Trainer script on 2 CPU ranks whose rank 1
dies of SIGSEGV mid-run leaves its Python stack in rank1_crash.txt, and ``hf-distprof hang-report`` names rank 1, the
signal and where; a clean run leaves no crash file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof.cli.main import main

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration
PLAIN = Path(__file__).with_name("plain_trainer.py")


def train(tmp_path: Path, env: dict[str, str], steps: int = 12) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--report_to", "none",
           "--disable_tqdm", "true", "--save_strategy", "no", "--max_steps", str(steps),
           "--per_device_train_batch_size", "8", "--enable-step-timing", "--profiler-output-dir",
           str(tmp_path / "prof"), "--profiler-run-name", "r"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1", **env})


def test_a_rank_killed_by_sigsegv_leaves_its_stack_and_the_report_names_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    proc = train(tmp_path, {"PLAIN_SEGV": "1:6"})
    assert proc.returncode != 0  # the launcher marks the job failed, as it would without us
    run = tmp_path / "prof" / "r"
    text = (run / "rank1_crash.txt").read_text()
    assert text.startswith("Fatal Python error: Segmentation fault")
    assert "plain_trainer.py" in text and "in on_step_begin" in text  # the Python stack of the thread that died
    assert main(["hang-report", str(run)]) == 0
    report = capsys.readouterr().out
    assert "rank 1 died of Segmentation fault (SIGSEGV) at " in report and "plain_trainer.py" in report, report
    assert "rank1_crash.txt" in report
    # Rank 0 did not crash: the report does not name it, and its file (if the launcher's SIGKILL left it) is empty.
    assert "rank 0 died" not in report
    assert not (run / "rank0_crash.txt").exists() or not (run / "rank0_crash.txt").read_text().strip()


def test_a_clean_run_leaves_no_crash_file(tmp_path: Path) -> None:
    proc = train(tmp_path, {}, steps=6)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "prof" / "r"
    assert (run / "timing_rank1.jsonl").exists() and sorted(run.glob("*crash*")) == []


def test_a_rank_whose_training_raises_keeps_its_timed_steps(tmp_path: Path) -> None:
    # Rank 0's own callback raises at step 6, before any logging step: the steps it timed (1-5) still reach its
    # timing_rank0.jsonl (they waited for a logging step and were lost: a trial's analysis then judged 4 steps), and
    # the error the user sees is theirs.
    proc = train(tmp_path, {"PLAIN_RAISE": "0:6"})
    assert proc.returncode != 0
    assert "RuntimeError: user callback failed at step 6" in proc.stderr
    rows = (tmp_path / "prof" / "r" / "timing_rank0.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1, 2, 3, 4, 5]
