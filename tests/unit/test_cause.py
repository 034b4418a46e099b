"""Whose fault (hf_distprof.core.cause): a slow rank's excess attributed to its machine, its input pipeline or more
work, from the step timer's per-step parts, and the one verdict (judge_run) that never passes over a wait its peers
pay. Exact figures on hand-built steps; the live timer's series and the analysis say the same."""

from __future__ import annotations

import pytest

from hf_distprof.core.cause import Cause, attribute, attribute_rows, cause_action, cause_title, cause_why, from_json
from hf_distprof.core.verdicts import ARRIVAL, OWN_WORK, judge_run
from hf_distprof.timing.series import StepSeries

N = 24


def rows(rank_parts: dict[int, tuple[float, float, float, float, float, float]], wobble: float = 0.002
         ) -> dict[int, list[tuple[float, ...]]]:
    """rank -> N steps of (arrival, cpu_wait, data, compute, tokens, samples), the same wobble on every rank; the
    arrival is the parts' sum (data + compute + wait)."""
    out = {}
    for r, (_, wait, data, compute, tokens, samples) in rank_parts.items():
        steps = []
        for i in range(N):
            w = wobble * ((i * 7) % 5)
            steps.append((data + compute + wait + w, wait, data, compute + w, tokens, samples))
        out[r] = steps
    return out


CLEAN = (0.0, 0.001, 0.010, 0.100, 256.0, 8.0)


def test_a_rank_waiting_for_a_cpu_is_its_machine_not_its_code():
    # Rank 1's own work is its peers', but it waited 118 ms per step for a CPU (its core shared).
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.118, 0.010, 0.100, 256.0, 8.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.CPU_WAIT and got.machine
    assert got.cpu_wait_s == pytest.approx(0.117) and got.excess_s == pytest.approx(0.117)
    assert (got.cpu_wait_abs_s, got.peers_cpu_wait_s) == (pytest.approx(0.118), pytest.approx(0.001))
    assert got.work_ratio == 1.0 and got.speed_ratio == pytest.approx(1.0)
    assert (got.slowest_in, got.steps, got.longest_run, got.persistent) == (24, 24, 24, True)
    assert cause_why(got).startswith("not your code: it waited 118 ms per step for a CPU (its peers 1.0 ms), 117 ms "
                                     "of the 117 ms its peers wait for it: another process shares its cores")
    assert cause_action(got, on_gpu=False, phase_advice_text="-").startswith("move or stop the other process")
    # Two medians over the same steps need not nest (a trial's live warning: "2.2 ms of the 1.9 ms its peers wait for
    # it"): a part larger than the whole is said as more than it.
    from dataclasses import replace

    larger = replace(got, cpu_wait_s=0.0022, excess_s=0.0019)
    assert "), 2.2 ms, more than all 1.9 ms its peers wait for it: another process" in cause_why(larger)


def test_a_collator_asleep_is_the_input_pipeline():
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.001, 0.060, 0.100, 256.0, 8.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.INPUT and not got.machine
    assert got.data_s == pytest.approx(0.050) and cause_title(got) == "its data loading"
    assert cause_action(got, False, "raise --dataloader_num_workers") == "raise --dataloader_num_workers"


def test_a_loader_slow_in_every_other_step_is_said_at_its_cost_per_step():
    # A trial: rank 1's collator slept 30 ms in every other batch; the median of its excess landed on either level by
    # one step's chance ("2.1 ms more per step"). Its interquartile mean is the middle of the two: 15 ms.
    from hf_distprof.core.stats import interquartile_mean

    for n in (53, 54):  # the slow steps one more than the others, one fewer, or as many
        for first in (0, 1):
            table = {r: [(0.011 + (0.030 if r == 1 and i % 2 == first else 0.0), 0.0,
                          0.001 + (0.030 if r == 1 and i % 2 == first else 0.0), 0.010, 256.0, 8.0)
                         for i in range(n)] for r in (0, 1)}
            got = attribute_rows(table, 1, 10.0)
            slow = sum(1 for i in range(n) if i % 2 == first)
            assert got is not None and got.cause == Cause.INPUT
            assert got.data_s == pytest.approx(interquartile_mean([0.030] * slow + [0.0] * (n - slow)))
            assert 0.0135 < got.data_s < 0.0165 and got.excess_s == pytest.approx(got.data_s)
    # Stalls in under a quarter of the steps stay out of it, as out of a median: the burst says them.
    table = {r: [(0.011 + (0.3 if r == 1 and i in (5, 20) else 0.0), 0.0, 0.001 + (0.3 if r == 1 and i in (5, 20)
                  else 0.0) + (0.002 if r == 1 else 0.0), 0.010, 256.0, 8.0) for i in range(N)] for r in (0, 1)}
    assert attribute_rows(table, 1, 10.0).data_s == pytest.approx(0.002)


def test_a_wait_for_a_cpu_in_every_other_step_is_said_on_one_footing():
    # A review: its own wait was a median (31 ms, the upper level) beside interquartile means: "it waited 31 ms per step
    # for a CPU (its peers 1.0 ms), 16 ms of the 16 ms its peers wait for it".
    table = {r: [(0.011 + (0.030 if r == 1 and i % 2 else 0.0), 0.001 + (0.030 if r == 1 and i % 2 else 0.0), 0.001,
                  0.009, 256.0, 8.0) for i in range(53)] for r in (0, 1)}
    got = attribute_rows(table, 1, 10.0)
    assert got is not None and got.cause == Cause.CPU_WAIT
    assert got.cpu_wait_abs_s - got.peers_cpu_wait_s == pytest.approx(got.cpu_wait_s)
    assert 0.0135 < got.cpu_wait_s < 0.0165 and cause_why(got).startswith(
        f"not your code: it waited {got.cpu_wait_abs_s * 1e3:.0f} ms per step for a CPU (its peers 1.0 ms), ")


def test_the_interquartile_mean_weighs_quarter_steps_by_their_share():
    from hf_distprof.core.stats import interquartile_mean

    assert interquartile_mean([5.0]) == 5.0 and interquartile_mean([1.0, 2.0]) == 1.5
    assert interquartile_mean([1.0, 2.0, 3.0, 4.0]) == 2.5  # 2 and 3
    assert interquartile_mean([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx((0.75 * 2 + 3 + 0.75 * 4) / 2.5)
    assert interquartile_mean([0.0] * 27 + [30.0] * 26) == pytest.approx(30.0 * 12.75 / 26.5)
    with pytest.raises(ValueError):
        interquartile_mean([])


def test_twice_the_tokens_is_more_work_with_the_ratio():
    # Twice the samples and tokens, twice the compute: the same speed per token.
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.001, 0.010, 0.200, 512.0, 16.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.MORE_WORK and got.unit == "tokens"
    assert got.work_ratio == 2.0 and got.speed_ratio == pytest.approx(1.0, abs=0.03)
    assert cause_title(got) == "more work (2.0x the tokens of its peers)"
    # (The same wobble on a doubled compute reads as 0.98x per token.)
    assert cause_why(got).startswith("it processes 2.00x the tokens of its peers per step, at 0.98x their time per "
                                     "token")
    assert "token-balanced batches" in cause_action(got, False, "-")


def test_more_work_on_a_busy_host_is_more_work_not_the_machine():
    # Both ranks share a busy host (half their time waiting for a CPU); rank 1, with twice the tokens, runs twice as
    # long and so waits twice as long: half the excess its peers wait for, which alone would read as its machine. Its
    # work explains that wait, so the cause is the work.
    got = attribute_rows(rows({0: (0.0, 0.100, 0.010, 0.100, 256.0, 8.0),
                               1: (0.0, 0.200, 0.010, 0.200, 512.0, 16.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.MORE_WORK and not got.more_work_too and not got.machine
    assert got.cpu_wait_s == pytest.approx(0.100) and got.excess_s == pytest.approx(0.200)
    assert cause_title(got) == "more work (2.0x the tokens of its peers)"


def test_a_wait_for_a_cpu_beyond_its_work_is_said_beside_the_work():
    # Rank 1 has twice the tokens and waits 200 ms for a CPU where its work explains 2 ms: both are measured, both said;
    # neither "not your code" nor "your code and data are not the cause".
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.200, 0.010, 0.200, 512.0, 16.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.CPU_WAIT and got.more_work_too and not got.machine
    assert got.work_ratio == 2.0
    assert cause_title(got) == "its machine (it waits for a CPU) and more work (2.0x the tokens of its peers)"
    why = cause_why(got)
    # Its work explains twice its peers' 1 ms: 198 ms is beyond it.
    assert got.cpu_wait_beyond_work_s == pytest.approx(0.198) and got.cpu_wait_s == pytest.approx(0.199)
    assert why.startswith("it waited 200 ms per step for a CPU (its peers 1.0 ms), 198 ms beyond what its work "
                          "explains, of the 299 ms its peers wait for it: another process shares its cores; it also "
                          "does 2.00x the tokens of its peers per step; last to the sync in 24 of 24 steps"), why
    action = cause_action(got, on_gpu=False, phase_advice_text="-")
    assert action.startswith("move or stop the other process on its cores") and "token-balanced batches" in action
    assert "not the cause" not in action and "not your code" not in why
    assert from_json(got.to_json()) == got


def test_slow_data_loading_with_more_work_says_both():
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.001, 0.200, 0.150, 384.0, 12.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.INPUT and got.more_work_too
    assert cause_title(got) == "its data loading and more work (1.5x the tokens of its peers)"
    # 190 ms more loading than its peers' 10 ms; 1.5x the samples explain 5 ms of it.
    assert cause_why(got).startswith("its data loading takes 190 ms more per step than its peers', 185 ms beyond "
                                     "what its work explains; it also does 1.50x the tokens")
    assert cause_action(got, False, "raise --dataloader_num_workers").startswith(
        "raise --dataloader_num_workers; then even out the work per rank")


def test_loading_in_proportion_to_more_work_is_the_work():
    # Twice the samples, twice the loading (200 ms against 100 ms) and twice the compute (100 ms against 50 ms): the
    # loading's excess (100 ms) is above the compute's (50 ms), but all of it is what its work explains: more work,
    # not its data loading (which it would have been before the work was weighed).
    got = attribute_rows(rows({0: (0.0, 0.001, 0.100, 0.050, 256.0, 8.0),
                               1: (0.0, 0.001, 0.200, 0.100, 512.0, 16.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.MORE_WORK and not got.more_work_too
    assert got.data_s == pytest.approx(0.100) and got.data_beyond_work_s == pytest.approx(0.0, abs=1e-9)


def test_the_same_work_slower_is_its_machine():
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.001, 0.010, 0.140, 256.0, 8.0)}), 1, 10.0)
    assert got is not None and got.cause == Cause.SLOWER_MACHINE and got.machine
    assert got.work_ratio == 1.0 and got.speed_ratio == pytest.approx(1.4, abs=0.03)
    assert cause_why(got).startswith("the same work, slower: it does the same work (1.00x the tokens of its peers) 1.")
    assert cause_title(got) == "its machine (the same work, slower)"  # no device evidence: "not your code" unsaid
    assert "nvidia-smi" in cause_action(got, True, "-") and "nvidia-smi" not in cause_action(got, False, "-")
    # On CPU a busy thread of its own process (the GIL) slows the same work alike: named, and not ruled out.
    assert "a busy thread of the rank's own process holding the GIL" in cause_action(got, False, "-")
    assert "your code" not in cause_action(got, False, "-")


def test_without_tokens_the_work_is_counted_in_samples_and_a_burst_is_said_as_one():
    # No tokens counted anywhere: samples. Rank 1 slow in steps 4-11 only (8 of 24): in bursts.
    base = rows({0: (0.0, 0.0, 0.010, 0.100, 0.0, 8.0), 1: (0.0, 0.0, 0.010, 0.100, 0.0, 8.0)}, wobble=0.0)
    base[1] = [(a + (0.05 if 4 <= i < 12 else -0.001), w, d, c + (0.05 if 4 <= i < 12 else -0.001), t, s)
               for i, (a, w, d, c, t, s) in enumerate(base[1])]
    got = attribute_rows(base, 1, 10.0)
    assert got is not None and got.unit == "samples" and (got.slowest_in, got.longest_run) == (8, 8)
    assert not got.persistent and cause_why(got).endswith("last to the sync in 8 of 24 steps, in bursts (at most 8 in "
                                                          "a row)")


def test_attribution_needs_two_ranks_and_a_step_and_round_trips_through_json():
    assert attribute_rows({0: rows({0: CLEAN})[0]}, 0, 10.0) is None
    empty = {p: {0: [], 1: []} for p in ("arrival", "cpu_wait", "data", "compute", "units")}
    assert attribute(empty, 1, 10.0) is None and attribute(empty, 5, 10.0) is None
    got = attribute_rows(rows({0: CLEAN, 1: (0.0, 0.118, 0.010, 0.100, 256.0, 8.0)}), 1, 10.0)
    assert got is not None and from_json(got.to_json()) == got and got.to_json()["cause"] == "cpu_wait"
    assert from_json({"cause": "gremlins"}) is None and from_json(None) is None


def test_the_run_verdict_names_a_rank_its_peers_wait_for_even_when_its_own_work_is_even():
    parts = rows({0: CLEAN, 1: (0.0, 0.118, 0.010, 0.100, 256.0, 8.0)})
    own = {r: [a - w for a, w, *_ in steps] for r, steps in parts.items()}
    arrival = {r: [a for a, *_ in steps] for r, steps in parts.items()}
    step = [0.3] * N
    verdict = judge_run(own, arrival, 10.0, step, step)
    assert (verdict.status, verdict.rank) == ("raised", 1) and verdict.claim.startswith(f"rank 1's {ARRIVAL}")
    # Own work uneven: it decides, whatever the wait.
    own[1] = [v * 1.5 for v in own[1]]
    first = judge_run(own, arrival, 10.0, step, step)
    assert first.raised and OWN_WORK in first.claim
    # Nobody waited: the own-work verdict, quiet, stands.
    even = {0: arrival[0], 1: arrival[0]}
    quiet = judge_run({0: own[0], 1: own[0]}, even, 10.0, step, step)
    assert quiet.status == "quiet" and OWN_WORK in quiet.claim


def test_the_live_series_judges_and_attributes_the_rows_it_is_sent():
    series = StepSeries(2)
    parts = rows({0: CLEAN, 1: (0.0, 0.118, 0.010, 0.100, 256.0, 8.0)})
    series.add([[[s, 0.3, a - w, 0.3 - w, a, w, d, c, t, n] for s, (a, w, d, c, t, n) in enumerate(steps, start=2)]
                for steps in parts.values()])
    verdict = series.verdict(10.0)
    assert verdict is not None and (verdict.status, verdict.rank) == ("raised", 1)
    assert series.cause(1, 10.0) == attribute_rows(parts, 1, 10.0)
    # Rows of older callers (no parts): the own-work verdict alone, and no cause.
    old = StepSeries(2)
    old.add([[[s, 0.3, a - w] for s, (a, w, *_) in enumerate(steps, start=2)] for steps in parts.values()])
    assert old.verdict(10.0).status == "quiet" and old.cause(1, 10.0) is None  # type: ignore[union-attr]


def test_the_data_advice_asks_for_what_the_run_s_dataloader_does_not_set(tmp_path):
    """A trial's run with 2 persistent workers was told "num_workers > 0, persistent_workers=True"; an IterableDataset's
    run (accelerate dispatches its batches from rank 0) was never told so."""
    import json
    import shutil
    from pathlib import Path

    from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
    from torch.utils.data import DataLoader

    from hf_distprof.analysis import AnalysisOptions, analyze_paths
    from hf_distprof.core.advice import LoaderSettings, load_ahead, loader_from_json, phase_advice
    from hf_distprof.timing.instrument import loader_settings

    assert loader_settings(DataLoader(list(range(8)), batch_size=2)) == LoaderSettings(0, False, False, None, False)
    shard = DataLoaderShard(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True, pin_memory=True)
    assert loader_settings(shard) == LoaderSettings(2, True, True, 2, False)
    assert loader_settings(DataLoaderDispatcher(list(range(8)), batch_size=2)).dispatched is True
    assert loader_settings([1, 2]) is None
    assert loader_settings(DataLoader(list(range(8)), batch_size=2, num_workers=True)).num_workers == 1
    assert loader_from_json(LoaderSettings(2, True, True, 2).to_json()) == LoaderSettings(2, True, True, 2)
    for bad in (None, 5, {"num_workers": "2"}, {"num_workers": 2, "persistent_workers": 1, "pin_memory": True,
                                                 "prefetch_factor": 2, "dispatched": False},
                {"num_workers": 2, "persistent_workers": True, "pin_memory": True, "prefetch_factor": True,
                 "dispatched": False}):
        assert loader_from_json(bad) is None
    two = LoaderSettings(2, True, True, 4)
    assert phase_advice("data", True, two) == (
        "its input pipeline is the bottleneck: raise --dataloader_num_workers above its 2, raise "
        "--dataloader_prefetch_factor above its 4, pre-tokenize the dataset instead of tokenizing in the collator, and "
        "check that host for CPU or disk contention")
    assert load_ahead(False, LoaderSettings(0, False, False, None)) == (
        "Load data ahead of the step: raise --dataloader_num_workers (0 now: the training process loads each batch "
        "between steps)")
    assert load_ahead(True, LoaderSettings(2, False, False, 2, True)).startswith(
        "Load data ahead of the step: give each rank its own shard of the data and set --accelerator_config "
        "'{\"dispatch_batches\": false}' (accelerate now dispatches the batches: rank 0 loads every rank's and sends "
        "them), raise --dataloader_num_workers above its 2, set --dataloader_persistent_workers")
    assert load_ahead(True, None) == ("Load data ahead of the step: DataLoader num_workers > 0, pin_memory=True, "
                                      "persistent_workers=True, prefetch_factor")  # (no settings recorded: as before)
    # analyze reads them from timing_summary.json: the slow rank's and the what-if's advice follow them.
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "golden" / "cpu_slow_data", run)
    summary = json.loads((run / "timing_summary.json").read_text())
    summary["dataloader"] = two.to_json()
    (run / "timing_summary.json").write_text(json.dumps(summary))
    actions = [f.action for f in analyze_paths([run], AnalysisOptions(workers=1)).findings]
    assert any(a.startswith("Rank 1: its input pipeline is the bottleneck: raise --dataloader_num_workers above its 2,")
               for a in actions), actions
    assert ("Load data ahead of the step: raise --dataloader_num_workers above its 2, raise "
            "--dataloader_prefetch_factor above its 4") in actions


def test_compute_a_little_slower_for_the_same_tokens_asks_about_padding_then_the_host():
    # Trial U: a clean run on a shared host named rank 0's compute ("13 ms more per step ... with 1.00x the tokens")
    # and told it only to check for uneven sequence lengths, which the same token count makes unlikely.
    got = attribute_rows(rows({0: (0.0, 0.001, 0.010, 0.107, 256.0, 8.0), 1: CLEAN}), 0, 10.0)
    assert got is not None and got.cause == Cause.COMPUTE
    assert got.work_ratio == 1.0 and got.speed_ratio == pytest.approx(1.07, abs=0.01)
    action = cause_action(got, False, "its forward compute is slower: check for uneven sequence lengths")
    assert action.startswith(f"it has about its peers' tokens (1.00x) at {got.speed_ratio:.2f}x their time per token: "
                             "if its batches are padded longer (the same tokens in longer sequences), pad to a fixed "
                             "length or use --group_by_length; if not, its host: another process on its cores")
    assert "nvidia-smi" in cause_action(got, True, "-")
