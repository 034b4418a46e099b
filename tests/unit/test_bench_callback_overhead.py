"""``benchmarks/bench_callback_overhead.py``'s measuring parts: the direct-cost timer and the pairs' interval."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

from hf_distprof.timing.instrument import _TimedIterator

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_callback_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_callback_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeTime:
    """The bench's ``time`` module with a clock that only moves when :func:`busy` says so."""

    now = 0.0

    def perf_counter(self):
        return self.now


CLOCK = FakeTime()


def busy(seconds):
    CLOCK.now += seconds


@pytest.fixture(autouse=True)
def fake_clock(bench, monkeypatch):
    monkeypatch.setattr(bench, "time", CLOCK)


def test_a_timed_call_inside_another_counts_once_and_nothing_counts_while_disabled(bench):
    direct = bench.DirectCost()
    inner = direct.wrap(lambda: busy(0.02), "inner")
    outer = direct.wrap(lambda: (busy(0.01), inner()), "outer")
    outer()
    assert direct.seconds == {}  # not enabled yet
    direct.enabled = True
    outer()
    inner()
    assert set(direct.seconds) == {"outer", "inner"}
    assert direct.seconds["outer"] == pytest.approx(0.03)  # its own 10 ms and the inner 20 ms, once
    assert direct.seconds["inner"] == pytest.approx(0.02)  # only the direct call
    direct.reset()
    assert direct.seconds == {}


def test_callback_hooks_and_public_methods_are_timed_by_name(bench):
    class Recorder:
        def step_begin(self):
            busy(0.005)

        def _helper(self):
            return 1

        @property
        def in_step(self):
            return True

    class Callback:
        def on_step_end(self, *args, **kwargs):
            busy(0.005)

        def helper(self):
            return 2

    direct = bench.DirectCost()
    direct.instrument_class(Recorder, "Recorder")
    cb = Callback()
    direct.instrument_callback(cb)
    direct.enabled = True
    Recorder().step_begin()
    cb.on_step_end(None, None, None)
    assert Recorder().in_step is True and Recorder()._helper() == 1 and cb.helper() == 2
    assert sorted(direct.seconds) == ["Callback.on_step_end", "Recorder.step_begin"]


def test_the_data_loader_hook_leaves_the_loaders_own_next_out(bench, monkeypatch):
    direct = bench.DirectCost()
    monkeypatch.setattr(_TimedIterator, "__next__", bench._untimed_next(direct, _TimedIterator.__next__))

    def slow_loader():
        while True:
            busy(0.03)  # the loader's time: not ours
            yield 1

    waits = []
    it = _TimedIterator(slow_loader(), waits.append, lambda: busy(0.005))  # on_fetch: ours
    direct.enabled = True
    assert [next(it) for _ in range(3)] == [1, 1, 1]
    assert len(waits) == 3  # the loader still reports its wait (on the real clock)
    assert set(direct.seconds) == {"data loader hook"}
    assert direct.seconds["data loader hook"] == pytest.approx(0.015)  # 3 x 5 ms of on_fetch, not 3 x 35 ms


def test_the_interval_holds_the_median_and_narrows_with_more_pairs(bench):
    few = [0.95, 1.02, 0.99, 1.06, 1.0, 0.97, 1.03, 1.01]
    low, high = bench.bootstrap_interval(few)
    assert low <= statistics.median(few) <= high
    assert bench.bootstrap_interval(few) == (low, high)  # seeded: the same pairs give the same interval
    low4, high4 = bench.bootstrap_interval(few * 4)
    assert high4 - low4 < high - low
    assert bench.bootstrap_interval([1.0] * 5) == (1.0, 1.0)


def test_variant_b_can_add_the_capture_watch(bench):
    assert bench.variant_b_flags("profiler,capture") == {
        "enable_profiling": True, "enable_memory_logging": False, "enable_step_timing": False,
        "profile_on_demand": True, "profile_on_anomaly": True}
