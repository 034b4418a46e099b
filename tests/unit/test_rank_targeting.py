"""--profile-ranks auto: the ranks chosen from given per-rank step times, and the window policy that applies them."""

from __future__ import annotations

import json
import socket

import pytest
from torch.profiler import ProfilerAction
from transformers import TrainerCallback

from hf_distprof import ProfilerCallback, ProfilingArguments, build_callbacks, dist
from hf_distprof.callbacks.step_timer import StepTimerCallback
from hf_distprof.callbacks.profiler.capture import Note
from hf_distprof.callbacks.profiler.rank_targeting import RankView, choose_ranks
from hf_distprof.callbacks.profiler.window_policy import WindowPolicy

from . import fake_trainer

NONE, WARMUP, RECORD, SAVE = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                              ProfilerAction.RECORD_AND_SAVE)


def view(per_rank: dict[int, list[float]], first_step: int = 3, at: int = 6) -> RankView:
    v = RankView()
    v.add(at, {r: [(first_step + i, t) for i, t in enumerate(times)] for r, times in per_rank.items()})
    return v


def test_the_slowest_and_the_median_rank_of_four():
    # Rank 2 works twice as long as the others in every step; the others tie, so the median of them is the middle
    # one by rank.
    choice = choose_ranks(view({0: [0.1] * 4, 1: [0.1] * 4, 2: [0.2] * 4, 3: [0.1] * 4}), 4, 7, 10.0)
    assert (choice.ranks, choice.slowest, choice.median, choice.verdict) == ([1, 2], 2, 1, "raised")
    assert choice.steps == [3, 4, 5, 6] and choice.view_step == 6 and choice.window_first == 7
    assert choice.own_work_s == {0: 0.1, 1: 0.1, 2: 0.2, 3: 0.1}
    assert choice.reason == (
        "rank 2 is the slowest (median pre-sync work 0.2000 s; step by step a median +100.0% over the others'; "
        "slow-rank verdict: raised); rank 1 is the median rank (0.1000 s); from 4 untraced steps 3-6, gathered at "
        "step 6"
    )


def test_the_median_rank_is_the_middle_one_of_the_others_by_median_time():
    times = {0: [0.30, 0.31, 0.29], 1: [0.10, 0.11, 0.10], 2: [0.15, 0.14, 0.15], 3: [0.12, 0.13, 0.12],
             4: [0.20, 0.19, 0.21]}
    choice = choose_ranks(view(times), 5, 9, 10.0)
    # Others by median: 1 (0.10), 3 (0.12), 2 (0.15), 4 (0.20): the lower middle of four is rank 3.
    assert (choice.slowest, choice.median, choice.ranks) == (0, 3, [0, 3])


def test_ties_everywhere_pick_the_lowest_ranks_alike_on_every_rank():
    choice = choose_ranks(view({r: [0.1, 0.1, 0.1] for r in range(4)}), 4, 7, 10.0)
    # The slow-rank candidate is the first of equals (rank 0, "slowest" in every step), then the middle of 1, 2, 3.
    assert (choice.slowest, choice.median, choice.ranks, choice.verdict) == (0, 2, [0, 2], "quiet")


def test_two_ranks_both_trace_and_the_slowest_is_still_named():
    choice = choose_ranks(view({0: [0.1, 0.1], 1: [0.3, 0.3]}), 2, 5, 10.0)
    assert (choice.ranks, choice.slowest, choice.median) == ([0, 1], 1, None)
    assert choice.reason.startswith("2 ranks: every rank traces; rank 1 is the slowest (median pre-sync work 0.3000 s")


@pytest.mark.parametrize(("world", "ranks", "reason"), [
    (4, [0, 3], "no cross-rank view yet (no untraced step timed on every rank before this window): the first and "
                "the last rank, 0 and 3"),
    (2, [0, 1], "2 ranks: every rank traces"),
    (1, [0], "1 rank: every rank traces"),
])
def test_before_any_view_first_and_last_rank_or_every_rank_below_three(world, ranks, reason):
    choice = choose_ranks(RankView(), world, 2, 10.0)
    assert (choice.ranks, choice.slowest, choice.median, choice.view_step, choice.reason) == (
        ranks, None, None, None, reason)


def test_a_rank_missing_from_the_view_means_no_view():
    assert choose_ranks(view({0: [0.1], 1: [0.1], 2: [0.5]}), 4, 7, 10.0).ranks == [0, 3]


def test_the_view_keeps_the_latest_steps_and_judges_only_steps_every_rank_timed():
    v = RankView(keep=3)
    v.add(4, {0: [(1, 0.1), (2, 0.1), (3, 0.1)], 1: [(2, 0.2), (3, 0.2)]})
    v.add(6, {0: [(4, 0.1), (5, 0.1)], 1: [(5, 0.2)]})
    assert v.times == {0: {3: 0.1, 4: 0.1, 5: 0.1}, 1: {2: 0.2, 3: 0.2, 5: 0.2}}
    assert v.per_step(2) == ([3, 5], {0: [0.1, 0.1], 1: [0.2, 0.2]})
    assert v.updated_at == 6


# ---- the window policy: the same decision applied to the profiler's schedule ---------------------------------


def schedule(step: int) -> ProfilerAction:
    """Windows: warm-up 3, recorded 4-5; warm-up 8, recorded 9-10."""
    return {3: WARMUP, 4: RECORD, 5: SAVE, 8: WARMUP, 9: RECORD, 10: SAVE}.get(step, NONE)


def policy(tmp_path, monkeypatch, rank: int, world: int = 4) -> WindowPolicy:
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda: world)
    args = ProfilingArguments(enable_profiling=True, profile_ranks="auto", profiler_active_steps=2)
    return WindowPolicy(args, tmp_path, schedule, offset=0)


def actions(p: WindowPolicy, steps: range) -> list[ProfilerAction]:
    out = []
    for step in steps:
        p.window_start(step)
        out.append(p.filter(step, schedule(step)))
    return out


def slow_rank_notes(slow: int) -> list[Note]:
    return [Note(r, pre_sync=((6, 0.3 if r == slow else 0.1), (7, 0.3 if r == slow else 0.1))) for r in range(4)]


@pytest.mark.parametrize(("rank", "first", "second"), [
    # First window (no view): ranks 0 and 3. Second, after rank 1 was slow at steps 6-7: ranks 1 and 2.
    (0, True, False), (1, False, True), (2, False, True), (3, True, False),
])
def test_each_rank_traces_exactly_the_windows_chosen_for_it(tmp_path, monkeypatch, rank, first, second):
    p = policy(tmp_path, monkeypatch, rank)
    got = actions(p, range(1, 8))
    p.agree(7, slow_rank_notes(1))
    got += actions(p, range(8, 12))
    traced = [WARMUP, RECORD, SAVE]
    assert got == [NONE, NONE, *(traced if first else [NONE] * 3), NONE, NONE,
                   *(traced if second else [NONE] * 3), NONE]
    assert [c.ranks for c in p.choices] == [[0, 3], [1, 2]]


def test_rank_0_writes_one_record_per_window(tmp_path, monkeypatch):
    p = policy(tmp_path, monkeypatch, 0)
    actions(p, range(1, 8))
    p.agree(7, slow_rank_notes(1))
    actions(p, range(8, 12))
    record = json.loads((tmp_path / "profile_ranks.json").read_text())
    assert record["world_size"] == 4
    assert [(w["window_first"], w["view_step"], w["ranks"], w["slowest"], w["median"], w["steps"])
            for w in record["windows"]] == [(3, None, [0, 3], None, None, []), (8, 7, [1, 2], 1, 2, [6, 7])]
    assert record["windows"][1]["own_work_s"] == {"0": 0.1, "1": 0.3, "2": 0.1, "3": 0.1}


def test_steps_the_profiler_ran_over_are_not_sent(tmp_path, monkeypatch):
    class Timing:
        def __init__(self, step: int) -> None:
            # The pre-sync time with a long wait for a CPU (a busy host); its work, what the verdict judges, 0.1 s: a
            # trial's auto traced as "the slowest" the rank whose host was busy, where the verdict named the other.
            self.step, self.pre_sync_s, self.own_work_s = step, 0.5, 0.1

    p = policy(tmp_path, monkeypatch, 0)
    for step in range(1, 8):
        p.add_timing(Timing(step))
    assert p.note_fields() == {"pre_sync": ((1, 0.1), (2, 0.1), (6, 0.1), (7, 0.1)), "trace_bytes_per_step": None}
    assert p.note_fields()["pre_sync"] == ()  # sent once


def test_auto_needs_step_timing():
    with pytest.raises(ValueError, match=r"^--profile-ranks auto chooses ranks by their step times, but "):
        ProfilingArguments(enable_profiling=True, profile_ranks="auto", enable_step_timing=False)


class LogEveryTwo(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        state.logging_steps = 2


def test_build_callbacks_feeds_auto_with_the_step_timers_times(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node-0")
    args = ProfilingArguments(enable_profiling=True, profile_ranks="auto", profiler_output_dir=str(tmp_path / "P"),
                              profiler_run_name="r", profiler_wait_steps=6, profiler_warmup_steps=1,
                              profiler_active_steps=1, profiler_record_shapes=False)
    callbacks = build_callbacks(args)
    (profiler,) = [c for c in callbacks if isinstance(c, ProfilerCallback)]
    (timer,) = [c for c in callbacks if isinstance(c, StepTimerCallback)]
    assert profiler.step_timer is timer
    profiler.agree_every = 2
    # Notes gathered from steps 2, 4 and 6, each read one step later; the step timer's first step is its warm-up,
    # and step 4 is still running when its note is made: the window (warm-up 7, recorded 8) is chosen from the
    # view read at step 5, steps 2-3.
    fake_trainer.run([LogEveryTwo(), *callbacks], 9, tmp_path)
    run_dir = tmp_path / "P" / "r"
    (window,) = json.loads((run_dir / "profile_ranks.json").read_text())["windows"]
    assert (window["window_first"], window["view_step"], window["ranks"], window["slowest"], window["median"],
            window["steps"]) == (7, 5, [0], 0, None, [2, 3])
    assert window["reason"].startswith("1 rank: every rank traces; rank 0 is the slowest (median pre-sync work ")
    assert sorted(p.name for p in run_dir.glob("*.pt.trace.json.gz")) == ["rank0_node-0_step8-8.pt.trace.json.gz"]


def test_no_window_is_chosen_after_the_last_step(tmp_path, monkeypatch):
    # Windows every 8 steps (wait 6, warm-up 1, recorded 1, repeated until the end): a 14-step run takes the window
    # of steps 7-8; the next one would start at step 15, after the run (a trial's profile_ranks.json listed it, and its
    # log said the window from step 41 of a 40-step run was traced on ranks 0, 2).
    monkeypatch.setattr(socket, "gethostname", lambda: "node-0")
    args = ProfilingArguments(enable_profiling=True, profile_ranks="auto", profiler_output_dir=str(tmp_path / "P"),
                              profiler_run_name="r", profiler_wait_steps=6, profiler_warmup_steps=1,
                              profiler_active_steps=1, profiler_repeat=0, profiler_record_shapes=False)
    callbacks = build_callbacks(args)
    (profiler,) = [c for c in callbacks if isinstance(c, ProfilerCallback)]
    profiler.agree_every = 2
    fake_trainer.run([LogEveryTwo(), *callbacks], 14, tmp_path)
    windows = json.loads((tmp_path / "P" / "r" / "profile_ranks.json").read_text())["windows"]
    assert [w["window_first"] for w in windows] == [7]
