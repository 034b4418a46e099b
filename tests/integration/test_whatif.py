"""The what-if model against an experiment: a plain GPT-2 ``Trainer`` on 2 CPU ranks whose rank 1 collator sleeps
80 ms on every other batch. Replaying the traced steps with rank 1 at its peer's pace must predict the step time of
the same run's steps without the slowdown (within 15%), and the answer must say so: rank 1's data loading on the
critical path of a slowed step, "what to fix first" opening the findings, the JSON fields users read.

Why one run and not a slowed run against a plain one: on this 2-core machine shared with other work, two runs of
the same plain script a few seconds apart measured 32 and 53 ms per step (the CPU share each rank gets drifts with
the load), so a second run is no reference within 15%; slowed and plain steps taken in turn within one traced window
see the same load.

The model takes each rank's work as measured. On a host with fewer free cores than runnable threads that stops being
true: removing a rank's sleep changes the CPU share every rank gets (beside a busy core with the machine at load
average 6, the ranks waited for a CPU 20-50 ms of 56-76 ms steps, and the slowed steps' work ran 30% faster than the
plain steps'). The step timer measures that wait (``cpu_wait_s`` in ``timing_rank{R}.jsonl``), so the bound is 15%
when the ranks got their CPUs and widens by the share of the plain steps spent waiting for one when they did not.
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
TRACED = 12  # 6 slowed steps and 6 plain ones
# Batch 32: about 40 ms of work per step beside the 80 ms sleep, so that scheduler noise is a smaller share of it.
FLAGS = ["--output_dir", "out", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
         "--save_strategy", "no", "--max_steps", str(TRACED + 4), "--per_device_train_batch_size", "32",
         "--enable-profiling", "--profiler-output-dir", "P", "--profiler-run-name", "run",
         "--profiler-wait-steps", "2", "--profiler-warmup-steps", "1", "--profiler-active-steps", str(TRACED)]


@pytest.fixture(scope="module")
def analysis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``hf-distprof analyze --json`` of one 2-rank run whose rank 1 collator sleeps on every other batch."""
    cwd = tmp_path_factory.mktemp("whatif")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1", "PLAIN_COLLATOR_SLEEP": f"1:{SLOW_S}:2"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), *FLAGS]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(cwd / "P" / "run"), "--json"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return {**json.loads(out.stdout), "run_dir": str(cwd / "P" / "run")}


def _steps(analysis: dict[str, Any]) -> tuple[list[int], dict[int, float]]:
    """The slowed steps (rank 1 fetched its batch for more than half the sleep), and each step's mean time (ms)."""
    per_step: dict[int, list[dict[str, Any]]] = {}
    for rank in analysis["ranks"]:
        for step in rank["steps"]:
            per_step.setdefault(step["step"], []).append(step)
    slowed = sorted(s for s, rows in per_step.items() if any(r["cpu"]["data_loading_us"] > 500 * SLOW_S * 1e3
                                                              for r in rows))
    return slowed, {s: sum(r["duration_us"] for r in rows) / len(rows) / 1e3 for s, rows in per_step.items()}


def _cpu_wait_share(run: Path, steps: list[int], step_ms: dict[int, float]) -> float:
    """Of ``steps``, the median share of the step the ranks spent waiting for a CPU (the step timer's ``cpu_wait_s``,
    mean over the ranks)."""
    wait: dict[int, list[float]] = {}
    for log in sorted(run.glob("timing_rank*.jsonl")):
        for line in log.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("step") in steps and isinstance(row.get("cpu_wait_s"), (int, float)):
                wait.setdefault(row["step"], []).append(1e3 * row["cpu_wait_s"])
    assert sorted(wait) == sorted(steps), f"no cpu_wait_s for every step: {sorted(run.glob('timing_rank*'))}"
    return median(sum(w) / len(w) / step_ms[s] for s, w in wait.items())


def test_rank_1_at_its_peer_s_pace_predicts_the_steps_without_the_slowdown(analysis: dict[str, Any]) -> None:
    slowed, step_ms = _steps(analysis)
    assert len(slowed) == TRACED // 2, (slowed, step_ms)  # every other step: the collator's sleeps land in turn
    plain_steps = sorted(s for s in step_ms if s not in slowed)
    plain = median(step_ms[s] for s in plain_steps)
    scenario = {row["scenario"]: row for row in analysis["what_if"]}["slow_rank"]
    # (Whether this saving clears the noise of its predicted steps is test_the_answer_names_rank_1_s_data_loading's.)
    assert scenario["ranks"] == [1] and scenario["saving_ms"] > 0, scenario
    predicted = scenario["step_ms_predicted"]
    error = abs(predicted - plain) / plain
    contention = _cpu_wait_share(Path(analysis["run_dir"]), plain_steps, step_ms)
    bound = 0.15 if contention < 0.10 else 0.15 + contention
    assert error < bound, (f"predicted {predicted:.2f} ms for rank 1 at its peer's pace; the same run's steps without "
                           f"the slowdown measured {plain:.2f} ms ({100 * error:.1f}% off; bound {100 * bound:.0f}%, "
                           f"the ranks waited for a CPU {100 * contention:.0f}% of those steps); steps {step_ms}, "
                           f"slowed {slowed}; scenario {scenario}")


def test_the_answer_names_rank_1_s_data_loading(analysis: dict[str, Any]) -> None:
    slowed, _ = _steps(analysis)
    # The measured steps are bimodal (slowed and plain in turn); each saving is judged against the noise of the
    # steps it predicts, which the fix makes unimodal, so the answer opens the findings.
    first = analysis["findings"][0]
    assert first["kind"] == "what_to_fix_first" and 1 in first["ranks"], first
    assert first["title"] in ("What to fix first: rank 1 at its peers' median pace",
                              "What to fix first: every rank at the fastest rank's (rank 0) pace",
                              "What to fix first: data loading at zero on every rank")
    for seg in analysis["critical_path"]:
        assert set(seg) >= {"rank", "kind", "name", "ms"} and seg["kind"] in ("phase", "collective")
    if analysis["what_if_model"]["median_step"] in slowed:  # the median step may be a plain one
        loading = [s for s in analysis["critical_path"] if s["rank"] == 1 and s["name"] == "data_loading"]
        assert loading and loading[0]["ms"] > 0.9 * SLOW_S * 1e3, analysis["critical_path"]
    for row in analysis["what_if"]:
        assert set(row) >= {"scenario", "ranks", "step_ms_now", "step_ms_predicted", "saving_pct", "error_ms"}
