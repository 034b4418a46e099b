"""Windows opened on demand and on anomaly: the pure decisions (exact steps), the flags, and PROFILE_NOW / SIGUSR1
through the profiler callback in-process."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from transformers import HfArgumentParser, TrainerCallback

from hf_distprof import ProfilerCallback, ProfilingArguments, add_profiling_args
from hf_distprof.callbacks.profiler.capture import (
    RECORD,
    RECORD_AND_SAVE,
    WARMUP,
    Anomaly,
    CapturePlan,
    Note,
    SlowStepDetector,
)

from hf_distprof.callbacks.profiler import schedule

from . import fake_trainer

HOST = "node-0"


@pytest.fixture(autouse=True)
def fixed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: f"{HOST}.cluster.local")


def never(step: int) -> bool:
    return False


def plan(**kw) -> CapturePlan:
    defaults = dict(warmup_steps=1, active_steps=3, max_steps=100, busy=never, on_demand=True,
                    max_anomaly_captures=1, anomaly_factor=2.0)
    return CapturePlan(**{**defaults, **kw})


def slow(rank: int, step: int, step_s: float = 1.5, median_s: float = 0.2) -> Note:
    return Note(rank, anomaly=Anomaly(step, step_s, median_s))


# ---- the slow-step detector --------------------------------------------------------------------


def test_a_clean_series_raises_no_anomaly():
    detector = SlowStepDetector(2.0)
    # Noisy but never twice the median: 0.2 s +- 40%.
    times = [0.2, 0.28, 0.12, 0.25, 0.19, 0.3, 0.14, 0.22, 0.39, 0.2] * 5
    assert [detector.add(step, t) for step, t in enumerate(times, start=1)] == [None] * len(times)


def test_a_stall_is_named_with_its_step_time_and_the_median_before_it():
    detector = SlowStepDetector(2.0)
    got = [detector.add(step, 1.7 if step == 10 else 0.2 + 0.01 * (step % 3)) for step in range(1, 16)]
    # Steps 1-3 are warm-up; the median of steps 4-9 (0.20, 0.21, 0.22, 0.20, 0.21, 0.22) is 0.21.
    (anomaly,) = [a for a in got if a is not None]
    assert (anomaly.step, anomaly.step_s) == (10, 1.7)
    assert anomaly.median_s == pytest.approx(0.21) and anomaly.ratio == pytest.approx(1.7 / 0.21)


def test_warm_up_steps_short_history_and_traced_steps_are_never_judged():
    detector = SlowStepDetector(2.0, start_step=100)
    # Steps 101-103 (the first three of a resumed run) are skipped however slow; then 5 steps of history.
    assert [detector.add(s, 9.0) for s in (101, 102, 103)] == [None, None, None]
    assert [detector.add(s, 0.1) for s in range(104, 108)] == [None] * 4
    assert detector.add(108, 5.0) is None  # only 4 steps of history
    detector = SlowStepDetector(2.0)
    for step in range(1, 10):
        detector.add(step, 0.1)
    assert detector.add(10, 5.0, traced=True) is None  # slowed by the profiler itself
    assert detector.add(11, 0.3) == Anomaly(11, 0.3, 0.1)  # and the traced step did not enter the median


def test_a_lasting_slowdown_becomes_the_new_median():
    detector = SlowStepDetector(2.0, history=6, min_history=5)
    for step in range(1, 10):
        detector.add(step, 0.1)
    flagged = [s for s in range(10, 20) if detector.add(s, 0.5) is not None]
    assert flagged == [10, 11, 12]  # then 0.5 s steps hold the median's majority


# ---- the plan: which window, exactly --------------------------------------------------------------


def test_a_request_opens_warm_up_then_active_steps_right_after_the_agreement_step():
    p = plan(warmup_steps=2, active_steps=3)
    decision = p.agree(10, [Note(0), Note(1, demand=("SIGUSR1",))])
    assert decision.window is not None
    assert (decision.window.first, decision.window.first_recorded, decision.window.last) == (11, 13, 15)
    assert [p.phase(s) for s in range(10, 17)] == [None, WARMUP, WARMUP, RECORD, RECORD, RECORD_AND_SAVE, None]
    assert decision.message == ("profiling window opened at step 10: warm-up 11-12, recorded 13-15, on every "
                                "profiling rank; why: on demand: SIGUSR1 on rank 1")


def test_no_notes_no_window_and_no_message():
    p = plan()
    assert p.agree(10, [Note(0), Note(1)]).window is None
    assert p.agree(10, [Note(0), Note(1)]).message == ""
    assert p.windows == []


def test_anomalies_open_at_most_max_anomaly_captures_windows():
    p = plan(max_anomaly_captures=2, on_demand=False)
    first = p.agree(10, [slow(0, 9, 1.2), slow(1, 10, 1.5)])
    assert first.window is not None and (first.window.first, first.window.last) == (11, 14)
    # The slowest rank first, against its own median.
    assert first.message.endswith(
        "why: --profile-on-anomaly (anomaly capture 1 of 2; over --anomaly-factor 2): rank 1's step 10 took "
        "1.500 s, 7.5x its running median of 0.200 s; rank 0's step 9 took 1.200 s, 6.0x its running median of "
        "0.200 s")
    second = p.agree(20, [slow(0, 19), Note(1)])
    assert second.window is not None and (second.window.first, second.window.last) == (21, 24)
    assert p.listening is False and p.watching_anomalies is False
    assert p.agree(30, [slow(0, 29), slow(1, 29)]).window is None
    assert [(w.first, w.last) for w in p.windows] == [(11, 14), (21, 24)]
    assert p.anomaly_captures == 2


def test_a_request_while_a_window_is_still_to_run_is_folded_into_it():
    p = plan(max_anomaly_captures=1)
    p.agree(10, [slow(0, 10)])
    folded = p.agree(12, [Note(0, demand=("PROFILE_NOW",))])
    assert folded.window is None
    assert folded.message == ("on demand: PROFILE_NOW on rank 0: the window opened at step 10 (steps 11-14) covers "
                              "it; no other window")
    # Once that window has ended (its last step is 14), a request opens a new one.
    later = p.agree(14, [Note(1, demand=("PROFILE_NOW", "SIGUSR1"))])
    assert later.window is not None and (later.window.first, later.window.last) == (15, 18)
    assert "on demand: PROFILE_NOW on rank 1, SIGUSR1 on rank 1" in later.message
    # A shared run folder: every rank sees the file.
    shared = plan().agree(10, [Note(0, demand=("PROFILE_NOW",)), Note(1, demand=("PROFILE_NOW", "SIGUSR1"))])
    assert shared.message == ("profiling window opened at step 10: warm-up 11, recorded 12-14, on every profiling "
                              "rank; why: on demand: PROFILE_NOW on ranks 0, 1, SIGUSR1 on rank 1")


def test_a_window_never_overlaps_the_regular_schedule():
    # The regular schedule traces steps 12-17 (warm-up and active).
    p = plan(warmup_steps=1, active_steps=2, busy=lambda s: 12 <= s <= 17)
    decision = p.agree(10, [Note(0, demand=("PROFILE_NOW",))])
    assert decision.window is not None and (decision.window.first, decision.window.last) == (18, 20)
    assert p.traced(15) and p.traced(19) and not p.traced(11)


def test_near_the_end_a_window_is_cut_and_past_it_there_is_none():
    p = plan(warmup_steps=1, active_steps=3, max_steps=20)
    cut = p.agree(18, [Note(0, demand=("SIGUSR1",))])
    assert cut.window is not None and (cut.window.first, cut.window.first_recorded, cut.window.last) == (19, 20, 22)
    assert "recorded 20-22, cut at step 20 by the end of training" in cut.message
    p = plan(warmup_steps=2, active_steps=3, max_steps=20)
    none = p.agree(19, [Note(0, demand=("SIGUSR1",))])
    assert none.window is None and none.message.endswith("no window")
    # Every step taken by a schedule repeating without idle steps: no window either.
    assert plan(busy=lambda s: True).agree(10, [Note(0, demand=("SIGUSR1",))]).window is None


# ---- the flags -------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--anomaly-factor", "1", "must be a number > 1"),
    ("--anomaly-factor", "x", "must be a number"),
    ("--max-anomaly-captures", "0", "must be an integer >= 1"),
    ("--profile-on-anomaly", "often", "true/false"),
])
@pytest.mark.parametrize("how", ["HfArgumentParser", "argparse"])
def test_bad_capture_flags_exit_2_naming_the_flag_and_range(flag, value, message, how, capsys):
    with pytest.raises(SystemExit) as exc:
        if how == "argparse":
            parser = argparse.ArgumentParser()
            add_profiling_args(parser)
            parser.parse_args([flag, value])
        else:
            HfArgumentParser(ProfilingArguments).parse_args_into_dataclasses([flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and message in err


def test_capture_flags_need_enable_profiling_and_default_off():
    defaults = ProfilingArguments(enable_profiling=True)
    assert (defaults.profile_on_demand, defaults.profile_on_anomaly, defaults.anomaly_factor,
            defaults.max_anomaly_captures) == (False, False, 2.0, 1)
    with pytest.raises(ValueError, match=r"^--profile-on-anomaly opens profiler windows: it needs --enable-profiling"):
        ProfilingArguments(profile_on_anomaly=True)
    with pytest.raises(ValueError, match=r"^--profile-on-demand opens profiler windows: it needs --enable-profiling"):
        ProfilingArguments(profile_on_demand=True)


# ---- through the profiler callback -------------------------------------------------------------


class Triggers(TrainerCallback):
    """Before the profiler: logs every 500 steps (the Trainer's default: capture must not wait for it); at the start
    of given steps, touches PROFILE_NOW or sends SIGUSR1."""

    def __init__(self, touch_at: int = 0, signal_at: int = 0) -> None:
        self.touch_at, self.signal_at = touch_at, signal_at
        self.run_dir: Path | None = None

    def on_train_begin(self, args, state, control, **kw):
        state.logging_steps = 500

    def on_step_begin(self, args, state, control, **kw):
        step = state.global_step + 1
        if step == self.touch_at:
            assert self.run_dir is not None
            (self.run_dir / "PROFILE_NOW").touch()
        if step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)


def on_demand(tmp_path: Path, wait: int, **when: int) -> tuple[ProfilingArguments, Triggers, ProfilerCallback]:
    """A profiler listening for requests (warm-up 1, 2 recorded steps, agreeing every 2 steps) after ``wait`` steps of
    its schedule, and the callback that makes them at the steps ``when`` names (``touch_at``, ``signal_at``)."""
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=wait, profiler_warmup_steps=1, profiler_active_steps=2,
                              profile_on_demand=True)
    triggers = Triggers(**when)
    triggers.run_dir = tmp_path / "P" / "r"
    cb = ProfilerCallback(args)
    cb.agree_every = 2
    return args, triggers, cb


def traces(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.endswith((".pt.trace.json.gz", "_summary.txt")))


def profiler_steps(trace: Path) -> list[int]:
    with gzip.open(trace, "rt") as fh:
        names = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    return sorted(int(n.split("#")[1]) for n in names)


def test_profile_now_and_sigusr1_each_open_exactly_one_window(tmp_path):
    args, triggers, cb = on_demand(tmp_path, 1000, touch_at=2, signal_at=6)
    before = signal.getsignal(signal.SIGUSR1)
    fake_trainer.run([triggers, cb], 12, tmp_path)
    # PROFILE_NOW at step 2 -> its note gathered from step 2, read at step 3 -> warm-up 4, recorded 5-6;
    # SIGUSR1 at step 6 -> gathered from 6, read at 7 -> 8, 9-10.
    assert traces(triggers.run_dir) == [
        f"rank0_{HOST}_step5-6.pt.trace.json.gz", f"rank0_{HOST}_step5-6_summary.txt",
        f"rank0_{HOST}_step9-10.pt.trace.json.gz", f"rank0_{HOST}_step9-10_summary.txt",
    ]
    assert profiler_steps(triggers.run_dir / f"rank0_{HOST}_step5-6.pt.trace.json.gz") == [5, 6]
    assert profiler_steps(triggers.run_dir / f"rank0_{HOST}_step9-10.pt.trace.json.gz") == [9, 10]
    assert not (triggers.run_dir / "PROFILE_NOW").exists()  # consumed
    assert signal.getsignal(signal.SIGUSR1) == before  # put back at train end


def test_a_request_too_late_for_a_window_is_said_and_its_file_removed(tmp_path, caplog):
    # A trial touched PROFILE_NOW at step 55 of 60: no window, nothing said, and the file stayed in the run folder.
    _, triggers, cb = on_demand(tmp_path, 1000, touch_at=11)
    with caplog.at_level("WARNING", logger="hf_distprof"):
        fake_trainer.run([triggers, cb], 12, tmp_path)
    assert traces(triggers.run_dir) == [] and not (triggers.run_dir / "PROFILE_NOW").exists()
    assert (f"--profile-on-demand: {triggers.run_dir / 'PROFILE_NOW'} came too late: training ended before a window "
            "could record (it opens within 5 + 1 + warm-up steps); removed, no window opened") in caplog.text


class Asks(TrainerCallback):
    """After the profiler, at each step's end: what the one schedule module tells every other callback."""

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.traced: list[int] = []
        self.recorded: list[int] = []

    def on_train_begin(self, args, state, control, **kw):
        self.is_traced = schedule.traced_steps(self.args, state.global_step)
        self.is_recorded = schedule.recorded_steps(self.args, state.global_step)

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        if self.is_traced(step):
            self.traced.append(step)
        if self.is_recorded(step):
            self.recorded.append(step)


def test_an_on_demand_window_after_a_regular_one_is_named_by_its_own_steps(tmp_path):
    # Regular window: warm-up 4, recorded 5-6. PROFILE_NOW at step 2 cannot fit before it: warm-up 7, 8-9.
    args, triggers, cb = on_demand(tmp_path, 3, touch_at=2)
    asks = Asks(args)
    fake_trainer.run([triggers, asks, cb], 10, tmp_path)
    # The one schedule module tells every other callback (step timer, memory views, --nsys-window) about both windows;
    # after train end the plan is withdrawn: a later run's schedule is the regular one alone.
    assert asks.traced == [4, 5, 6, 7, 8, 9] and asks.recorded == [5, 6, 8, 9]
    assert [s for s in range(1, 11) if schedule.traced_steps(args)(s)] == [4, 5, 6]
    assert [s for s in range(1, 11) if schedule.recorded_steps(args)(s)] == [5, 6]
    # ... but the run's own predicates keep its windows after its train end: the step timer and the memory logger end
    # after the profiler callback (their last figures left the extra windows out).
    assert [s for s in range(1, 11) if asks.is_traced(s)] == [4, 5, 6, 7, 8, 9]
    assert [s for s in range(1, 11) if asks.is_recorded(s)] == [5, 6, 8, 9]
    assert traces(triggers.run_dir) == [
        f"rank0_{HOST}_step5-6.pt.trace.json.gz", f"rank0_{HOST}_step5-6_summary.txt",
        f"rank0_{HOST}_step8-9.pt.trace.json.gz", f"rank0_{HOST}_step8-9_summary.txt",
    ]
    assert profiler_steps(triggers.run_dir / f"rank0_{HOST}_step8-9.pt.trace.json.gz") == [8, 9]


def test_the_step_timer_marks_an_on_demand_window_s_steps_traced_though_it_logs_after_the_window(tmp_path):
    # Logging every 500 steps: the step timer resolves and writes every step at train end, after the profiler
    # callback's train end (a trial's run with --logging-steps 100 marked no step of its anomaly window traced).
    from hf_distprof import StepTimerCallback

    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=1000, profiler_warmup_steps=1, profiler_active_steps=2,
                              profile_on_demand=True, enable_step_timing=True)
    triggers = Triggers(touch_at=2)
    triggers.run_dir = tmp_path / "P" / "r"
    cb = ProfilerCallback(args)
    cb.agree_every = 2
    timer = StepTimerCallback(args)
    cb.step_timer = timer
    fake_trainer.run([triggers, cb, timer], 8, tmp_path)
    rows = [json.loads(line) for line in (triggers.run_dir / "timing_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["traced"]] == [4, 5, 6]  # warm-up 4, recorded 5-6


def test_a_window_opened_on_demand_is_told_in_tensorboard_at_its_step(tmp_path, monkeypatch):
    # report_to names tensorboard: the decision is a text event in the run's TensorBoard folder, beside the step
    # timer's warnings (a trial found none: the trackers' text skipped TensorBoard for every sender).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_distprof import tensorboard
    from hf_distprof.callbacks.profiler.triggers import CAPTURES_TAG

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=1000, profiler_warmup_steps=1, profiler_active_steps=2,
                              profile_on_demand=True)

    class ToTensorBoard(Triggers):
        def on_train_begin(self, args, state, control, **kw):
            super().on_train_begin(args, state, control, **kw)
            args.report_to = ["tensorboard"]

    triggers = ToTensorBoard(touch_at=2)
    triggers.run_dir = tmp_path / "P" / "r"
    cb = ProfilerCallback(args)
    cb.agree_every = 2
    fake_trainer.run([triggers, cb], 8, tmp_path)
    tensorboard.close_writers()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (event,) = events.Tensors(f"{CAPTURES_TAG}/text_summary")
    assert event.step == 3 and "on demand: PROFILE_NOW on rank 0" in event.tensor_proto.string_val[0].decode()


def test_without_the_flags_nothing_is_watched(tmp_path):
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=1000)
    triggers = Triggers(touch_at=2)
    triggers.run_dir = tmp_path / "P" / "r"
    cb = ProfilerCallback(args)
    before = signal.getsignal(signal.SIGUSR1)
    seen: list[object] = []

    class Spy(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            seen.append((cb._triggers, signal.getsignal(signal.SIGUSR1)))

    fake_trainer.run([triggers, cb, Spy()], 6, tmp_path)
    assert seen == [(None, before)] * 6
    assert traces(triggers.run_dir) == []
    assert (triggers.run_dir / "PROFILE_NOW").exists()  # not consumed: nobody looks


def _stepping(triggers: Any, monkeypatch: Any) -> Any:
    """``step(number, seconds)``: a step that long on the triggers' own clock, from its boundary to its end."""
    import hf_distprof.callbacks.profiler.triggers as triggers_module

    clock = {"now": 0.0}
    monkeypatch.setattr(triggers_module.time, "perf_counter", lambda: clock["now"])

    def step(number: int, seconds: float, pause: bool = False) -> None:
        triggers.boundary(pause)
        clock["now"] += seconds
        triggers.step_end(number)

    return step


def test_a_step_slowed_by_a_compact_summary_being_written_is_never_an_anomaly(tmp_path, monkeypatch):
    import hf_distprof.callbacks.profiler.triggers as triggers_module

    args = ProfilingArguments(enable_profiling=True, profile_on_anomaly=True, profiler_wait_steps=1000)
    triggers = triggers_module.CaptureTriggers(args, tmp_path, 0, 100, never, every=50)
    step = _stepping(triggers, monkeypatch)

    for number in range(1, 12):
        step(number, 0.2)
    triggers.exporting = lambda: True  # the thread parsing the trace just written holds the GIL
    step(12, 1.0)
    assert triggers._anomaly is None
    triggers.exporting = lambda: False
    step(13, 1.0)
    anomaly = triggers._anomaly
    assert anomaly is not None and (anomaly.step, anomaly.step_s) == (13, pytest.approx(1.0))


def test_the_step_after_a_checkpoint_or_an_evaluation_is_never_an_anomaly(tmp_path, monkeypatch):
    # Each rank's clock restarts when it is done with a checkpoint (or an evaluation), but the next step then waits
    # for the slowest rank's: on the rank that saved nothing it once read 2.4x the median step and took the run's
    # only anomaly capture (a new user's trial, --save_steps 15). Neither that step nor its time in the median counts;
    # the step after it is judged again.
    import hf_distprof.callbacks.profiler.triggers as triggers_module

    args = ProfilingArguments(enable_profiling=True, profile_on_anomaly=True, profiler_wait_steps=1000)
    triggers = triggers_module.CaptureTriggers(args, tmp_path, 0, 100, never, every=50)
    step = _stepping(triggers, monkeypatch)

    for number in range(1, 16):
        step(number, 0.2)
    times = len(triggers._step_times)
    step(16, 1.0, pause=True)  # the checkpoint after step 15 ended here: step 16 waited for the other rank's
    assert triggers._anomaly is None and len(triggers._step_times) == times
    step(17, 1.0)
    anomaly = triggers._anomaly
    assert anomaly is not None and (anomaly.step, anomaly.step_s) == (17, pytest.approx(1.0))


def test_the_step_after_a_window_is_never_an_anomaly_on_any_rank(tmp_path, monkeypatch):
    # The window's trace is written between its last step and the next; every rank's next step waits in its first
    # collective for the slowest rank's export (a trial: 1.17 s against 0.04 s on a rank that traced nothing). It is
    # a pause, on every rank: neither an anomaly nor in the median.
    import hf_distprof.callbacks.profiler.triggers as triggers_module

    args = ProfilingArguments(enable_profiling=True, profile_on_anomaly=True, profiler_wait_steps=10,
                              profiler_warmup_steps=1, profiler_active_steps=2)  # traced: steps 11-13
    from hf_distprof.callbacks.profiler.schedule import scheduled_steps

    triggers = triggers_module.CaptureTriggers(args, tmp_path, 0, 100, scheduled_steps(args), every=50)
    step = _stepping(triggers, monkeypatch)

    for number in range(1, 14):
        step(number, 0.2)
    times = len(triggers._step_times)
    step(14, 1.0)
    assert triggers._anomaly is None and len(triggers._step_times) == times
    for number in range(15, 20):
        step(number, 0.2)
    step(20, 1.0)
    anomaly = triggers._anomaly
    assert anomaly is not None and (anomaly.step, anomaly.step_s) == (20, pytest.approx(1.0))
