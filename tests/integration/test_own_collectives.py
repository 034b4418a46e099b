"""hf_distprof's own collectives are not the user's, in a real run: a user's plain GPT-2 Trainer script on 2 CPU ranks
(gloo) with and without ``--profile-on-demand`` (issue 30: its capture agreements' all-gathers read as 1.7 all-gathers
per step against 1.0). The Trainer all-gathers each step's token count (``average_tokens_across_devices``): one
all-gather of the user's per step, with or without on-demand capture. The agreements of ours every 1-5 steps, and the
memory logger's gathers, run inside ``hf_distprof/ours ...`` ranges and are named apart.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_summary

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

PLAIN = Path(__file__).with_name("plain_trainer.py")
# Steps 4-8 recorded by the schedule; 5 recorded steps per window, so that each window holds an agreement (every
# 1-5 steps) in the on-demand run.
SCHEDULE = ("--profiler-wait-steps", "2", "--profiler-warmup-steps", "1", "--profiler-active-steps", "5")
STEPS = 26
TOUCH_STEP = 10  # PROFILE_NOW, seen at the next agreement (<= 5 steps), then 1 warm-up and 5 recorded steps


def train(tmp_path: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--report_to", "none",
           "--disable_tqdm", "true", "--save_strategy", "no", "--max_steps", str(STEPS),
           "--per_device_train_batch_size", "8", "--enable-profiling", "--enable-memory-logging",
           "--memory-log-steps", "1", "--profiler-output-dir", str(tmp_path / "prof"), "--profiler-run-name", name,
           *SCHEDULE, *flags]
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "prof" / name


def users_all_gathers_per_step(result: AnalysisResult) -> list[int]:
    """Each rank's each traced step: how many of its collectives are all-gathers."""
    return [Counter(c.step for c in rank.collectives if c.kind == "all_gather")[s.step]
            for rank in result.ranks for s in rank.steps]


def test_on_demand_capture_adds_no_all_gather_to_the_users_and_names_ours(tmp_path: Path) -> None:
    plain_dir = train(tmp_path, "plain")
    run_dir = tmp_path / "prof" / "on_demand"
    on_demand_dir = train(tmp_path, "on_demand", "--profile-on-demand",
                          env={"PLAIN_PROFILE_NOW": f"{TOUCH_STEP}:{run_dir / 'PROFILE_NOW'}"})
    assert len(list(plain_dir.glob("rank0_*.pt.trace.json.gz"))) == 1
    assert len(list(on_demand_dir.glob("rank0_*.pt.trace.json.gz"))) == 2  # the schedule's window and ours
    plain = analyze_paths([plain_dir], AnalysisOptions(workers=1))
    on_demand = analyze_paths([on_demand_dir], AnalysisOptions(workers=1))
    assert [len(r.steps) for r in plain.ranks] == [5, 5] and [len(r.steps) for r in on_demand.ranks] == [10, 10]

    def all_gathers(result: AnalysisResult) -> list[float]:
        return [row.count_per_step for r in [*result.ranks, result] for row in r.comm_by_kind
                if row.kind == "all_gather"]

    # Per rank and the mean over ranks: the same per-kind count with and without on-demand capture, exactly.
    assert all_gathers(on_demand) == all_gathers(plain) == [1.0, 1.0, 1.0]
    # The Trainer's token-count gather, once in every traced step of both runs, and nothing of ours among them.
    assert set(users_all_gathers_per_step(plain)) == set(users_all_gathers_per_step(on_demand)) == {1}
    # Ours were there (the agreements, in every window of the on-demand run) and are named once, as ours.
    for rank in on_demand.ranks:
        first, second = rank.steps[:5], rank.steps[5:]
        for window in (first, second):
            assert any(c.kind == "all_gather" for s in window for c in s.own_collectives), \
                [(s.step, [c.kind for c in s.own_collectives]) for s in rank.steps]
    text = format_summary(on_demand)
    assert sum(line.startswith("hf-distprof's own collectives left out: ") for line in text.splitlines()) == 1
