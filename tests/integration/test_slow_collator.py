"""A user's plain GPT-2 Trainer script on 2 CPU ranks (gloo) whose rank 1 sleeps in its collator for a quarter of a
step: ``analyze`` names rank 1 from the short window and the step timer's records of the same run, at a 4-step
window and at the default schedule (3 active steps), and no finding blames rank 0's communication without naming
rank 1 as what it waits for. The same script without the sleep names no rank unless its step timer named one over
the run (the analysis says what the run says); on it the per-kind exposed times add up to the headline and the
profiler's slowdown is stated with its noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

PLAIN = Path(__file__).with_name("plain_trainer.py")
SHARE = 0.25  # of a clean step, slept by rank 1's collator per batch
RANK_KINDS = {"slow_rank", "straggler", "imbalance", "waiting_for_peers"}


def train(tmp_path: Path, name: str, steps: int, *schedule: str, sleep: float = 0.0, crossover: bool = False) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--report_to", "none",
           "--disable_tqdm", "true", "--save_strategy", "no", "--max_steps", str(steps),
           "--per_device_train_batch_size", "64", "--logging_steps", "4", "--enable-profiling",
           "--profiler-output-dir", str(tmp_path / "prof"), "--profiler-run-name", name, *schedule]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1",
           "PLAIN_COLLATOR_SLEEP": f"1:{sleep:.4f}" if sleep else "-1:0",
           "HF_DISTPROF_ALTERNATE_CORES": "1" if crossover else "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "prof" / name


def slowed(tmp: Path, name: str, clean_step_s: float) -> Path:
    """Rank 1's collator asleep for :data:`SHARE` of a clean step, at a 4-step window or at the default schedule (wait
    5, warmup 2, active 3: steps 8-10 traced). Crossed over the cores like the clean run: a rank held on a core in its
    slow mode for the whole second of a run is ~20% slower, which can hide most of a 25% sleep on the other rank."""
    sleep = SHARE * clean_step_s
    if name == "window4":
        return train(tmp, name, 24, "--profiler-active-steps", "4", sleep=sleep, crossover=True)
    return train(tmp, name, 30, sleep=sleep, crossover=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("slow_collator")
    # The clean run crosses its ranks over the cores at every batch (plain_trainer.py): a run of ~1 s can sit in one
    # core's slow mode (~20%) from start to end, and the timer, rightly, names the rank on it (CI once: rank 0 +11%
    # in 16 of 17 steps). Crossed over, that speed is step-to-step noise; the silence tested is the tool's own.
    clean = train(tmp, "clean", 24, "--profiler-active-steps", "4", crossover=True)
    step_s = json.loads((clean / "timing_summary.json").read_text())["step_mean_s"]
    return {"clean": clean, "clean_step_s": step_s,
            **{name: slowed(tmp, name, step_s) for name in ("window4", "defaults")}}


@pytest.mark.flaky(reruns=1, reason=(
    "a statistical scenario: 2 ranks on 2 shared cores whose speeds change by ~20% for seconds at a time, judged over "
    "17 to 22 steps of ~70 ms; CI once (November 2026, before the slowed runs crossed over the cores) saw the step "
    "timer quiet on a run slowed by 25%. The rerun trains its run anew"))
@pytest.mark.parametrize("name", ["window4", "defaults"])
def test_rank_1_is_named_from_the_window_and_the_step_timer(runs, name, request, tmp_path):
    # A rerun is a new experiment: the module's run, judged already, would only fail again.
    rerun = getattr(request.node, "execution_count", 1) > 1
    folder = slowed(tmp_path, name, runs["clean_step_s"]) if rerun else runs[name]
    result = analyze_paths([folder], AnalysisOptions(workers=1))
    cross = result.cross_rank
    assert cross is not None and len(result.ranks[0].steps) == (4 if name == "window4" else 3)
    # Too few traced steps alone (2 ranks need 6): the step timer's verdict over the run's untraced steps decides
    # (core/run_verdict.py), the window one more sample beside it. Neither verdict ever names rank 0.
    verdicts = [v for v in (cross.straggler_verdict, cross.imbalance_verdict) if v is not None]
    raised = [v for v in verdicts if v.raised]
    assert raised and all(v.rank == 1 for v in raised), [v.reason for v in verdicts]
    assert all(v.test == "binomial, step timer" and "over the run's" in v.reason for v in raised)
    live = json.loads((folder / "timing_summary.json").read_text())["imbalance_verdict"]
    assert (live["status"], live["rank"]) == ("raised", 1)  # what the live verdict said at train end
    assert [s.rank for s in cross.stragglers] in ([], [1])
    named = [f for f in result.findings if f.kind in RANK_KINDS]
    assert named and {r for f in named for r in f.ranks} == {1}, [(f.kind, f.ranks) for f in result.findings]
    chain = named[0]
    assert chain.kind == "slow_rank" and chain.title == "Rank 1 holds the others back: its data loading", chain.evidence
    assert "rank 0 waits" in chain.evidence and "for rank 1" in chain.evidence
    # Rank 0's exposed communication is mostly that wait: nothing calls it network-bound without naming rank 1.
    for f in result.findings:
        if f.kind in ("communication_bound", "waiting_for_peers") and 0 in f.ranks:
            assert "rank 1" in f.evidence, f.evidence
    gather = next(row for row in result.ranks[0].comm_by_kind if row.kind == "all_gather")
    assert gather.waited_for == [1] and gather.wait_us > 0.5 * gather.exposed_us
    assert result.undecided == []


def test_the_clean_run_names_nobody_and_its_numbers_agree(runs):
    result = analyze_paths([runs["clean"]], AnalysisOptions(workers=1))
    # The analysis says what the run's step timer said at train end (the same steps, the same rule). Beside a busy
    # core a clean run's rank can truly be slower over the whole run (once: rank 1 +13.7% in most of 17 steps); then
    # both name it, and only it. Whether clean runs stay quiet is the scenario suite's question, over 5 runs.
    live = json.loads((runs["clean"] / "timing_summary.json").read_text())["imbalance_verdict"]
    named = {r for f in result.findings if f.kind in RANK_KINDS for r in f.ranks}
    assert named == ({live["rank"]} if live["status"] == "raised" else set()), \
        [(f.kind, f.evidence) for f in result.findings]
    assert result.cross_rank is not None
    assert [s.rank for s in result.cross_rank.stragglers] in ([], [live["rank"]] if named else [])
    # Each rank's per-kind exposed share adds up to its exposed communication in the headline (well within 1% of
    # the step), and so do the means over ranks.
    for rank in result.ranks:
        assert abs(sum(row.exposed_pct for row in rank.comm_by_kind) - rank.exposed_comm_pct) < 0.01
        for row in rank.comm_by_kind:
            assert row.exposed_us <= row.time_us + 1e-6 and row.wait_us <= row.exposed_us + 1e-6
    assert abs(sum(row.exposed_pct for row in result.comm_by_kind) - result.exposed_comm_pct) < 0.01
    # The profiler's slowdown: against the untraced steps around the window (the 12 after its start but those the
    # trace's compact summary, written on a thread, overlapped; the 4 before it are the warm-up), with the run's
    # noise stated.
    # (Not asserted to lie within that noise: the profiler's per-op bookkeeping is a real cost for this tiny model's
    # ops, 1.0-1.75x beside a busy core; the scenario suite's clean runs check that on the demo's model.) The export
    # (0.4-2 s) is in no step: the window's last step ends before it, the next one's data wait starts after it.
    rows = {json.loads(line)["step"]: json.loads(line)
            for line in (runs["clean"] / "timing_rank0.jsonl").read_text().splitlines()}
    busy = {s for s, row in rows.items() if row["profiler_busy"]}
    # (Step 12 waited for the slowest rank's trace export: left out like the step after a checkpoint.)
    assert [s for s, row in rows.items() if row["after_pause"]] == [12]
    after = [s for s, row in rows.items() if s > 11 and not row["profiler_busy"] and not row["after_pause"]]
    slowdown = result.profiler_slowdown
    assert slowdown is not None and (slowdown["steps_before"], slowdown["steps_after"]) == (4, min(12, len(after)))
    assert slowdown["ratio"] is not None and slowdown["noise_pct"] is not None
    assert [s for s, row in rows.items() if row["traced"]] == list(range(6, 12))
    ordinary = sorted(row["step_s"] for step, row in rows.items() if step > 11 and step not in busy)
    assert rows[11]["step_s"] < 3 * ordinary[len(ordinary) // 2], (rows[11], ordinary)
