"""A rank that held the others back in a burst of steps: found, said alike by the step timer and analyze, and not
found in a clean run, in one stall of the host, or in a small excess spread over the run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from hf_distprof.core.burst import Burst, find_burst
from hf_distprof.timing.series import StepSeries

DATA = Path(__file__).resolve().parents[1] / "data"


def series(extra: dict[int, float], steps: int = 40, base: float = 0.02) -> tuple[dict[int, list[float]], list[float]]:
    """Two ranks' own work per step (rank 1 ``extra`` s more at the steps given) and the step times."""
    work = {0: [base + 0.001 * (i % 3) for i in range(steps)],
            1: [base + 0.001 * ((i + 1) % 3) + extra.get(i + 2, 0.0) for i in range(steps)]}
    return work, [max(work[0][i], work[1][i]) + 0.01 for i in range(steps)]


def test_a_burst_is_found_with_its_steps_its_cost_and_its_phase() -> None:
    work, times = series({19: 0.3, 20: 0.3, 21: 0.3, 22: 0.3, 23: 0.3})
    steps = list(range(2, 42))
    phases = {"data": {0: [0.001] * 40, 1: [0.001 + 0.3 * (19 <= s <= 23) for s in steps]},
              "compute": {0: work[0], 1: [w - 0.3 * (19 <= s <= 23) for w, s in zip(work[1], steps)]}}
    b = find_burst(work, steps, times, 10.0, phases)
    assert b is not None and (b.rank, b.steps, b.phase) == (1, [19, 20, 21, 22, 23], "data")
    excess = sum(work[1][s - 2] - work[0][s - 2] for s in range(19, 24))
    assert b.excess_s == pytest.approx(excess) and b.run_s == pytest.approx(sum(times))
    assert b.pct == pytest.approx(100 * excess / sum(times))
    assert b.span == "steps 19-23"
    # The compute part is the own work before the sync less the loading: no optimizer in it.
    assert "(its forward and backward compute)" in Burst(1, [3, 4, 5], 0.3, 20.0, 1.5, "compute").message
    assert b.message.startswith(f"Rank 1 held the others back in a burst: steps 19-23, its own work {excess:.3f} s "
                                "over its peers' in all (its data loading),")


def test_a_slowness_in_every_other_step_is_said_as_such_with_the_verdict_s_own_reason() -> None:
    # A trial: rank 1's loader 30 ms slower in every other batch; the verdict over the run, on the median step, stayed
    # quiet under the threshold, and the finding said "in a burst (steps 3, 5, ... 59)" and "slowest in too few steps"
    # beside a verdict that had it slowest in 35 of 53.
    work, times = series({s: 0.030 for s in range(3, 55, 2)}, steps=53)
    steps = list(range(2, 55))
    b = find_burst(work, steps, times, 10.0, None, None, "threshold")
    assert b is not None and b.rank == 1 and len(b.steps) == 26 and b.judged == 53
    assert b.what == "in 26 of 53 judged steps"
    assert b.span == "steps 3, 5, 7, 9, 11, 13, ..., 51, 53"
    assert b.against == ("not the slow rank of the run: the verdict over the run, which judges the median step, is "
                         "quiet, under the threshold")
    assert b.message.startswith("Rank 1 held the others back in 26 of 53 judged steps: steps 3, 5, 7, 9, 11, 13, ...,")
    # Quiet for its persistence (or not said why): as before.
    assert find_burst(work, steps, times, 10.0).against == "not the slow rank of the run: slowest in too few steps"
    assert find_burst(work, steps, times, 10.0, gate="persistence").against.endswith("slowest in too few steps")


def test_no_burst_in_a_clean_run_in_one_stall_or_in_a_small_excess_over_the_run() -> None:
    steps = list(range(2, 42))
    work, times = series({})
    assert find_burst(work, steps, times, 10.0) is None
    # One stall of 0.28 s (a host's hiccup), and two small ones beside it: no burst (a trial's clean run).
    work, times = series({26: 0.28, 24: 0.004, 27: 0.004})
    assert find_burst(work, steps, times, 10.0) is None
    # 3 ms more in every step (15% of the step): the verdict's to judge, not a burst.
    work, times = series({s: 0.003 for s in steps})
    assert find_burst(work, steps, times, 10.0) is None
    # A real burst, too small a share of the run to matter (3 x 10 ms over 40 x 30 ms).
    work, times = series({20: 0.01, 21: 0.01, 22: 0.01})
    assert find_burst(work, steps, times, 10.0) is None
    assert find_burst({0: [1.0]}, [1], [1.0], 10.0) is None  # one rank: nobody waited


def test_the_same_rank_s_long_stalls_are_said_apart_from_a_burst_and_hiccups_are_not() -> None:
    # A trial: rank 1's loader stalled 2 s at steps 14 and 34 (a third of the run); only the anomaly captures said it,
    # naming both ranks alike (under DDP both steps take the stall).
    steps = list(range(2, 42))
    work, times = series({14: 2.0, 34: 2.0})
    b = find_burst(work, steps, times, 10.0)
    assert b is not None and (b.rank, b.steps, b.stalls) == (1, [14, 34], True)
    assert b.message.startswith("Rank 1 held the others back in stalls: steps 14, 34, its own work ")
    assert b.to_json()["stalls"] is True
    # One such stall: a hiccup, unless it alone cost the run a quarter of its time (here 61%: its peer waited 2 s;
    # trial U's 35 s stall was 76% of its run, and said nowhere): said once, as a wait, not as the rank's pattern.
    work, times = series({14: 2.0})
    one = find_burst(work, steps, times, 10.0)
    assert one is not None and (one.rank, one.steps, one.stalls, one.single) == (1, [14], True, True)
    assert one.message.startswith("Rank 1 held the others back in one stall: step 14, its own work 2.0")
    assert one.message.endswith("the others waited for it there (once: one stall says nothing of its usual speed; "
                                "--profile-on-anomaly traces the steps after one)")
    work, times = series({14: 2.0, 30: 0.2})  # a small stall elsewhere leaves it one stall (the review)
    one = find_burst(work, steps, times, 10.0)
    assert one is not None and (one.steps, one.single) == ([14], True)
    work, times = series({14: 0.3})  # 0.3 s, 8% of the run: a hiccup
    assert find_burst(work, steps, times, 10.0) is None
    # Many small ones spread over the run (each under half the median step): no stalls.
    work, times = series({s: 0.014 for s in range(4, 41, 3)})
    assert find_burst(work, steps, times, 10.0) is None
    # Every rank stalling alike (each its own steps): a shared cause, not one rank's stalls.
    alike = {0: [w + (1.0 if i in (9, 29) else 0.0) for i, w in enumerate(series({})[0][0])],
             1: [w + (1.0 if i in (12, 32, 22) else 0.0) for i, w in enumerate(series({})[0][1])]}
    assert find_burst(alike, steps, [max(a, b) + 0.01 for a, b in zip(alike[0], alike[1])], 10.0) is None
    # Two long stalls back to back are a burst's to judge (too short for one): not stalls.
    work, times = series({14: 2.0, 15: 2.0})
    assert find_burst(work, steps, times, 10.0) is None


def test_beside_a_slow_rank_its_stalls_are_said_beyond_its_usual_excess_and_its_noise_is_not() -> None:
    # A trial: rank 1 named slow (0.9 ms more loading per step) stalled 60 ms in three steps, half the run: unsaid.
    steps = list(range(2, 42))
    slow = {s: 0.004 for s in steps}  # rank 1 4 ms (20%) over its peer in every step
    work, times = series({**slow, 14: 0.304, 34: 0.304})
    b = find_burst(work, steps, times, 10.0, slow_rank=1)
    assert b is not None and (b.rank, b.steps, b.stalls, b.beside) == (1, [14, 34], True, 1)
    usual = 0.005  # its median excess: 4 ms, and the rows' wobble (+1, +1, -2 ms in turn)
    excess = sum(work[1][s - 2] - work[0][s - 2] - usual for s in (14, 34))
    assert b.excess_s == pytest.approx(excess) and excess == pytest.approx(0.597)
    assert b.message.startswith("Rank 1 also held the others back in stalls: steps 14, 34, its own work "
                                f"{excess:.3f} s over its peers' in all, beyond its usual excess, ")
    assert b.message.endswith("(on top of its usual excess, which the slow-rank verdict names)")
    assert b.to_json()["beside"] == 1
    # Its burst too (0.3 s in steps 19-23), and another rank's stalls: said, counted over the slow rank's work there.
    work, times = series({**slow, **{s: 0.3 for s in range(19, 24)}})
    b = find_burst(work, steps, times, 10.0, slow_rank=1)
    assert b is not None and (b.rank, b.steps, b.stalls) == (1, [19, 20, 21, 22, 23], False)
    assert b.message.startswith("Rank 1 also held the others back in a burst: steps 19-23")
    work, times = series(slow)
    work[0] = [w + (0.5 if s in (14, 34) else 0.0) for w, s in zip(work[0], steps)]
    times = [max(a, b) + 0.01 for a, b in zip(work[0], work[1])]
    b = find_burst(work, steps, times, 10.0, slow_rank=1)
    assert b is not None and (b.rank, b.steps, b.beside) == (0, [14, 34], 1)
    assert b.message.startswith("Rank 0 held the others back in stalls") and b.message.endswith(
        "(besides rank 1, the slow rank of the run)")
    assert "beyond its usual excess" not in b.message and b.usual_s == 0.0  # (it has none: a trial's wording)


def test_beside_a_slow_rank_how_it_is_slow_is_no_burst_nor_stalls() -> None:
    # Its excess alone (4 ms every step); an excess that wobbles (15 or 25 ms in turn); two levels (20 ms in 21 steps,
    # 200 ms in 19: half the run, not a few stalls); a drift (0 to 250 ms over the run, with 40 ms of noise): the
    # verdict's to say, all of it.
    import random

    steps = list(range(2, 42))
    work, times = series({s: 0.004 for s in steps})
    assert find_burst(work, steps, times, 10.0, slow_rank=1) is None
    work, times = series({s: 0.015 + 0.01 * (s % 2) for s in steps})
    assert find_burst(work, steps, times, 10.0, slow_rank=1) is None
    rng = random.Random(7)
    high = set(rng.sample(steps, 19))
    work, times = series({s: 0.2 if s in high else 0.02 for s in steps})
    assert find_burst(work, steps, times, 10.0) is not None  # (no verdict: a burst it would be)
    assert find_burst(work, steps, times, 10.0, slow_rank=1) is None
    for seed in range(50):
        rng = random.Random(seed)
        work, times = series({s: 0.25 * (s - 2) / 39 + rng.uniform(-0.02, 0.02) for s in steps})
        assert find_burst(work, steps, times, 10.0, slow_rank=1) is None, seed


def test_the_step_timer_table_says_the_burst_its_series_holds() -> None:
    s = StepSeries(2)
    work, times = series({19: 0.3, 20: 0.3, 21: 0.3, 22: 0.3})
    rows = [[[step, times[i], work[r][i], times[i]] for i, step in enumerate(range(2, 42))] for r in (0, 1)]
    s.add(rows)
    b = s.burst(10.0)
    assert isinstance(b, Burst) and (b.rank, b.steps) == (1, [19, 20, 21, 22])
    assert s.burst(10.0, exclude=lambda step: 19 <= step <= 22) is None  # the profiler's steps are not judged


def slowed_loading(run: Path, extra: Callable[[dict], float]) -> Path:
    """A copy of the clean 2-rank golden run at ``run`` with rank 1's data loading ``extra(row)`` seconds longer in each
    of its rows (its peer's wait and both ranks' steps growing alike)."""
    shutil.copytree(DATA / "golden" / "cpu_clean_memory", run)
    for rank in (0, 1):
        path = run / f"timing_rank{rank}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            more = extra(row)
            keys = ("data_s", "data_load_s", "pre_sync_s", "own_work_s") if rank == 1 else ("wait_s",)
            for key in (*keys, "step_s", "own_step_s"):
                row[key] += more
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


def test_analyze_names_the_burst_from_the_step_timer_s_records(tmp_path: Path) -> None:
    # The clean 2-rank run with rank 1's data loading stalled 0.3 s in steps 15-18 (its peer's wait grows alike).
    run = slowed_loading(tmp_path / "burst", lambda row: 0.3 if 15 <= row["step"] <= 18 else 0.0)
    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box

    result = analyze_paths([run], AnalysisOptions(workers=1))
    burst = next(f for f in result.findings if f.kind == "burst")
    assert burst.ranks == [1] and burst.title == "Rank 1 held the others back in a burst (steps 15-18)"
    assert burst.numbers["burst_steps"] == 4 and burst.phase == "data"
    assert "the others waited for it there; most of it in its data loading" in burst.evidence
    assert "Rank 1 held the others back in a burst (steps 15-18)" in format_box(result)
    # The same run as it was: no burst.
    clean = analyze_paths([DATA / "golden" / "cpu_clean_memory"], AnalysisOptions(workers=1))
    assert all(f.kind != "burst" for f in clean.findings)


def test_analyze_says_the_slow_rank_s_stalls_after_its_verdict(tmp_path: Path) -> None:
    # The clean run with rank 1's loading 30% of a step longer in every step (its verdict raised), and 0.3 s more in
    # steps 15 and 24: the slow-rank finding first, its stalls beside it, and the box's "Also" names them.
    run = slowed_loading(tmp_path / "slow_and_stalls",
                         lambda row: 0.3 * row["step_s"] + (0.3 if row["step"] in (15, 24) else 0.0))
    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box

    result = analyze_paths([run], AnalysisOptions(workers=1))
    kinds = [f.kind for f in result.findings]
    assert "burst" in kinds and kinds.index("burst") > 0 and result.findings[0].ranks == [1]
    burst = result.findings[kinds.index("burst")]
    assert burst.title == "Rank 1 also held the others back in stalls (steps 15, 24)" and burst.phase == "data"
    assert "beyond its usual excess" in burst.evidence and "which the slow-rank verdict names" in burst.evidence
    box = " ".join(" ".join(line.strip("|").split()) for line in format_box(result).splitlines())
    assert "Also: 2 more finding(s): Slow to resume after collectives; Rank 1 also held the others back in stalls " \
        "(steps 15, 24)" in box


def test_the_profiler_s_slowdown_closes_the_findings_whatever_its_severity() -> None:
    # A trial: the box's verdict was "The profiler slows the traced steps" (severity 58: a share of the traced steps)
    # over "Rank 1 held the others back in stalls" (18% of the run). The slowdown is a caveat about the trace: last.
    from hf_distprof.analysis.judge.findings import in_order
    from hf_distprof.analysis.results.findings import Judgement

    slowdown = Judgement(kind="profiler_slowdown", severity=58.0, ranks=[], facts=None)
    stalls = Judgement(kind="burst", severity=18.0, ranks=[1], facts=None)
    comm = Judgement(kind="communication_bound", severity=31.0, ranks=[0], facts=None)
    assert [j.kind for j in in_order([slowdown, stalls, comm])] == ["communication_bound", "burst", "profiler_slowdown"]
    assert in_order([slowdown]) == [slowdown]  # alone, it is still the verdict


def test_a_burst_of_the_rank_a_slow_rank_finding_names_is_not_said_again(tmp_path: Path) -> None:
    # A trial's run stopped by Ctrl-C after 4 judged steps: its window named rank 0 slow ("Rank 0 holds the others
    # back"), and a burst over the 4 steps said the same wait again as "not the slow rank of the run: slowest in too
    # few steps". The run's verdict, too short, is undecided: a burst alone says so.
    from hf_distprof.analysis import AnalysisOptions, analyze_paths

    for rank in (0, 1):
        shutil.copy(DATA / "slow_rank1" / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
        rows = [{"step": s, "step_s": 0.5, "own_work_s": 0.1 + (0.3 if rank == 1 and s > 7 else 0.0),
                 "own_step_s": 0.5, "cpu_wait_s": 0.0, "warmup": s == 1, "traced": 2 <= s <= 7} for s in range(1, 12)]
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = analyze_paths(sorted(tmp_path.glob("rank-*.json.gz")), AnalysisOptions(workers=1))
    kinds = [f.kind for f in result.findings]
    assert "slow_rank" in kinds and "burst" not in kinds, kinds
    work = {0: [0.1] * 4, 1: [0.4] * 4}
    alone = find_burst(work, [8, 9, 10, 11], [0.5] * 4, 10.0, None, None, "undecided")
    # (Not "not the slow rank of the run": a verdict too short to decide says nothing either way; a trial's live line
    # said so of a rank slowed in 5 of 5 judged steps, which `analyze` named slow across the run.)
    assert alone is not None and alone.against == ("the verdict over the run has too few steps to decide whether it "
                                                   "is the run's slow rank")
