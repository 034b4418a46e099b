"""--max-trace-mb: the allowance arithmetic, the messages, and a second window shortened in a real profiler run."""

from __future__ import annotations

import gzip
import json
import logging
import math
import socket
from pathlib import Path

import pytest
from torch.profiler import ProfilerAction
from transformers import TrainerCallback

from hf_distprof import ProfilerCallback, ProfilingArguments
from hf_distprof.callbacks.profiler.capture import Note
from hf_distprof.callbacks.profiler.trace_budget import TraceBudget, costliest_option
from hf_distprof.callbacks.profiler.window_policy import WindowPolicy

from . import fake_trainer

HOST = "node-0"


@pytest.fixture(autouse=True)
def fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"{HOST}.cluster.local")


def test_the_largest_rank_counts_and_the_window_keeps_the_steps_that_fit():
    budget = TraceBudget(limit_mb=1.0, active_steps=6)
    assert budget.allowed_steps() == 6  # nothing measured yet
    assert budget.add(4, [(0, 300_000.0), (1, 350_000.0), (2, None)])
    assert (budget.bytes_per_step, budget.measured_by, budget.measured_at) == (350_000.0, 1, 4)
    assert budget.allowed_steps() == 2  # floor(1e6 / 350e3)
    assert not budget.add(6, [(0, 300_000.0), (1, 350_000.0)])  # nothing larger: unchanged
    assert budget.add(8, [(3, 400_000.0)]) and budget.allowed_steps() == 2
    assert budget.message({"with_stack": True, "record_shapes": True}) == (
        "--max-trace-mb 1: the largest first trace (rank 3's) holds 0.400 MB per recorded step: the windows "
        "that start after this step record 2 of 6 active steps (about 0.800 MB), on every rank (turn off "
        "--profiler-with-stack (about +70% trace size) or raise --max-trace-mb)"
    )


def test_ties_go_to_the_lowest_rank():
    budget = TraceBudget(limit_mb=1.0, active_steps=6)
    budget.add(4, [(2, 5e5), (1, 5e5)])
    assert budget.measured_by == 1


@pytest.mark.parametrize(("limit_mb", "per_step", "allowed"), [
    (0.6, 100_000.0, 6),  # exactly six steps: all of them
    (0.6, 100_001.0, 5),
    (5.0, 100_000.0, 6),  # never more than asked
    (0.05, 100_000.0, 0),  # not one step fits
])
def test_allowed_steps_at_the_edges(limit_mb, per_step, allowed):
    budget = TraceBudget(limit_mb=limit_mb, active_steps=6)
    budget.add(2, [(0, per_step)])
    assert budget.allowed_steps() == allowed


def test_a_window_that_fits_says_nothing_and_one_step_too_big_skips():
    fits = TraceBudget(limit_mb=5.0, active_steps=6)
    fits.add(2, [(0, 100_000.0)])
    assert fits.message({}) == ""
    skip = TraceBudget(limit_mb=0.05, active_steps=6)
    skip.add(2, [(0, 100_000.0)])
    assert skip.message({"record_shapes": True}) == (
        "--max-trace-mb 0.05: the largest first trace (rank 0's) holds 0.100 MB per recorded step, more than "
        "the limit: the windows that start after this step are skipped on every rank (turn off "
        "--profiler-record-shapes (about +28%) or raise --max-trace-mb)"
    )
    assert skip.message({}).endswith("skipped on every rank (raise --max-trace-mb)")


def test_the_costliest_option_first():
    assert costliest_option({"record_shapes": True, "profile_memory": True, "with_stack": False}) == (
        "--profiler-profile-memory (about +33%)")
    assert costliest_option({"with_flops": True, "record_shapes": True}) == "--profiler-record-shapes (about +28%)"
    assert costliest_option({"with_flops": True}) == "--profiler-with-flops (about +28%, it records shapes too)"
    assert costliest_option({"record_shapes": False}) is None


def test_a_first_window_over_the_limit_is_kept_and_said():
    budget = TraceBudget(limit_mb=0.5, active_steps=4)
    assert budget.first_window_message(500_000, 4) == ""
    assert budget.first_window_message(600_000, 4) == (
        "--max-trace-mb 0.5: the first window's trace is 0.600 MB for 4 steps, over the limit; it is kept whole (it "
        "is the measurement), and the windows that start after the ranks agree on it are shortened (a window already "
        "begun is not)")  # (a trial's next window, begun before the agreement, came out whole, twice the limit)


def test_the_first_window_over_the_limit_is_said_on_the_console_once(tmp_path, caplog):
    # A trial's 3-rank auto run: the warning came from [RANK 1] and [RANK 2], twice on the console. The lowest rank
    # that traces the window warns; the others put it in their logs.
    def scheduled(step: int) -> ProfilerAction:
        return {2: ProfilerAction.RECORD_AND_SAVE}.get(step, ProfilerAction.NONE)

    args = ProfilingArguments(enable_profiling=True, profile_ranks="1,2", profiler_active_steps=1, max_trace_mb=0.01)
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(b"x" * 20_000)
    levels = {}
    for rank in (1, 2):
        policy = WindowPolicy(args, tmp_path, scheduled, offset=0)
        policy.rank, policy.world_size = rank, 3
        with caplog.at_level(logging.INFO, logger="hf_distprof.callbacks.profiler.window_policy"):
            caplog.clear()
            policy.exported(trace, 1)
        (record,) = [r for r in caplog.records if "over the limit" in r.getMessage()]
        levels[rank] = record.levelno
    assert levels == {1: logging.WARNING, 2: logging.INFO}


def test_the_policy_cuts_the_recorded_steps_and_saves_at_the_last_allowed(tmp_path):
    actions = {2: ProfilerAction.RECORD, 3: ProfilerAction.RECORD_AND_SAVE, 5: ProfilerAction.WARMUP,
               6: ProfilerAction.RECORD, 7: ProfilerAction.RECORD, 8: ProfilerAction.RECORD_AND_SAVE}

    def scheduled(step: int) -> ProfilerAction:
        return actions.get(step, ProfilerAction.NONE)

    args = ProfilingArguments(enable_profiling=True, profiler_active_steps=3, max_trace_mb=0.25)
    policy = WindowPolicy(args, tmp_path, scheduled, offset=0)
    got = []
    for step in range(1, 10):
        if step == 4:
            policy.agree(4, [Note(0, trace_bytes_per_step=100_000.0)])  # 2 steps fit
        policy.window_start(step)
        got.append(policy.filter(step, scheduled(step)))
    n, w, r, s = (ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    assert got == [n, r, s, n, w, r, s, n, n]
    # Step 8 was the window's: the budget kept every rank's profiler from it, so it is not traced (a trial's step timer
    # left such steps out of its verdicts and counted them in the profiler's slowdown).
    assert [step for step in range(1, 10) if policy.cut(step)] == [8]
    from hf_distprof.callbacks.profiler import schedule

    schedule.register(policy)
    try:
        traced = schedule.traced_steps(ProfilingArguments(enable_profiling=True, profiler_wait_steps=4,
                                                          profiler_warmup_steps=1, profiler_active_steps=3))
        assert [step for step in range(1, 10) if traced(step)] == [5, 6, 7]  # (its schedule: 5-8)
    finally:
        schedule.unregister(policy)
    # Skipped windows (no step fits): all of them, a warm-up too.
    skipped = WindowPolicy(args, tmp_path, scheduled, offset=0)
    skipped.agree(4, [Note(0, trace_bytes_per_step=1e9)])
    for step in range(1, 10):
        skipped.window_start(step)
    assert [step for step in range(1, 10) if skipped.cut(step)] == [2, 3, 5, 6, 7, 8]


def profiler_steps(trace: Path) -> list[int]:
    with gzip.open(trace, "rt") as fh:
        names = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    return sorted(int(n.split("#")[1]) for n in names)


class LogEveryTwo(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        state.logging_steps = 2


def test_max_trace_mb_shortens_the_second_window_by_the_first_ones_size(tmp_path, caplog):
    # Windows: recorded 4-7, then 11-14. The first measures (exported at the end of step 7); the note that says so
    # is gathered from step 8 and read at step 9, which shortens the second window to the steps that fit in 0.01 MB
    # (this small model writes about 4 kB per recorded step: 2 of 4 steps fit).
    limit_mb = 0.01
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_record_shapes=False, profiler_wait_steps=3, profiler_warmup_steps=0,
                              profiler_active_steps=4, profiler_repeat=2, max_trace_mb=limit_mb)
    profiler = ProfilerCallback(args)
    profiler.agree_every = 1
    with caplog.at_level(logging.WARNING, logger="hf_distprof.callbacks.profiler.window_policy"):
        fake_trainer.run([LogEveryTwo(), profiler], 15, tmp_path)
    run_dir = tmp_path / "P" / "r"
    first = run_dir / f"rank0_{HOST}_step4-7.pt.trace.json.gz"
    per_step = first.stat().st_size / 4
    allowed = math.floor(limit_mb * 1e6 / per_step)
    assert 1 <= allowed < 4, per_step  # the case under test: a shorter, not a skipped, second window
    traces = sorted(p.name for p in run_dir.glob("*.pt.trace.json.gz"))
    assert traces == sorted([first.name, f"rank0_{HOST}_step11-{10 + allowed}.pt.trace.json.gz"])
    second = run_dir / f"rank0_{HOST}_step11-{10 + allowed}.pt.trace.json.gz"
    assert profiler_steps(second) == list(range(11, 11 + allowed))
    messages = [r.getMessage() for r in caplog.records if "--max-trace-mb" in r.getMessage()]
    assert any(f"step 9: --max-trace-mb 0.01: the largest first trace (rank 0's) holds {per_step / 1e6:.3f} MB "
               f"per recorded step: the windows that start after this step record {allowed} of 4 active steps" in m
               for m in messages), messages


def test_the_steps_a_shortened_window_left_out_are_not_traced_in_the_step_timer_s_rows(tmp_path):
    # A trial: windows shortened to 1 of 4 steps, and the step timer marked all 4 "traced" (left out of its verdicts,
    # counted in the profiler's slowdown), and "after_pause" three steps after the export.
    from hf_distprof import build_callbacks

    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_record_shapes=False, profiler_wait_steps=3, profiler_warmup_steps=0,
                              profiler_active_steps=4, profiler_repeat=2, max_trace_mb=0.01)
    callbacks = build_callbacks(args)
    for cb in callbacks:
        if isinstance(cb, ProfilerCallback):
            cb.agree_every = 1
    fake_trainer.run([LogEveryTwo(), *callbacks], 15, tmp_path)
    run_dir = tmp_path / "P" / "r"
    (second,) = [p for p in run_dir.glob("*_step11-*.pt.trace.json.gz")]
    last = int(second.name.split("_step11-")[1].split(".")[0])
    assert 11 <= last < 14
    rows = [json.loads(line) for line in (run_dir / "timing_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["traced"]] == [4, 5, 6, 7, *range(11, last + 1)]
    assert [r["step"] for r in rows if r["after_pause"]] == [8, last + 1]
