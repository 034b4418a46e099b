"""One answer from all the run's evidence: the step timer's verdict over the untraced steps decides which rank holds the
others back, the traced window is one more sample (never a veto), and every part of the output says the same thing.

The committed 2-rank gloo traces (steps 2-7) are paired with step timer records written here (steps 1-30, step 1 the
timer's warm-up, 2-7 traced): rank 1's own work 30% above rank 0's in every untraced step, or the ranks balanced.
The traced steps' rows stay balanced: the analysis judges busy time in the window on the timer's own work there, and
these runs are about a window that disagrees with the rest of the run.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box, format_findings, format_summary
from hf_distprof.core.run_verdict import decided, follow_the_run, verdict_from_json
from hf_distprof.core.verdicts import judge_own_work

DATA = Path(__file__).resolve().parents[1] / "data"
OPTS = AnalysisOptions(workers=1)
STEPS = range(1, 31)
TRACED = range(2, 8)


def _rows(rank: int, slow_rank: int | None, excess: float) -> list[dict[str, object]]:
    rows = []
    for s in STEPS:
        wobble = 0.002 * ((s * 7 + rank * 3) % 5 - 2)  # deterministic step-to-step noise, +-4 ms
        extra = excess * 0.1 if rank == slow_rank and s not in TRACED else 0.0
        data = 0.02 + extra
        own = 0.1 + wobble + extra
        rows.append({"step": s, "step_s": 0.2 + wobble, "own_work_s": own, "own_step_s": 0.2 + wobble,
                     "cpu_wait_s": 0.0, "data_s": data + wobble, "forward_s": 0.03, "backward_s": 0.05,
                     "optimizer_s": 0.01, "warmup": s == 1, "traced": s in TRACED})
    return rows


def run_folder(tmp_path: Path, traces: str, slow_rank: int | None, excess: float = 0.3) -> list[Path]:
    for rank in (0, 1):
        shutil.copy(DATA / traces / f"rank-{rank}.json.gz", tmp_path / f"rank-{rank}.json.gz")
        rows = _rows(rank, slow_rank, excess)
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz"]


def test_a_rank_slow_across_the_run_is_named_though_the_window_is_quiet(tmp_path: Path) -> None:
    result = analyze_paths(run_folder(tmp_path, "clean", slow_rank=1), OPTS)
    cross = result.cross_rank
    assert cross is not None and cross.imbalance_window is not None
    assert cross.imbalance_window.status == "quiet"  # the balanced traces alone see nothing
    for verdict in (cross.straggler_verdict, cross.imbalance_verdict):
        assert verdict is not None and (verdict.status, verdict.rank, verdict.steps) == ("raised", 1, 23)
        assert verdict.test.endswith("step timer")
    named = [f for f in result.findings if f.ranks == [1]]
    assert named and {f.kind for f in named} & {"slow_rank", "straggler", "imbalance"}
    assert all(f.basis == "trace + step timer" for f in named if f.kind != "what_to_fix_first")
    # The window's disagreement is said, with its steps against the untraced ones.
    assert [n.question for n in result.window_notes] == ["straggler", "imbalance"]
    assert result.window_notes[1].text.startswith("The traced window alone says otherwise (imbalance): ")
    assert "the step timer says rank 1 is slow across the run, and the verdict follows the run" in \
        result.window_notes[1].text
    text = format_findings(result)
    assert result.window_notes[0].text in text
    # One rank story: the what-if's slowest rank is the verdict's, and its saving counts (the run calls it real).
    model = result.what_if_model
    assert model is not None and (model.slowest_rank, model.fastest_rank) == (1, 0)
    assert model.run_steps == 23 and model.run_noise_ms is not None
    box = format_box(result)
    assert "Verdict: Rank 1 holds the others back" in box.splitlines()[1] and "(rank 1)" not in box


def test_the_window_note_counts_the_steps_its_verdict_judged(tmp_path: Path) -> None:
    # Rank 1's trace ends a step early (steps 2-6; rank 0's 2-7): the window's verdict judged the 5 steps both ranks
    # traced, and the note said "its 6 recorded steps" with step 7's time among them.
    paths = run_folder(tmp_path, "clean", slow_rank=1)
    trace = json.loads(gzip.decompress(paths[1].read_bytes()))
    end = next(e["ts"] for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#7")
    trace["traceEvents"] = [e for e in trace["traceEvents"] if not (e.get("ph") == "X" and e["ts"] >= end)]
    paths[1].write_bytes(gzip.compress(json.dumps(trace).encode()))
    result = analyze_paths(paths, OPTS)
    assert result.common_steps == [2, 3, 4, 5, 6] and len(result.window_notes) == 2
    for note in result.window_notes:
        assert note.traced_step_ms == pytest.approx([204.0, 204.0, 202.0, 202.0, 200.0])  # steps 2-6
        assert "its 5 recorded steps (not the profiler's warm-up) took 204, 204, 202, 202, 200 ms" in note.text


def test_a_rank_slow_in_the_window_only_raises_nothing(tmp_path: Path) -> None:
    result = analyze_paths(run_folder(tmp_path, "slow_rank1", slow_rank=None), OPTS)
    cross = result.cross_rank
    assert cross is not None and cross.straggler_window is not None and cross.straggler_window.raised
    assert (cross.straggler_verdict.status, cross.imbalance_verdict.status) == ("quiet", "quiet")
    assert {"straggler", "imbalance", "slow_rank", "what_to_fix_first"}.isdisjoint(f.kind for f in result.findings)
    # The window's lateness names rank 1; its busy time (the timer's own work in the traced steps) does not.
    assert [n.question for n in result.window_notes] == ["straggler"]
    assert "no rank is slow across the run" in result.window_notes[0].text
    # The what-if table does not count a saving on a rank the run does not call slow; the box says no finding.
    rank_savings = [s for s in result.what_if if s.scenario in ("slow_rank", "fastest_pace")]
    assert rank_savings and not any(s.beyond_noise for s in rank_savings)
    assert "| Verdict: no finding" in format_box(result)


def test_the_live_verdict_and_the_analysis_are_the_same_verdict(tmp_path: Path) -> None:
    """What the live step timer judges at train end (the same rows, the same rule) is the analysis's answer."""
    files = run_folder(tmp_path, "clean", slow_rank=1)
    rows = {r: [json.loads(line) for line in (tmp_path / f"timing_rank{r}.jsonl").read_text().splitlines()]
            for r in (0, 1)}
    judged = [s for s in STEPS if s != 1 and s not in TRACED]
    live = judge_own_work({r: [rows[r][s - 1]["own_work_s"] for s in judged] for r in rows}, 10.0,
                          [max(rows[r][s - 1]["own_step_s"] for r in rows) for s in judged])
    verdict = analyze_paths(files, OPTS).cross_rank.imbalance_verdict
    assert (verdict.status, verdict.rank, verdict.effect_pct, verdict.p_value, verdict.steps) == (
        live.status, live.rank, live.effect_pct, live.p_value, live.steps)


def test_a_verdict_round_trips_through_json_and_a_malformed_one_is_ignored() -> None:
    v = judge_own_work({0: [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], 1: [1.3, 1.4, 1.2, 1.3, 1.35, 1.25]}, 10.0, [2.0] * 6)
    back = verdict_from_json(v.to_json())
    assert back == v and decided(back)
    for bad in ({**v.to_json(), "p_value": 2.0}, {**v.to_json(), "rank": "1"}, {**v.to_json(), "steps": 0},
                {k: x for k, x in v.to_json().items() if k != "reason"}, None, [],
                {**v.to_json(), "cost_pct": "x"}, {**v.to_json(), "cost_pct": float("nan")},
                {**v.to_json(), "cost_pct": True}):  # (a review: a severity made of "x" crashed analyze)
        assert verdict_from_json(bad) is None, bad
    window = judge_own_work({0: [1.0, 1.0, 1.0], 1: [1.0, 1.01, 1.0]}, 10.0, [2.0] * 3)
    followed = follow_the_run(window, v)
    assert (followed.status, followed.rank, followed.p_value) == (v.status, v.rank, v.p_value)
    assert followed.reason.startswith(f"over the run's 6 untraced steps the step timer says: {v.reason}; the traced "
                                      "window (3 steps) alone says otherwise: ")
    # A window too short to decide neither agrees nor disagrees (it said "agrees: not enough evidence: ..." beside a
    # window figure above the threshold).
    short = judge_own_work({0: [1.0, 1.0], 1: [1.3, 1.35]}, 10.0, [2.0] * 2)
    assert short.status == "undecided"
    quiet = judge_own_work({0: [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], 1: [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]}, 10.0, [2.0] * 6)
    said = follow_the_run(short, quiet).reason
    assert "the traced window (2 steps) alone decides nothing: not enough evidence" in said
    run1 = judge_own_work({0: [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], 1: [1.02, 1.12, 0.92, 1.02, 1.07, 0.97]}, 10.0,
                          [2.0] * 6)
    window = judge_own_work({0: [1.0, 1.0, 1.0], 1: [1.01, 1.01, 1.01]}, 10.0, [2.0] * 3)
    assert (window.status, run1.status) == ("quiet", "quiet") and window.rank == run1.rank == 1
    assert "the traced window (3 steps) agrees: " in follow_the_run(window, run1).reason
    # Both quiet, their candidates two ranks: it agrees that no rank is slow, not on rank 0 beside the run's rank 1.
    other = judge_own_work({0: [1.01, 1.01, 1.01], 1: [1.0, 1.0, 1.0]}, 10.0, [2.0] * 3)
    assert (other.status, other.rank) == ("quiet", 0)
    assert "the traced window (3 steps) agrees that no rank is slow: rank 0's" in follow_the_run(other, run1).reason


@pytest.mark.parametrize("traces", ["clean", "slow_rank1"])
def test_box_findings_and_what_if_agree(tmp_path: Path, traces: str) -> None:
    """Whatever the window, the box's verdict, the findings and the what-if table tell one story."""
    for slow_rank in (None, 1):
        folder = tmp_path / f"{traces}-{slow_rank}"
        folder.mkdir()
        result = analyze_paths(run_folder(folder, traces, slow_rank), OPTS)
        box = format_box(result)
        counted = [s for s in result.what_if if s.beyond_noise]
        first = [f for f in result.findings if f.kind == "what_to_fix_first"]
        # A what-to-fix-first finding exactly when a counted saving crosses the threshold, naming the table's top.
        # (A saving on a rank's pace counts as much as the run shows, when that is less than the replay's.)
        worth = sorted((s for s in counted if s.counted_pct > OPTS.what_if_pct), key=lambda s: -s.counted_pct)
        assert bool(first) == bool(worth), (traces, slow_rank)
        if first:
            assert first[0].title == f"What to fix first: {worth[0].title}"
        if not result.findings:
            assert "| Verdict: no finding" in box
            top = max(result.what_if, key=lambda s: s.counted_pct) if result.what_if else None
            if top is not None and top.counted_pct > 0:  # the box names the largest saving, and why it is no finding
                held = (f" over the run; {top.saving_pct:.1f}% in the traced steps alone"
                        if top.counted_pct < top.saving_pct else "")
                said = (f"nothing worth fixing: the largest saving the what-if predicts, {top.title}, is "
                        f"{top.counted_pct:.1f}% of the step{f' ({held.strip()})' if held else ''}, under the "
                        f"{OPTS.what_if_pct:g}% worth fixing"
                        if top.beyond_noise else
                        f"nothing to fix: the largest saving the what-if predicts, {top.title} ({top.counted_pct:.1f}% "
                        f"of the step{held}), is within the run's noise")
                assert said in " ".join(" ".join(line.strip("|").split()) for line in box.splitlines()), box
        rank_named = {r for f in result.findings if f.kind in ("slow_rank", "straggler", "imbalance") for r in f.ranks}
        assert rank_named == ({1} if slow_rank == 1 else set()), (traces, slow_rank)


def test_a_rank_pace_saving_counts_as_much_as_the_run_shows(tmp_path: Path) -> None:
    """The traced window (rank 1 slow in its 6 steps) promises ~49% from rank 1 at its peers' pace; over the run's
    23 judged steps rank 1's own work exceeds rank 0's by 4 ms in three steps of five and by 14 ms in the other two
    (the rows' wobble): 7.6 ms of a 200 ms step, the middle half's mean (a median said 4 ms, 2%: the lower level).
    The table shows both; what counts (what to fix first, the box) is the run's figure, under what is worth fixing,
    as the slow-rank verdict (under its threshold) says."""
    from hf_distprof.core.stats import interquartile_mean

    files = run_folder(tmp_path, "slow_rank1", slow_rank=1, excess=0.08)
    rows = {r: [json.loads(line) for line in (tmp_path / f"timing_rank{r}.jsonl").read_text().splitlines()]
            for r in (0, 1)}
    judged = [s for s in STEPS if s != 1 and s not in TRACED]
    live = judge_own_work({r: [rows[r][s - 1]["own_work_s"] for s in judged] for r in rows}, 10.0,
                          [max(rows[r][s - 1]["own_step_s"] for r in rows) for s in judged])
    step_ms = 1e3 * sorted(max(rows[r][s - 1]["step_s"] for r in rows) for s in judged)[len(judged) // 2]
    excess = [rows[1][s - 1]["own_work_s"] - rows[0][s - 1]["own_work_s"] for s in judged]
    over_run = 100.0 * 1e3 * interquartile_mean(excess) / step_ms
    assert 100.0 * 1e3 * live.effect_abs / step_ms == pytest.approx(1.98, abs=0.01)  # the verdict's median
    result = analyze_paths(files, OPTS)
    verdict = result.cross_rank.imbalance_verdict
    assert (verdict.status, verdict.gate, verdict.rank) == ("quiet", "threshold", 1)
    pace = {s.scenario: s for s in result.what_if}
    assert "fastest_pace" not in pace  # two ranks: the same replay as slow_rank's, on the same rank, one row
    s = pace["slow_rank"]
    assert s.saving_pct > OPTS.what_if_pct  # the traced window alone
    assert s.run_saving_pct == pytest.approx(over_run) == pytest.approx(3.81, abs=0.01)
    assert s.counted_pct == s.run_saving_pct
    assert all(s.run_saving_pct is None for s in result.what_if if s.scenario not in ("slow_rank", "fastest_pace"))
    assert "what_to_fix_first" not in {f.kind for f in result.findings}
    box = " ".join(" ".join(line.strip("|").split()) for line in format_box(result).splitlines())
    assert (f"rank 1 at its peers' median pace (3.8% of the step over the run; {pace['slow_rank'].saving_pct:.1f}% in "
            "the traced steps alone), is within the run's noise" in box
            and "slowest rank 1 (+4.0% median excess per step, under the 10% threshold)" in box), box
    text = format_summary(result)
    assert "run%" in text and f"{pace['slow_rank'].saving_pct:>8.1f} {over_run:>6.1f}" in text
    # A run that bears the window out: the replay's figure is the smaller, and counts.
    (tmp_path / "slowed").mkdir()
    slowed = analyze_paths(run_folder(tmp_path / "slowed", "slow_rank1", slow_rank=1, excess=1.2), OPTS)
    top = {s.scenario: s for s in slowed.what_if}["slow_rank"]
    assert top.run_saving_pct is not None and top.run_saving_pct > top.saving_pct == top.counted_pct
    first = [f for f in slowed.findings if f.kind == "what_to_fix_first"]
    assert first and first[0].severity == top.saving_pct and "the figure that counts" not in first[0].why


@pytest.mark.parametrize(("traces", "top", "slowest", "by"), [
    ("slow_data", "what_to_fix_first", 1, "imbalance"),  # the top finding names ranks 0 and 1: the saving's ranks
    ("gpu_float_ts", "slow_rank", 2, "finding:slow_rank"),
    ("clean", None, 1, "straggler"),  # no timer records: the rank latest at the collectives, as the what-if's
    ("slow_rank1", "slow_rank", 1, "finding:slow_rank"),
    ("fsdp2", "what_to_fix_first", 0, "imbalance"),
])
def test_one_slowest_rank_in_the_box_the_trackers_and_the_what_if(traces: str, top: str | None, slowest: int,
                                                                  by: str) -> None:
    """The headline's ``slowest_rank`` is never a finding's first rank when that finding is not about a slow rank (it
    once was: ``slow_data``'s top finding, the data-loading saving on ranks 0 and 1, made it 0, against the imbalance
    verdict's candidate 1). And the box, the trackers and the what-if name one rank: on ``clean`` the box said
    "slowest rank 0" (the imbalance verdict's candidate) while the what-if replayed rank 1 at its peers' pace and
    called rank 0 the fastest; on the shared DLRM traces the trackers said 1 while every rank waited for rank 7."""
    from hf_distprof.analysis.tell.tracker import headline

    result = analyze_paths([DATA / traces], OPTS)
    assert (result.findings[0].kind if result.findings else None) == top
    cross = result.cross_rank
    assert cross is not None and (cross.slowest_rank, cross.slowest_by) == (slowest, by)
    assert headline(result)["slowest_rank"] == slowest
    counted = [s for s in result.what_if if s.beyond_noise]
    assert headline(result)["predicted_saving"] == (counted[0].title if counted else None)
    # A saving within the run's noise is no headline (a trial's clean run: the trackers said 16.4% where the what-if
    # table said "no: noise").
    from dataclasses import replace

    within = replace(result, what_if=[replace(s, beyond_noise=False, not_counted="noise") for s in result.what_if])
    assert within.what_if and (headline(within)["predicted_saving"], headline(within)["predicted_saving_pct"]) == (
        None, None)
    pace = {s.scenario: s for s in result.what_if}
    assert pace["slow_rank"].ranks == [slowest] and result.what_if_model.slowest_rank == slowest
    if "fastest_pace" in pace:
        assert f"(rank {slowest}) pace" not in pace["fastest_pace"].title
    box = " ".join(" ".join(line.strip("|").split()) for line in format_box(result).splitlines())
    assert ("slowest rank" not in box) == bool(result.findings)
    if not result.findings:
        assert f"slowest rank {slowest} (" in box


def test_what_names_the_slowest_rank_when_no_verdict_s_candidate_is_it() -> None:
    """The what-if's pace rank, when neither verdict names it (the step timer's records too few for a verdict, a
    verdict weighed otherwise), is said with where it came from; the box states it rather than a bare rank."""
    from hf_distprof.analysis.judge.findings import slowest_rank
    from hf_distprof.analysis.results.across import RankVerdicts
    from hf_distprof.analysis.results.findings import Judgement
    from hf_distprof.core.verdicts import SlowRankVerdict

    def verdict(rank: int) -> SlowRankVerdict:
        return SlowRankVerdict("quiet", rank, 3.0, 10.0, 1.0, 2, 4, 2, 0.5, 6, "quiet", gate="threshold")

    verdicts = RankVerdicts(straggler=verdict(0), imbalance=verdict(0))
    assert slowest_rank([], verdicts, (0, 1), True, 1) == (0, "imbalance")
    assert slowest_rank([], RankVerdicts(straggler=verdict(1), imbalance=verdict(0)), (1, 0), False, 0) == (
        1, "straggler")
    assert slowest_rank([], verdicts, (1, 0), True, 1) == (1, "run")
    assert slowest_rank([], verdicts, (1, 0), False, 1) == (1, "lateness")
    assert slowest_rank([], verdicts, (None, None), False, 1) == (1, "replay")
    assert slowest_rank([], verdicts, (None, None), False, None) == (0, "imbalance")
    assert slowest_rank([], RankVerdicts(), (None, None), False, None) == (None, None)
    named = Judgement("straggler", 5.0, [1], None)
    assert slowest_rank([Judgement("communication_bound", 9.0, [0], None), named], verdicts, (0, 1), True, 0) == (
        1, "finding:straggler")


def test_the_window_note_says_which_way_its_steps_moved():
    # A trial's traced steps took 0.65x the untraced median, beyond the run's noise, and the note blamed "the
    # profiler's cost" for steps that ran faster.
    from hf_distprof.analysis.results.facts import WindowFacts
    from hf_distprof.analysis.tell.findings import window_note
    from hf_distprof.core.verdicts import SlowRankVerdict

    window = SlowRankVerdict("raised", 1, 30.0, 10.0, 1.0, 3, 3, 2, 0.1, 6, "rank 1 is late", gate="threshold")
    run = SlowRankVerdict("quiet", 1, 3.0, 10.0, 1.0, 2, 24, 2, 0.5, 6, "within the threshold", gate="threshold")

    def note(steps, ratio):
        return window_note(WindowFacts("imbalance", window, run, steps, 31.0, 5.0, ratio, True)).text

    faster = note([24.0, 20.0, 20.0], 0.65)
    assert faster.endswith("its 3 recorded steps (not the profiler's warm-up) took 24, 20, 20 ms against a median "
                           "31 ms untraced (0.65x), faster beyond the "
                           "run's own noise: the host's load or the work changed while they ran")
    assert "profiler's cost" not in faster
    slower = note([44.0, 40.0, 42.0], 1.35)
    assert slower.endswith("(1.35x), beyond the run's own noise: the profiler's cost and the host's load weigh on them")


def test_a_finding_s_ranks_are_said_once():
    # "Rank 1 holds the others back: ... (rank 1)" in the box, the text, the report and the trackers' verdict.
    from hf_distprof.core.text import who

    assert who([1], "Rank 1 holds the others back: its data loading") == ""
    assert who([1], "Rank 10 holds the others back") == " (rank 1)"  # another rank's number
    assert who([0, 1, 2], "Exposed communication is 41% of the step") == " (ranks 0-2)"
    assert who([], "Rank 1 holds the others back") == ""


def test_a_slow_rank_named_without_its_trace_scores_what_its_peers_wait_for_it(tmp_path: Path) -> None:
    """Rank 1's trace not read (--profile-ranks 0): its finding rests on the step timer alone. Its severity was its
    excess in % of its peers' own work (a trial's 1049, where the same fault traced scored 64: "a rough % of the step
    at stake"); it is what its peers wait for it in % of the step, the verdict's own materiality figure."""
    paths = run_folder(tmp_path, "clean", slow_rank=1, excess=3.0)  # ten times its peer's own work (0.3 s)
    for rank in (0, 1):  # every rank's step holds the slow rank's extra 0.3 s (its peers wait for it)
        rows = _rows(rank, 1, 3.0)
        for row in rows:
            for key in ("step_s", "own_step_s"):
                row[key] += 0.0 if row["traced"] else 0.3
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = analyze_paths(paths[:1], OPTS)
    (slow,) = [f for f in result.findings if f.kind == "slow_rank"]
    assert slow.ranks == [1] and slow.numbers["effect_pct"] == pytest.approx(296.0)
    assert slow.severity == pytest.approx(100 * 0.3 / 0.5, abs=2.0)  # 0.3 s of a 0.5 s step, +- the wobble
