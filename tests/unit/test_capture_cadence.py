"""Capture agreements on their own cadence: the note on the wire, the interval from the measured step time, and the
steps at which one process starts and reads its gathers whatever the Trainer's logging interval."""

from __future__ import annotations

import math

import pytest

import hf_distprof.callbacks.profiler.triggers as triggers_module
from hf_distprof import dist
from hf_distprof.callbacks.profiler.capture import (
    MAX_AGREE_EVERY,
    NOTE_LENGTH,
    NOTE_ROWS,
    Anomaly,
    Note,
    agreement_interval,
    decode_note,
    encode_note,
)
from hf_distprof.config import ProfilingArguments


def never(step: int) -> bool:
    return False


def test_a_note_survives_the_wire_with_every_field():
    rows = tuple((s, 0.1 * s) for s in range(1, 21))  # more than a note carries: the last 16 go
    note = Note(3, ("PROFILE_NOW", "SIGUSR1"), Anomaly(12, 1.5, 0.2), rows, 4096.5, 0.21, 0.0004)
    values = encode_note(note)
    assert len(values) == NOTE_LENGTH == 11 + 2 * NOTE_ROWS
    back = decode_note(values)
    assert back == Note(3, ("PROFILE_NOW", "SIGUSR1"), Anomaly(12, 1.5, 0.2), rows[-NOTE_ROWS:], 4096.5, 0.21, 0.0004)
    assert back.pre_sync[0] == (5, pytest.approx(0.5))


def test_an_empty_note_keeps_its_nones():
    values = encode_note(Note(0))
    assert math.isnan(values[7]) and math.isnan(values[8]) and math.isnan(values[9])
    assert decode_note(values) == Note(0)
    assert decode_note(encode_note(Note(1, ("SIGUSR1",)))).demand == ("SIGUSR1",)


def test_a_note_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match=rf"^a capture note has {NOTE_LENGTH} values, got 3$"):
        decode_note([0.0, 1.0, 2.0])


@pytest.mark.parametrize(
    ("step_s", "costs", "expected"),
    [
        ((None, None), (None, None), MAX_AGREE_EVERY),  # nothing measured yet
        ((0.2, 0.2), (None, None), MAX_AGREE_EVERY),
        ((0.4, 0.4), (0.0001, 0.0004), 1),  # 0.4 ms of a 400 ms step: 0.1%, every step
        ((0.2, 0.2), (0.0001, 0.0005), 3),  # 0.5 ms against 0.2 ms allowed per step
        ((0.02, 0.02), (0.001, 0.001), MAX_AGREE_EVERY),  # short steps: capped
        ((0.1, 0.3, 0.2), (0.0002, 0.0002, 0.0002), 1),  # the median rank's step (0.2 s)
        ((0.1, 0.1, 0.3), (0.0002, 0.0002, 0.0002), 2),  # median 0.1 s
    ],
)
def test_the_interval_follows_the_step_time_and_the_agreements_cost(step_s, costs, expected):
    notes = [Note(r, step_s=s, agree_s=c) for r, (s, c) in enumerate(zip(step_s, costs))]
    assert agreement_interval(notes) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(monkeypatch, tmp_path, steps: int, step_s: float, touch_at: int = 0, every: int | None = None,
          gather_s: float = 0.0, start: int = 0, close: bool = True):
    """One process through ``steps`` optimizer steps of ``step_s`` seconds; returns (triggers, gather steps)."""
    clock = Clock()
    monkeypatch.setattr(triggers_module.time, "perf_counter", clock)
    started: list[int] = []
    real = dist.all_gather_floats_async

    def gather(values):
        clock.now += gather_s
        started.append(current["step"])
        return real(values)

    monkeypatch.setattr(triggers_module.dist, "all_gather_floats_async", gather)
    args = ProfilingArguments(enable_profiling=True, profile_on_demand=True, profiler_wait_steps=1000,
                              profiler_warmup_steps=1, profiler_active_steps=2)
    triggers = triggers_module.CaptureTriggers(args, tmp_path, start, steps, never, every=every)
    current = {"step": 0}
    for step in range(start + 1, steps + 1):
        current["step"] = step
        if step == touch_at:
            (tmp_path / "PROFILE_NOW").touch()
        triggers.boundary()
        clock.now += step_s
        triggers.step_end(step)
    if close:
        triggers.close()
    return triggers, started


def test_a_fixed_cadence_gathers_every_n_steps_and_reads_one_step_later(monkeypatch, tmp_path):
    triggers, started = drive(monkeypatch, tmp_path, 20, 0.2, touch_at=7, every=3)
    assert started == [3, 6, 9, 12, 15, 18]
    # PROFILE_NOW at step 7: seen at step 9, read at 10 -> warm-up 11, recorded 12-13.
    (window,) = triggers.plan.windows
    assert (window.agreed_at, window.first, window.first_recorded, window.last) == (10, 11, 12, 13)
    assert not (tmp_path / "PROFILE_NOW").exists()


def test_the_measured_cadence_agrees_every_step_when_steps_are_long(monkeypatch, tmp_path):
    # 0.4 s steps, 0.2 ms per gather: every step once it is measured (first at step 5, measured from step 10).
    triggers, started = drive(monkeypatch, tmp_path, 20, 0.4, gather_s=0.0002)
    assert started == [5, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert triggers.interval == 1


def test_the_measured_cadence_stays_at_five_when_steps_are_short(monkeypatch, tmp_path):
    # 20 ms steps, 1 ms per gather (5% of a step at every step): every 5 steps.
    triggers, started = drive(monkeypatch, tmp_path, 30, 0.02, touch_at=16, gather_s=0.001)
    assert started == [5, 10, 15, 20, 25]
    # Seen at step 20, read at 21 -> warm-up 22, recorded 23-24: 7 steps after the request, logging at 500.
    (window,) = triggers.plan.windows
    assert (window.first_recorded, window.last) == (23, 24)


def test_no_gather_on_the_last_step_and_none_left_unread(monkeypatch, tmp_path):
    triggers, started = drive(monkeypatch, tmp_path, 10, 0.2, every=5, close=False)
    assert started == [5]  # not at step 10, the last: nobody would read it
    assert triggers._pending is None  # before close(): the gather of step 5 was read at step 6


def test_a_resumed_run_counts_its_cadence_from_the_step_it_resumed_at(monkeypatch, tmp_path):
    triggers, started = drive(monkeypatch, tmp_path, 130, 0.02, touch_at=112, start=100, gather_s=0.001)
    assert started == [105, 110, 115, 120, 125]
    (window,) = triggers.plan.windows
    assert (window.agreed_at, window.first_recorded) == (116, 118)


class PairedGather:
    """Two simulated ranks in lockstep: each rank's n-th gather returns both ranks' n-th values."""

    def __init__(self) -> None:
        self.sent: dict[int, list[list[float]]] = {0: [], 1: []}
        self.rank = 0

    def start(self, values):
        rank, index = self.rank, len(self.sent[self.rank])
        self.sent[rank].append(list(values))
        sent = self.sent

        class Pending:
            def result(self):
                return [sent[0][index], sent[1][index]]

        return Pending()


def test_two_ranks_with_different_timings_gather_and_decide_at_the_same_steps(monkeypatch, tmp_path):
    clock = Clock()
    monkeypatch.setattr(triggers_module.time, "perf_counter", clock)
    paired = PairedGather()
    starts: dict[int, list[int]] = {0: [], 1: []}
    current = {"step": 0}

    def gather(values):
        starts[paired.rank].append(current["step"])
        clock.now += (0.0001, 0.0009)[paired.rank]  # rank 1's gathers cost it 9x more
        return paired.start(values)

    monkeypatch.setattr(triggers_module.dist, "all_gather_floats_async", gather)
    monkeypatch.setattr(triggers_module.dist, "get_rank", lambda: paired.rank)
    args = ProfilingArguments(enable_profiling=True, profile_on_demand=True, profile_on_anomaly=True,
                              profiler_wait_steps=1000, profiler_warmup_steps=1, profiler_active_steps=2)
    ranks = [triggers_module.CaptureTriggers(args, tmp_path, 0, 60, never) for _ in range(2)]
    for step in range(1, 61):
        current["step"] = step
        for rank, triggers in enumerate(ranks):
            paired.rank = rank
            triggers.boundary()
            # Rank 0's steps take 0.30 s, rank 1's 0.25 s; rank 1 stalls at step 20 (an anomaly on rank 1 only).
            clock.now += 2.0 if (rank == 1 and step == 20) else (0.30, 0.25)[rank]
            if rank == 1 and step == 40:
                triggers._signalled = True  # SIGUSR1 on rank 1 only
            triggers.step_end(step)
    assert starts[0] == starts[1] and len(starts[0]) > 12
    assert [(w.first, w.last, w.causes) for w in ranks[0].plan.windows] == \
        [(w.first, w.last, w.causes) for w in ranks[1].plan.windows]
    assert [w.causes for w in ranks[0].plan.windows] == [("anomaly",), ("on_demand",)]
    assert ranks[0].interval == ranks[1].interval
