"""``hf-distprof compare``: reading run folders, the significance decision, the headline, the CLI and report."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from hf_distprof.core import names
from hf_distprof.cli.main import main
from hf_distprof.runs.compare import compare_runs, run_series
from hf_distprof.runs.load import RunFolderError, find_run_dir, load_run
from hf_distprof.core.difference import judge_difference
from hf_distprof.core.stats import ALPHA, mann_whitney_p, scaled_mad, smallest_p

from .fake_runs import clean_run, jitter, record, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def rows_by(comparison):
    return {(r.metric, r.rank): r for r in comparison.rows}


# ---- statistics ---------------------------------------------------------------------------------------------


def test_rank_sum_p_value_matches_the_normal_approximation_with_continuity_correction():
    # U = 0 for 5 vs 5: z = (12.5 - 0.5) / sqrt(25 * 11 / 12) = 2.5067, two-sided p = 0.012186
    # (scipy.stats.mannwhitneyu(..., method="asymptotic") gives the same).
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0121857, abs=1e-6)
    assert mann_whitney_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    # Ties: a = [1, 2, 2], b = [2, 3, 3]: mid-ranks 1, 3, 3 | 3, 5.5, 5.5; U1 = 7 - 6 = 1, tie term 24 + 6 = 30,
    # var = 9 / 12 * (7 - 30 / 30) = 4.5, z = (4.5 - 1 - 0.5) / sqrt(4.5) = 1.41421, p = erfc(1) = 0.157299.
    assert mann_whitney_p([1, 2, 2], [2, 3, 3]) == pytest.approx(0.157299, abs=1e-6)
    assert mann_whitney_p([1.0] * 6, [1.0] * 6) == 1.0
    assert mann_whitney_p([], [1.0]) == 1.0


def test_scaled_mad_is_the_median_absolute_deviation_times_1_4826():
    assert scaled_mad([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1.4826)
    assert scaled_mad([5.0]) == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_samples_of_one_distribution_are_not_significant_and_a_30pct_slowdown_is(seed):
    rng = random.Random(seed)
    a = [rng.gauss(1.0, 0.05) for _ in range(29)]
    same = [rng.gauss(1.0, 0.05) for _ in range(29)]
    slower = [rng.gauss(1.3, 0.05) for _ in range(29)]
    assert judge_difference(a, same).status == "not significant"
    verdict = judge_difference(a, slower)
    assert verdict.status == "significant" and verdict.p_value < 1e-6


def test_each_gate_has_its_reason():
    base = [1.0 + jitter(s) for s in range(30)]
    assert judge_difference(base, [x * 1.05 for x in base]).reason == "change below 10%"
    noisy = [1.0 + jitter(s, scale=0.1) for s in range(30)]  # +-0.5 around 1.0, scaled MAD 0.44
    assert judge_difference(noisy, [x + 0.2 for x in noisy]).reason == "within the step-to-step noise"
    small = [0.01 + jitter(s, scale=1e-5) for s in range(30)]
    material = judge_difference(small, [x + 0.01 for x in small], step_s=1.0)
    assert material.reason == "less than 5% of the step time" and material.delta_pct == pytest.approx(100.0)
    shares = [10.0 + jitter(s, scale=0.1) for s in range(30)]
    assert judge_difference(shares, [x + 5 for x in shares], points=True).reason == "change below 10 points"
    assert judge_difference(base[:4], [x * 2 for x in base[:4]]).status == "too few steps"
    assert judge_difference([], base).status == "too few steps"


def test_runs_too_short_for_the_rank_sum_test_to_ever_pass_are_too_few_steps():
    # The one level of every verdict (core.stats.ALPHA, 0.02): 4 steps against 4 with no value in common cannot reach
    # it (0.0304), 4 against 5 can (0.0200), 5 against 5 can (0.0122); fewer than MIN_STEPS (5) is too few anyway.
    assert (round(smallest_p(4, 4), 4), round(smallest_p(4, 5), 4), round(smallest_p(5, 5), 4)) == (
        0.0304, 0.02, 0.0122)
    assert smallest_p(4, 5) < ALPHA <= smallest_p(4, 4)
    five = [0.005 + 0.0001 * i for i in range(5)]
    slow = judge_difference(five, [0.2 + x for x in five])
    assert (slow.status, slow.reason) == ("significant", "beyond the noise (rank-sum p = 0.012)")
    four = judge_difference(five[:4], [0.2 + x for x in five[:4]])
    assert four.status == "too few steps"


# ---- reading run folders ------------------------------------------------------------------------------------


def test_a_folder_without_timing_files_is_an_error_naming_it(tmp_path):
    with pytest.raises(RunFolderError, match=f"^{tmp_path}: no timing_rank\\*.jsonl files here or in a subfolder"):
        load_run(tmp_path)
    with pytest.raises(RunFolderError, match="no such folder"):
        load_run(tmp_path / "missing")
    (tmp_path / "timing_rank0.jsonl").write_text("")  # a trial gave a run's file: "no such folder"
    with pytest.raises(RunFolderError, match="timing_rank0.jsonl: a file, not a run folder$"):
        load_run(tmp_path / "timing_rank0.jsonl")


def test_a_parent_with_one_run_folder_is_accepted_and_with_two_is_refused(tmp_path):
    clean_run(tmp_path / "prof" / "a")
    assert find_run_dir(tmp_path / "prof") == tmp_path / "prof" / "a"
    clean_run(tmp_path / "prof" / "b")
    with pytest.raises(RunFolderError, match=r"holds several run folders \(a, b\)"):
        find_run_dir(tmp_path / "prof")


def test_a_malformed_line_names_the_file_and_line_but_a_cut_last_line_is_tolerated(tmp_path):
    folder = write_run(tmp_path / "run", {0: [record(1), record(2)]})
    path = folder / "timing_rank0.jsonl"
    path.write_text(path.read_text() + '{"step": 3, "data')
    assert [r["step"] for r in load_run(folder).steps[0]] == [1, 2]
    path.write_text(json.dumps(record(1)) + "\nnot json\n" + json.dumps(record(3)) + "\n")
    with pytest.raises(RunFolderError, match=f"{path}, line 2: not JSON"):
        load_run(folder)


def test_warm_up_and_every_step_the_profiler_ran_over_are_left_out(tmp_path):
    folder = clean_run(tmp_path / "run", steps=20)
    for rank in (0, 1):
        (folder / f"rank{rank}_host_step10-12{names.TRACE_SUFFIX}").write_bytes(b"")
    # The trace names hold the recorded steps 10-12; the step timer counted 5 profiled steps: 8-9 were its warm-up.
    summary = {"warmup_steps_excluded": 1, "profiler_slowdown": {"steps_inside": 5}}
    (folder / "timing_summary.json").write_text(json.dumps(summary))
    run = load_run(folder)
    assert run.traced_steps == {8, 9, 10, 11, 12}
    assert [r["step"] for r in run.counted(1)] == [2, 3, 4, 5, 6, 7, 13, 14, 15, 16, 17, 18, 19, 20]
    assert [r["step"] for r in load_run(folder, warmup_steps=3).counted(0)][:3] == [4, 5, 6]


def test_the_step_after_a_checkpoint_is_left_out(tmp_path):
    # The step timer marks the step after a checkpoint or an evaluation (it waits for the slowest rank's).
    paused = {**record(4), "after_pause": True}
    folder = write_run(tmp_path / "run", {0: [record(1), record(2), record(3), paused, record(5)]})
    assert [r["step"] for r in load_run(folder).counted(0)] == [2, 3, 5]


# ---- the comparison -----------------------------------------------------------------------------------------


def test_run_series_gives_the_imbalance_and_the_sync_share_per_step(tmp_path):
    # Rank 1's own work (0.6 s) is 20% over rank 0's (0.5 s); each syncs 0.05 s of a 0.5 s step: 10%.
    rank0 = [record(s, load=0.0, fwd=0.2, compute=0.3, bwd=0.35, data=0.0, opt=0.0, step_s=0.5) for s in (1, 2, 3)]
    rank1 = [record(s, load=0.0, fwd=0.3, compute=0.3, bwd=0.35, data=0.0, opt=0.0, step_s=0.5) for s in (1, 2, 3)]
    series = run_series(load_run(write_run(tmp_path / "r", {0: rank0, 1: rank1})))
    assert series["imbalance_pct"] == pytest.approx([20.0, 20.0])  # steps 2 and 3; step 1 is the warm-up
    assert series["comm_pct"] == pytest.approx([10.0, 10.0])
    assert series["samples_per_s"] == pytest.approx([32.0, 32.0])  # 16 samples of both ranks per 0.5 s
    # Rows with the work less the wait for a CPU (own_work_s): that is what is compared, as the step timer's verdict
    # does (rank 1 waited 0.1 s for a CPU: its own work equals rank 0's; a trial read 25.5% on a clean run).
    for row in rank0:
        row["own_work_s"] = row["pre_sync_s"]
    for row in rank1:
        row["own_work_s"] = row["pre_sync_s"] - 0.1
    series = run_series(load_run(write_run(tmp_path / "own", {0: rank0, 1: rank1})))
    assert series["imbalance_pct"] == pytest.approx([0.0, 0.0])


def test_one_ranks_slower_data_loading_is_named_with_exact_deltas(tmp_path):
    a = load_run(clean_run(tmp_path / "a"))
    # Rank 1's loader sleeps 0.2 s per batch; both ranks' data wait and step grow (the cross-rank token count
    # waits for it), and rank 0 waits in the sync: none of those is the cause.
    b = load_run(clean_run(tmp_path / "b", load_rank1=0.2, data=0.2))
    c = compare_runs(a, b)
    rows = rows_by(c)
    slow = rows[("data_load_s", 1)].diff
    assert slow.status == "significant"
    assert (slow.median_a, slow.delta, slow.delta_pct) == pytest.approx((0.005, 0.2, 4000.0))
    assert rows[("data_load_s", 0)].diff.delta == pytest.approx(0.0, abs=1e-12)
    assert rows[("data_load_s", 0)].diff.status == "not significant"
    assert rows[("step_s", None)].diff.delta == pytest.approx(0.2) and rows[("step_s", None)].diff.significant
    assert rows[("wait_s", 0)].diff.significant and not rows[("wait_s", 1)].diff.significant
    assert not rows[("forward_s", 0)].diff.significant and not rows[("forward_s", 1)].diff.significant
    h = c.headline
    assert (h.kind, h.rank, h.phase, h.metric) == ("localized", 1, "data", "data_load_s")
    assert h.text.startswith("rank 1, data loading: 0.0050 -> 0.2050 s per step (+0.2000, +4000%)")
    assert (c.steps_a, c.steps_b, c.ranks_a, c.ranks_b) == (29, 29, [0, 1], [0, 1])


def test_a_slow_rank_that_moved_is_said_so_not_hidden_behind_a_median_or_called_uniform(tmp_path):
    # A trial: the slow rank moved from rank 2 to rank 1 between two runs; the headline read "rank 2, data loading:
    # 0.1507 -> 0.0004 s per step (-100%), against +0.0000 s on the other ranks" (their median hid rank 1's +0.15 s).
    before = load_run(clean_run(tmp_path / "a", ranks=4, load_rank2=0.15, data=0.15))
    after = load_run(clean_run(tmp_path / "b", ranks=4, load_rank1=0.15, data=0.15))
    h = compare_runs(before, after).headline
    assert (h.kind, h.rank, h.phase, h.metric) == ("moved", 1, "data", "data_load_s")
    assert h.text.startswith("the slow rank moved: rank 1, data loading: 0.0050 -> 0.1550 s per step (+0.1500, ")
    assert "; rank 2, data loading: 0.1550 -> 0.0050 s per step (-0.1500, " in h.text
    # On 2 ranks it read "every rank changed alike".
    two = compare_runs(load_run(clean_run(tmp_path / "c", load_rank0=0.15)),
                       load_run(clean_run(tmp_path / "d", load_rank1=0.15))).headline
    assert (two.kind, two.rank) == ("moved", 1)


def test_the_count_is_of_the_rows_judged_the_ones_only_shown_said_apart(tmp_path):
    # A trial: "0 significant difference(s) of 66 compared", 13 of them shown and never judged (peaks, traced rows).
    from hf_distprof.core.difference import ONE_VALUE, PROFILED
    from hf_distprof.runs.compare_report import format_comparison

    run = Path(__file__).resolve().parents[1] / "data" / "golden" / "cpu_clean_memory"  # a window, memory logged
    c = compare_runs(load_run(run), load_run(run))
    shown = sum(1 for r in c.rows if r.diff.status in (ONE_VALUE, PROFILED))
    assert shown > 0 and not c.significant
    assert (f"0 significant difference(s) of {len(c.rows) - shown} compared ({shown} more shown, not judged)."
            in format_comparison(c))


def test_two_runs_of_the_same_distribution_show_no_significant_difference(tmp_path):
    c = compare_runs(load_run(clean_run(tmp_path / "a")), load_run(clean_run(tmp_path / "b", phase=5)))
    assert c.significant == [] and len(c.rows) == 29
    assert (c.headline.kind, c.headline.rank, c.headline.phase) == ("none", None, None)


def test_min_effect_pct_raises_the_floor_a_change_must_clear(tmp_path, capsys):
    # Rank 0's backward compute +0.08 s on 0.35 s (+23%, what one rank drifted between two clean runs on a busy
    # shared machine): named at the default 10%, below a 30% floor; the 0.2 s data loading stays named at 30%.
    a = load_run(clean_run(tmp_path / "a"))
    drift = load_run(clean_run(tmp_path / "b", compute_rank0=0.08, bwd_rank0=0.08))
    row = rows_by(compare_runs(a, drift))[("backward_compute_s", 0)].diff
    assert row.significant and row.delta_pct == pytest.approx(22.86, abs=0.5)
    floor = compare_runs(a, drift, min_effect_pct=30.0)
    assert rows_by(floor)[("backward_compute_s", 0)].diff.reason == "change below 30%"
    assert floor.headline.rank is None
    slowed = compare_runs(a, load_run(clean_run(tmp_path / "c", load_rank1=0.2, data=0.2)), min_effect_pct=30.0)
    assert (slowed.headline.kind, slowed.headline.rank, slowed.headline.metric) == ("localized", 1, "data_load_s")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--min-effect-pct", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["headline"]["rank"] is None
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--min-effect-pct", "0"])
    assert exit_info.value.code == 2 and "--min-effect-pct: must be a number > 0, got '0'" in capsys.readouterr().err


def test_runs_of_5_steps_name_nothing_and_say_they_are_too_short(tmp_path, capsys):
    # Warm-up step 1 left out: 4 steps compared per run, too few for any verdict, even on a 40x slower loader.
    a, b = clean_run(tmp_path / "a", steps=5), clean_run(tmp_path / "b", steps=5, load_rank1=0.2, data=0.2)
    c = compare_runs(load_run(a), load_run(b))
    assert c.significant == [] and (c.steps_a, c.steps_b) == (4, 4)
    assert (c.headline.kind, c.headline.rank) == ("too_few_steps", None)
    assert c.headline.text == "nothing can be judged: fewer than 5 steps in a run (step time); run more steps"
    six = compare_runs(load_run(clean_run(tmp_path / "a6", steps=6)),
                       load_run(clean_run(tmp_path / "c", steps=6, load_rank1=0.2, data=0.2)))
    assert (six.headline.kind, six.headline.rank, six.headline.metric) == ("localized", 1, "data_load_s")


def test_a_rank_is_named_only_when_its_excess_over_its_peers_clears_the_effect_floor(tmp_path):
    # Two clean CI runs on a busy machine: rank 0's forward +48%, rank 1's +23% (under half of it). The excess,
    # 25% of A's median, is below a 30% floor: the machine drifted, no rank is named (CI once named rank 0).
    a = load_run(clean_run(tmp_path / "a"))
    drift = load_run(clean_run(tmp_path / "b", fwd_rank0=0.096, fwd_rank1=0.046))
    floor = compare_runs(a, drift, min_effect_pct=30.0)
    rows = rows_by(floor)
    assert rows[("forward_s", 0)].diff.significant and not rows[("forward_s", 1)].diff.significant
    assert (floor.headline.kind, floor.headline.rank, floor.headline.metric) == ("uniform", None, "forward_s")
    # At the default 10% floor the same 25% excess is one rank's change.
    default = compare_runs(a, drift)
    assert (default.headline.kind, default.headline.rank, default.headline.metric) == ("localized", 0, "forward_s")
    assert default.headline.text == ("rank 0, forward: 0.2000 -> 0.2960 s per step (+0.0960, +48%), against +0.0460 s "
                                     "on the other ranks")
    # An excess just above the floor (31%) is named at 30%.
    named = compare_runs(a, load_run(clean_run(tmp_path / "c", fwd_rank0=0.108, fwd_rank1=0.046)), min_effect_pct=30.0)
    assert (named.headline.kind, named.headline.rank) == ("localized", 0)


def test_a_uniformly_slower_run_names_no_rank(tmp_path):
    c = compare_runs(load_run(clean_run(tmp_path / "a")), load_run(clean_run(tmp_path / "b", factor=1.5)))
    rows = rows_by(c)
    for rank in (0, 1):
        assert rows[("forward_s", rank)].diff.delta_pct == pytest.approx(50.0, abs=1.0)
        assert rows[("forward_s", rank)].diff.significant and rows[("backward_compute_s", rank)].diff.significant
    assert (c.headline.kind, c.headline.rank) == ("uniform", None)
    assert "every rank changed alike" in c.headline.text


def test_a_slower_sync_on_every_rank_is_named_outside_the_ranks_own_work(tmp_path):
    # Backward grows by 0.1 s on both ranks but its compute does not: the gradient sync went 0.05 -> 0.15 s.
    c = compare_runs(load_run(clean_run(tmp_path / "a")), load_run(clean_run(tmp_path / "b", bwd=0.1)))
    # It moved on every rank alike: no rank is named.
    assert (c.headline.kind, c.headline.rank, c.headline.phase, c.headline.metric) == ("other", None, "sync",
                                                                                        "sync_s")
    assert c.headline.text == ("every rank alike: gradient sync (backward - compute) 0.0500 -> 0.1500 s (+0.1000 on "
                               "rank 0); no rank's own work changed beyond the noise")
    # On one rank only, that rank is named.
    one = compare_runs(load_run(clean_run(tmp_path / "c")), load_run(clean_run(tmp_path / "d", bwd_rank1=0.1)))
    assert (one.headline.kind, one.headline.rank, one.headline.metric) == ("other", 1, "sync_s")
    assert one.headline.text.startswith("rank 1, gradient sync (backward - compute): 0.0500 -> 0.1500 s (+0.1000)")


def test_throughput_up_on_every_rank_with_no_own_work_changed_names_no_rank(tmp_path):
    # A machine that got less busy: every step is shorter (less waiting for a CPU), own work the same.
    a = load_run(clean_run(tmp_path / "a"))
    folder = clean_run(tmp_path / "b", phase=1)
    for log in folder.glob("timing_rank*.jsonl"):
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        log.write_text("".join(json.dumps({**r, "step_s": 0.75 * r["step_s"], "wait_s": 0.0}) + "\n" for r in rows))
    c = compare_runs(a, load_run(folder))
    significant = {(r.metric, r.rank) for r in c.significant}
    assert {("samples_per_s", 0), ("samples_per_s", 1)} <= significant
    assert not any(m in ("forward_s", "backward_compute_s", "data_load_s") for m, _ in significant)
    assert (c.headline.kind, c.headline.rank) == ("other", None)
    assert c.headline.text.startswith("every rank alike: ")


def test_one_rank_runs_name_the_phase_without_peers(tmp_path):
    c = compare_runs(load_run(clean_run(tmp_path / "a", ranks=1)), load_run(clean_run(tmp_path / "b", ranks=1,
                                                                                        fwd=0.1)))
    assert c.headline.text == "rank 0, forward: 0.2000 -> 0.3000 s per step (+0.1000, +50%)"


def test_traced_steps_of_the_trace_analysis_are_compared_in_seconds(tmp_path):
    def analysis(comm_us):
        steps = [{"step": s, "cpu": {"compute_us": 4e5, "communication_us": comm_us + 100 * (s % 3),
                                     "data_loading_us": 5e3}} for s in range(8, 14)]
        return {"ranks": [{"rank": r, "steps": steps} for r in (0, 1)]}

    a, b = clean_run(tmp_path / "a"), clean_run(tmp_path / "b")
    (a / names.ANALYSIS_NAME).write_text(json.dumps(analysis(2e4)))
    (b / names.ANALYSIS_NAME).write_text(json.dumps(analysis(2e5)))
    rows = rows_by(compare_runs(load_run(a), load_run(b)))
    comm = rows[("communication_s", 1)].diff
    # Shown with its delta, never judged: the profiler distorts the steps it traces (a clean pair of CI runs once
    # differed by 17% in one rank's traced compute).
    assert (comm.median_a, comm.delta, comm.steps_a, comm.status, comm.significant) == (
        pytest.approx(0.0201), pytest.approx(0.18), 6, "profiled steps", False)  # median of +0, +100, +200 us
    assert rows[("compute_s", 0)].diff.delta == 0.0
    assert ("gpu_wait_s", 0) not in rows  # a CPU run never waits for a GPU: no row


def test_a_gpu_run_s_wait_for_its_gpu_is_a_traced_row_of_its_own(tmp_path):
    def analysis(wait_us):
        steps = [{"step": s, "cpu": {"compute_us": 4e5, "communication_us": 2e4, "data_loading_us": 5e3,
                                     "gpu_wait_us": wait_us}} for s in range(8, 14)]
        return {"ranks": [{"rank": r, "steps": steps} for r in (0, 1)]}

    a, b = clean_run(tmp_path / "a"), clean_run(tmp_path / "b")
    (a / names.ANALYSIS_NAME).write_text(json.dumps(analysis(1e4)))
    (b / names.ANALYSIS_NAME).write_text(json.dumps(analysis(6e4)))
    rows = rows_by(compare_runs(load_run(a), load_run(b)))
    wait = rows[("gpu_wait_s", 1)]
    assert (wait.label, wait.diff.median_a, wait.diff.delta, wait.diff.status) == (
        "traced wait for the GPU (sync%)", pytest.approx(0.01), pytest.approx(0.05), "profiled steps")


def test_memory_samples_are_compared_and_the_peak_is_shown_unjudged(tmp_path):
    def memory(base):
        return {r: [{"step": s, "rank": r, "rss_mb": base + r + jitter(s)} for s in range(2, 13)] for r in (0, 1)}

    def peaks(base):
        return {"peak_basis": "peak_rss_mb", "per_rank": [{"rank": r, "peak_rss_mb": base + r} for r in (0, 1)]}

    steps = {0: [record(s) for s in range(1, 13)], 1: [record(s) for s in range(1, 13)]}
    a = load_run(write_run(tmp_path / "a", steps, memory=memory(600.0), memory_summary=peaks(650.0)))
    b = load_run(write_run(tmp_path / "b", steps, memory=memory(700.0), memory_summary=peaks(760.0)))
    rows = rows_by(compare_runs(a, b))
    assert rows[("memory_mb", 1)].diff.delta == pytest.approx(100.0) and rows[("memory_mb", 1)].diff.significant
    peak = rows[("peak_memory_mb", 0)].diff
    assert (peak.median_a, peak.median_b, peak.delta, peak.status) == (650.0, 760.0, 110.0, "one value")


def test_ranks_missing_from_one_run_are_noted(tmp_path):
    c = compare_runs(load_run(clean_run(tmp_path / "a", ranks=2)), load_run(clean_run(tmp_path / "b", ranks=1)))
    assert {r.rank for r in c.rows} == {None, 0}
    assert c.notes == ["run A has ranks [0, 1], run B [0]: per-rank rows are for ranks [0] only"]


# ---- the command --------------------------------------------------------------------------------------------


def test_compare_cli_table_json_and_report(tmp_path, capsys):
    a, b = clean_run(tmp_path / "a"), clean_run(tmp_path / "b", load_rank1=0.2, data=0.2)
    assert main(["compare", str(a), str(b), "--significant-only"]) == 0
    out = capsys.readouterr().out
    assert "What changed most: rank 1, data loading: 0.0050 -> 0.2050 s per step" in out
    assert "forward" not in out  # not significant: left out with --significant-only
    assert main(["compare", str(a), str(b), "--json", "--report", str(tmp_path / "rep")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["headline"]["rank"], data["headline"]["phase"]) == (1, "data")
    assert (tmp_path / "rep" / names.COMPARE_PNG).read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "rep" / names.COMPARE_JSON).read_text()) == data
    md = (tmp_path / "rep" / names.COMPARE_MD).read_text()
    assert "**What changed most:** rank 1, data loading" in md and f"]({names.COMPARE_PNG})" in md
    assert "at least 10% (10 points for shares), at least 5% of the step time for a phase, and a rank-sum p below " \
        "0.02." in md
    assert main(["compare", str(a), str(b), "--min-effect-pct", "30", "--report", str(tmp_path / "rep30")]) == 0
    assert "at least 30% (10 points for shares)" in (tmp_path / "rep30" / names.COMPARE_MD).read_text()
    assert data["min_effect_pct"] == 10.0
    # A report folder it cannot make is said before the comparison (a trial: the table printed, then exit 2).
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "afile")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"hf-distprof compare: error: --report {tmp_path / 'afile'}: File exists\n"
    # The same folder twice: said (a trial: "0 significant difference(s)" without a word).
    assert main(["compare", str(a), str(a)]) == 0
    assert "note: A and B are the same folder: nothing can differ" in capsys.readouterr().err
    # Nothing made for a comparison that fails (a review: a mistyped run folder was made as the report's parent).
    assert main(["compare", str(tmp_path / "typo"), str(b), "--report", str(tmp_path / "typo" / "cmp")]) == 2
    assert not (tmp_path / "typo").exists()


def test_compare_cli_refuses_a_folder_without_timing_files_without_a_traceback(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(empty), str(clean_run(tmp_path / "b"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hf-distprof compare: error: {empty}: no timing_rank*.jsonl files")
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(empty), str(empty), "--warmup-steps", "-1"])
    assert exit_info.value.code == 2 and "--warmup-steps: must be an integer >= 0, got '-1'" in capsys.readouterr().err


def test_reading_and_comparing_runs_imports_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = ("import sys, hf_distprof.runs.compare, hf_distprof.runs.scaling, hf_distprof.cli.compare, "
            "hf_distprof.cli.scaling; print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]  # a JSON reader needs no seconds of imports


def test_a_warmup_past_the_run_s_end_is_an_error_not_no_difference(tmp_path, capsys):
    """--warmup-steps past the end compared 0 steps and said "no significant difference: every change is within the
    runs' noise" (exit 0)."""
    a, b = clean_run(tmp_path / "a", steps=8), clean_run(tmp_path / "b", steps=8, load_rank1=0.2, data=0.2)
    assert main(["compare", str(a), str(b), "--warmup-steps", "8"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hf-distprof compare: error: {a}: --warmup-steps 8 leaves no step to compare (its records hold steps 1-8); "
        "give a smaller --warmup-steps")
    assert main(["compare", str(a), str(b), "--warmup-steps", "7"]) == 0
    assert "(ranks [0, 1], 1 step compared)" in capsys.readouterr().out
    empty = compare_runs(load_run(a, warmup_steps=8), load_run(b, warmup_steps=8))
    assert (empty.steps_a, empty.headline.kind) == (0, "too_few_steps")
    assert empty.headline.text.startswith("nothing can be judged: no step of the step timer compared")


def test_a_one_process_run_s_waits_and_sync_are_shown_never_judged_nor_called_waiting_for_peers(tmp_path, capsys):
    # Trial T: `compare nproc1 nproc2` said run A (one process) spent 0.0009 s "waiting for other ranks" and in a
    # "gradient sync", both "YES" significant: with one process those are the rest of the step, not peers.
    one = clean_run(tmp_path / "a", ranks=1)
    two = clean_run(tmp_path / "b", ranks=2, bwd=0.03, data=0.02)  # a real sync, and a longer data wait
    c = compare_runs(load_run(one), load_run(two))
    rows = rows_by(c)
    why = "run A had one process: no other rank to wait for or sync with (its figure is the rest of the step)"
    for key in (("wait_s", 0), ("sync_s", 0), ("comm_pct", None)):
        assert (rows[key].diff.status, rows[key].diff.reason) == ("one process", why), key
    assert rows[("sync_s", 0)].diff.median_b == pytest.approx(0.08)  # shown, with its delta
    assert not any(r.metric in ("wait_s", "sync_s", "comm_pct", "imbalance_pct") for r in c.significant)
    assert c.headline.text == ("the run, throughput (all ranks): 12.9 -> 23.81 samples/s (+10.91); no rank's own work "
                               "changed beyond the noise")
    assert main(["compare", str(one), str(two)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("waiting for other ranks (s)"))
    assert " - " in line and line.endswith(why) and "YES" not in line
    assert "more shown, not judged" in out
    # Two runs of one process each: the same.
    c = compare_runs(load_run(one), load_run(clean_run(tmp_path / "c", ranks=1, fwd=0.1)))
    assert rows_by(c)[("wait_s", 0)].diff.reason.startswith("run A and run B had one process: ")


def test_a_run_compared_with_itself_is_said_so(tmp_path):
    run = load_run(clean_run(tmp_path / "a"))
    c = compare_runs(run, run)
    assert c.notes == [f"run A and run B are the same folder ({run.path}): a run against itself differs in nothing"]
    assert c.significant == []
