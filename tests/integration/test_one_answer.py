"""One answer on real runs: a user's plain GPT-2 Trainer script on 2 CPU ranks (gloo) at the default profiler schedule,
balanced, and with rank 1 sleeping in its collator for ~5% of a step (under the 10% threshold: the case where the box
once said "nothing to fix" while the what-if table counted a 6% saving). The live verdict at train end and ``analyze``
name the same rank with the same status; the box, the findings and the what-if table tell one story.
"""

from __future__ import annotations

import json
from statistics import median
from typing import Any

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box

from .test_slow_collator import train

pytestmark = pytest.mark.integration

OPTS = AnalysisOptions(workers=1)
RANK_KINDS = {"slow_rank", "straggler", "imbalance"}
SLOW5 = 0.05  # of a balanced step, slept by rank 1's collator per batch in the run "slow5"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("one_answer")
    balanced = train(tmp, "balanced", 24, crossover=True)
    step_s = json.loads((balanced / "timing_summary.json").read_text())["step_mean_s"]
    # Both runs cross their ranks over the cores: a rank held on a core in its slow mode (~20%) for the whole run
    # is slower by far more than a 5% sleep on the other.
    return {"balanced": balanced, "slow5": train(tmp, "slow5", 24, sleep=SLOW5 * step_s, crossover=True),
            "sleep_s": SLOW5 * step_s}


@pytest.mark.parametrize("name", ["balanced", "slow5"])
def test_live_and_offline_say_the_same_and_every_part_agrees(runs: dict[str, Any], name: str) -> None:
    folder = runs[name]
    live = json.loads((folder / "timing_summary.json").read_text())["imbalance_verdict"]
    result = analyze_paths([folder], OPTS)
    cross = result.cross_rank
    assert cross is not None and cross.imbalance_verdict is not None
    # The same steps, the same rule: the same status, candidate and effect as the live verdict at train end.
    offline = cross.imbalance_verdict
    assert (offline.status, offline.rank, offline.steps) == (live["status"], live["rank"], live["steps"]), name
    assert offline.effect_pct == pytest.approx(live["effect_pct"]), name
    if live["status"] != "undecided":
        assert cross.straggler_verdict is not None and cross.straggler_verdict.status == live["status"]
    named = {r for f in result.findings if f.kind in RANK_KINDS for r in f.ranks}
    assert named == ({live["rank"]} if live["status"] == "raised" else set()), (name, live["reason"])
    # The what-if's slowest rank is the one the live table marks: the verdict's candidate, or a burst's beside a quiet
    # verdict (its peers waited for it there); a saving on a rank's pace counts only when the verdict engine calls
    # that rank's excess real over the run.
    model = result.what_if_model
    summary = json.loads((folder / "timing_summary.json").read_text())
    burst = summary["burst"]
    marked = burst["rank"] if burst and burst.get("beside") is None and live["status"] != "raised" else live["rank"]
    assert summary["slowest_rank"] == marked, (summary["slowest_rank"], burst, live["reason"])
    assert model is not None and model.slowest_rank == marked and model.run_steps == live["steps"]
    assert result.cross_rank.slowest_rank == marked, result.cross_rank.slowest_by
    counted = [s for s in result.what_if if s.beyond_noise]
    first = [f for f in result.findings if f.kind == "what_to_fix_first"]
    worth = [s for s in counted if s.counted_pct > OPTS.what_if_pct]  # a rank's pace: no more than over the run
    assert bool(first) == bool(worth), name
    box = format_box(result)
    if not result.findings:
        assert "| Verdict: no finding" in box
        top = max(result.what_if, key=lambda s: s.counted_pct)
        if top.counted_pct > 0:  # the box names the largest saving that counts, and why it is no finding
            # (why a saving does not count, as the what-if table's `counts` column says it)
            said = "under the 10% worth fixing" if top.beyond_noise else {
                "verdict": "is not one the slow-rank verdict calls real",
                "one step": "cannot be told from noise in one traced step"}.get(top.not_counted or "",
                                                                                "is within the run's noise")
            assert said in " ".join(line.strip("| ") for line in box.splitlines()), box
    if name == "slow5":
        # The experiment is what it says: rank 1's data loading is the longer by about the sleep. Which rank the
        # verdict leans to under its threshold is the run's noise (beside a busy core rank 0 once led by 3.7%, the
        # sleep ~7% of the own work it is judged on). The medians over the steps: one step of rank 0 preempted in its
        # loader by the busy core moved the means' difference to half the sleep.
        data = {r: median(row["data_load_s"] for row in map(json.loads, (folder / f"timing_rank{r}.jsonl").open())
                          if not row["warmup"]) for r in (0, 1)}
        assert data[1] - data[0] > 0.5 * runs["sleep_s"], (data, runs["sleep_s"])
        # A rank it names is rank 1, or a rank whose machine made it slower, for the cause that says so. Beside a busy
        # core the other process can sit with one rank for a whole run of 1 s, which slows that rank's compute on the
        # same tokens (a shared core's cache, its hyperthread sibling) with little of it counted as a wait for a CPU:
        # CI once named rank 0, 14.5% over rank 1 in 14 of 17 steps. That is true, and said as its machine's doing.
        if live["status"] == "raised" and live["rank"] != 1:
            cause = json.loads((folder / "timing_summary.json").read_text())["slow_rank_cause"]
            slow = [f for f in result.findings if f.kind == "slow_rank"]
            assert cause["cause"] in {"cpu_wait", "slower_machine"} and not cause["more_work_too"], (live, cause)
            assert [f.cause for f in slow] == [cause["cause"]], (cause, slow)
