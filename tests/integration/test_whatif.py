"""The what-if model against an experiment (issue 26's test): a plain GPT-2 ``Trainer`` on 2 CPU ranks (gloo) whose
rank 1 collator sleeps 80 ms on every step. ``hf-distprof analyze --json`` of its traces must predict, for rank 1 at
its peer's pace, the step time of the same run measured without the slowdown, within 15%; and the answer must say
so: "what to fix first" opening the findings, rank 1's data loading on the critical path, the JSON fields users read.

The design: one run whose slowdown goes on and off with the profiler's windows. After 4 untraced steps (the run's
warm-up), the profiler records 9 windows of 4 steps, each after 1 wait and 1 warm-up step; rank 1 sleeps in every
step of windows 1, 3, 5, 7 and 9 (and their wait and warm-up steps) and in none of windows 2, 4, 6 and 8.
``analyze`` reads the 5 slowed windows' traces only: in each step it sees, rank 1 is slowed by 80 ms. The reference,
"the same run measured without the slowdown", is the step timer's median step (mean over the ranks) over the 4 plain
windows' 16 recorded steps.

Why this design and not another:

- Not a second, plain run: on this 2-core machine shared with other work, two runs of the same plain script a few
  seconds apart measured 32 and 53 ms per step; a reference that moves by more than 15% between runs cannot check a
  15% bound.
- Not a plain stretch, then the slowdown: a run with its plain window first and its slowed window second missed by
  -17% to +42%, and in plain / slowed / slowed / plain runs the two plain windows alone differed by up to 2.5x (the
  load drifts within seconds). Windows taken in turn, a second or two apart, see the same load; the plain ones sit
  among the slowed ones, so that both sides have the same mean position in the run.
- Not untraced steps as the reference: the model replays traced steps, which carry the profiler's own cost (on CPU,
  up to 1.75x for this script's small ops beside a busy core); the plain windows are traced the same way.
- Not the slowdown on every other batch within one window (this test's first version): half the analysed steps
  then hold no slowdown, which is not the slowed run the issue asks about.
- The reference is the step timer's (``timing_rank{R}.jsonl``), not the traces the model reads, and a median over
  the steps, not a mean (one step that waited for a CPU moves a mean of 16 by several %).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

PLAIN = Path(__file__).with_name("plain_trainer.py")
SLOW_S = 0.08
SKIP, WAIT, WARMUP, ACTIVE, WINDOWS = 4, 1, 1, 4, 9
CYCLE = WAIT + WARMUP + ACTIVE
# Batch 128: 140-180 ms of work per step beside a busy core, against the 80 ms sleep. A long step averages the host's
# scheduling noise over more time slices: at batch 32 (45-55 ms steps) the same design read -25% to +15%
# beside a busy core at load average 7-13.
FLAGS = ["--output_dir", "out", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
         "--save_strategy", "no", "--max_steps", str(SKIP + WINDOWS * CYCLE), "--per_device_train_batch_size", "128",
         "--enable-profiling", "--profiler-output-dir", "P", "--profiler-run-name", "run",
         "--profiler-skip-first", str(SKIP), "--profiler-wait-steps", str(WAIT),
         "--profiler-warmup-steps", str(WARMUP), "--profiler-active-steps", str(ACTIVE),
         "--profiler-repeat", str(WINDOWS)]
# Rank 1's collator sleeps in blocks of one window's steps, from the first window's first step on: the k-th batch is
# collated in step k - 1, and the first window starts at step SKIP + 1.
SLEEP = f"1:{SLOW_S}:1:{SKIP + 2}:{CYCLE}"


def _window(step: int) -> tuple[int, bool]:
    """The profiler window a step (the step timer's and the traces' numbering, from 1) belongs to, from 0, and
    whether the step is one of its recorded steps."""
    return (step - SKIP - 1) // CYCLE, (step - SKIP - 1) % CYCLE >= WAIT + WARMUP


@pytest.fixture  # each test trains its own run: a rerun (below) must be a new experiment, not the same data again
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank run, rank 1's collator asleep in every other profiler window; ``hf-distprof analyze --json`` of the
    slowed windows' traces."""
    cwd = tmp_path_factory.mktemp("whatif")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1", "PLAIN_COLLATOR_SLEEP": SLEEP}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), *FLAGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = cwd / "P" / "run"
    traces = sorted(folder.glob("rank*.pt.trace.json.gz"))
    # rank{R}_{host}_step{first}-{last}.pt.trace.json.gz: one per rank and window.
    windows = {path: _window(int(path.name.split("_step")[1].split("-")[0]))[0] for path in traces}
    assert sorted(windows.values()) == sorted(2 * list(range(WINDOWS))), [p.name for p in traces]
    slowed = [str(p) for p, w in windows.items() if w % 2 == 0]
    out = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "analyze", *slowed, "--json"],
                         capture_output=True, text=True, env=env, timeout=180, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    rows: dict[int, list[dict[str, Any]]] = {}
    for rank in (0, 1):
        for line in (folder / f"timing_rank{rank}.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows.setdefault(row["step"], []).append(row)
    return {"analysis": json.loads(out.stdout), "rows": rows}


@pytest.mark.flaky(reruns=1, reason=(
    "a statistical scenario: the prediction and its reference come from windows a second apart on 2 shared cores "
    "whose speeds change by ~20% for seconds at a time; in November 2026 one run in three or four failed on a busy "
    "host, the code before and after issue 30 alike: half of those replayed the wrong rank (mended on 30 November: "
    "10 of 10 since, predictions within +0.1% to +13.7%), the rest missed 15%"))
def test_rank_1_at_its_peer_s_pace_predicts_the_run_without_the_slowdown(run: dict[str, Any]) -> None:
    analysis, rows = run["analysis"], run["rows"]
    recorded = {s: _window(s)[0] for s in rows if s > SKIP and _window(s)[1]}
    assert len(recorded) == WINDOWS * ACTIVE and all(len(rows[s]) == 2 for s in recorded), sorted(rows)
    # The experiment is what it says: rank 1 slept in every step the analysis read, and in none of the reference's.
    loading = {s: 1e3 * rows[s][1]["data_load_s"] for s in recorded}
    slowed = sorted(s for s, w in recorded.items() if w % 2 == 0)
    plain = sorted(s for s, w in recorded.items() if w % 2 == 1)
    assert all(loading[s] > 1e3 * SLOW_S for s in slowed), {s: round(loading[s], 1) for s in slowed}
    assert all(loading[s] < 0.5e3 * SLOW_S for s in plain), {s: round(loading[s], 1) for s in plain}
    assert analysis["what_if_model"]["steps"] == slowed, analysis["what_if_model"]["steps"]
    # The reference: the step timer's steps of the plain windows, those the trace's compact-summary thread did not
    # overlap (the step timer's own rule for the steps it judges).
    judged = [s for s in plain if not any(row["profiler_busy"] for row in rows[s])]
    assert len(judged) >= ACTIVE * (WINDOWS // 2) - 3, (plain, judged)
    measured = median(sum(row["step_s"] for row in rows[s]) / 2 * 1e3 for s in judged)
    scenario = {row["scenario"]: row for row in analysis["what_if"]}["slow_rank"]
    assert scenario["ranks"] == [1] and scenario["step_ms_now"] > measured + 0.5e3 * SLOW_S, scenario
    predicted = scenario["step_ms_predicted"]
    error = predicted / measured - 1
    print(f"what-if: predicted {predicted:.2f} ms, measured without the slowdown {measured:.2f} ms "
          f"({100 * error:+.1f}%), slowed {scenario['step_ms_now']:.2f} ms; load average {os.getloadavg()[0]:.1f}")
    assert abs(error) < 0.15, (
        f"predicted {predicted:.2f} ms per step for rank 1 at its peer's pace (slowed: {scenario['step_ms_now']:.2f} "
        f"ms); the same run without the slowdown measured {measured:.2f} ms (the step timer's median over steps "
        f"{judged}): {100 * error:+.1f}%, beyond 15%; scenario {scenario}")


@pytest.mark.flaky(reruns=1, reason=(
    "a statistical scenario: by design rank 1 sleeps in half of the run's untraced steps, so the run's verdict weighs "
    "a data-loading excess of 80 ms in half the steps and none in the rest against the other phases' excess, and a "
    "core's slow spell on rank 1 (this VM's cores change speed by ~20% for seconds at a time) once made its backward "
    "compute the larger over the run (CI, November 2026)"))
def test_the_answer_names_rank_1_s_data_loading(run: dict[str, Any]) -> None:
    analysis = run["analysis"]
    # The first finding names rank 1. (Whether the what-if's saving counts as "what to fix first" depends on the run's
    # untraced steps, which weigh every saving on a rank's pace since issue 30: by this test's design half of them are
    # slowed, half not, so the slowdown is not persistent over the run and the answer may be rank 1's data loading.)
    first = analysis["findings"][0]
    assert first["kind"] in ("slow_rank", "what_to_fix_first", "data_loading_bound") and 1 in first["ranks"], first
    assert first["phase"] in ("data", None), first
    if first["kind"] == "what_to_fix_first":  # rank 1's pace, or data loading at zero (on the ranks that load)
        assert first["title"] in ("What to fix first: rank 1 at its peers' median pace",
                                  "What to fix first: data loading at zero on every rank"), first
    else:
        assert first["ranks"] == [1], first
    top = analysis["what_if"][0]  # the table's largest saving, counted or not
    assert top["title"] in ("rank 1 at its peers' median pace", "data loading at zero on every rank"), top
    for seg in analysis["critical_path"]:
        assert set(seg) >= {"rank", "kind", "name", "ms"} and seg["kind"] in ("phase", "collective")
    # Every analysed step is a slowed one: rank 1's sleep sets the median step's time.
    loading = [s for s in analysis["critical_path"] if s["rank"] == 1 and s["name"] == "data_loading"]
    assert loading and loading[0]["ms"] > 0.9e3 * SLOW_S, analysis["critical_path"]
    for row in analysis["what_if"]:
        assert set(row) >= {"scenario", "ranks", "step_ms_now", "step_ms_predicted", "saving_pct", "error_ms"}
