"""``benchmarks/bench_callback_overhead.py``: the direct-cost timer, the pairs' interval, the workload's flags, and
the one-process mode that runs on a GPU, run here on CPU."""

from __future__ import annotations

import importlib.util
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_distprof.timing.instrument import _TimedIterator

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_callback_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_callback_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_callback_overhead"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_callback_overhead", None)


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


def test_the_workload_sets_the_trainer_for_its_device_and_batch(bench, tmp_path):
    gpu = bench.Workload("cuda", 1, hidden_size=768, layers=22, seq_len=1024, batch_size=32, bf16=True)
    args = gpu.training_arguments(tmp_path)
    # max_steps past the waiting profiler's window (a run that ends before it starts no profiler); the step clock
    # ends each train() call after its steps.
    assert (args["use_cpu"], args["bf16"], args["per_device_train_batch_size"], args["max_steps"]) == (
        False, True, 32, bench.LONG_RUN_STEPS)
    assert gpu.describe() == "1 CUDA process, ModernBERT hidden 768 x 22 layers, batch 32 x 1024 tokens, bf16"
    cpu = bench.Workload()
    assert cpu.training_arguments(tmp_path)["use_cpu"] is True
    assert cpu.describe() == "2 CPU ranks (gloo), ModernBERT hidden 128 x 4 layers, batch 8 x 128 tokens"
    # A torchrun worker gets the same workload back from its flags.
    parser = bench.build_parser()
    flags = bench.worker_flags(3, 20, "timer", gpu)
    assert bench.parse_workload(parser, parser.parse_args([*flags, "--worker"])) == gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize(("flags", "error"), [
    (["--device", "cuda"], "--device cuda: no CUDA device here"),
    (["--device", "cuda", "--processes", "2"], "--processes 2 with --device cuda: the GPU mode runs one process"),
    (["--hidden-size", "100"], "--hidden-size must be a positive multiple of 8"),
])
def test_a_workload_that_cannot_run_here_fails_before_any_work_naming_the_flag(flags, error):
    proc = subprocess.run([sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and error in proc.stderr


def test_one_process_alternates_the_variants_and_prints_what_gpu_check_reads(tmp_path):
    # The GPU mode's path (the worker in this process, no torchrun) on CPU, with a model small enough for seconds.
    proc = subprocess.run([sys.executable, str(BENCH), "--processes", "1", "--hidden-size", "32", "--layers", "1",
                           "--seq-len", "16", "--batch-size", "2", "--pairs", "2", "--steps", "8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("2 A/B pairs of 8 steps, 1 CPU process, ModernBERT hidden 32 x 1 layers, batch 2 x 16 "
                          "tokens, B = all;")
    assert re.findall(r"^pair (\d) \((\w\w)\)", out, flags=re.MULTILINE) == [("1", "AB"), ("2", "BA")]
    assert "direct cost, rank 1" not in out
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH.parent / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check
    try:
        spec.loader.exec_module(gpu_check)
        import gpu_check_checks

        figures = gpu_check_checks.parse_overhead(out)
    finally:
        sys.modules.pop("gpu_check", None)
    assert figures["ab_low"] <= figures["ab_ratio"] <= figures["ab_high"]
    assert figures["step_ms_none"] > 0 and figures["step_ms_all"] > 0 and figures["direct_ms_per_step"] > 0


def test_the_floor_variant_stamps_each_hook_point_once_and_reads_the_run_queue_at_five(bench, monkeypatch):
    # --callbacks floor: one clock read at each of the step timer's hook points, one run-queue read at each of the five
    # where the step timer reads it on CPU, timed under the step timer's names; on a real model, loader and backward.
    reads = []
    monkeypatch.setattr(bench.os, "pread", lambda fd, n, offset: reads.append(fd) or b"1 2 3\n")
    direct = bench.DirectCost()
    monkeypatch.setattr(_TimedIterator, "__next__", bench._untimed_next(direct, _TimedIterator.__next__))
    floor = bench.floor_callback(direct)
    direct.instrument_callback(floor)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    loader = torch.utils.data.DataLoader(torch.randn(4, 4), batch_size=2)
    floor.on_train_begin(None, None, None, model=model, train_dataloader=loader)
    direct.enabled = True
    for batch in loader:  # two steps, as the Trainer runs them
        floor.on_step_begin(None, None, None)
        model(batch).sum().backward()
        floor.on_pre_optimizer_step(None, None, None)
        floor.on_optimizer_step(None, None, None)
        floor.on_step_end(None, None, None)
    floor.on_train_end(None, None, None)
    # Per step: next() (before and after), the forward's start, the first parameter's gradient, before the optimizer;
    # the loader's third next() (the one that ends the epoch) reads twice more.
    assert len(reads) == 2 * 5 + 2 and len(set(reads)) == 1
    names = {name for name, *_ in direct.calls}
    assert {"model hooks", "data loader hook", "FloorCallback.on_step_begin", "FloorCallback.on_step_end"} <= names
    assert sum(name == "model hooks" for name, *_ in direct.calls) == 2 * 3  # pre, post, one gradient per step
    model(torch.randn(1, 4)).sum().backward()  # after train end: no hook of ours left
    assert sum(name == "model hooks" for name, *_ in direct.calls) == 6 and len(reads) == 12


def test_the_floor_variant_is_accepted_alone(bench):
    parser = bench.build_parser()
    assert parser.parse_args(["--callbacks", "floor"]).callbacks == bench.FLOOR
    proc = subprocess.run([sys.executable, str(BENCH), "--callbacks", "floor,timer"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "or floor alone" in proc.stderr


def test_direct_costs_split_ordinary_logging_and_after_logging_steps(bench):
    """A run of 20 steps (1 s apart), logging every 10: the first 5 left out; each step's calls summed; ordinary steps'
    median and mean, the logging steps' median and costliest names, the step after a logging step apart; on_log is the
    logging step's; what runs once per train() call counts apart."""
    stamps = [float(s) + 0.9 for s in range(1, 21)]  # on_step_end of step s at s + 0.9
    calls = [("StepTimerCallback.on_train_begin", 0.0, 0.5)]
    for s in range(1, 21):
        calls.append(("model hooks", s + 0.1, 0.001))
        if s % 10 == 0:
            calls.append(("StepTimerCallback.on_step_end", s + 0.8, 0.004))
            calls.append(("StepTimerCallback.on_log", s + 0.95, 0.002))  # after the stamp: still the logging step's
        if s % 10 == 1:
            calls.append(("MemoryLoggerCallback.on_step_end", s + 0.8, 0.0005))
        if s == 17:
            calls.append(("MemoryLoggerCallback.on_step_end", s + 0.8, 0.009))  # one slow ordinary step
    costs = bench.direct_costs([{"stamps": stamps, "calls": calls}], logging_steps=10)
    # Steps 6-20: 13 ordinary (11 the step after a logging step), 2 logging (10, 20).
    assert (costs.ordinary_steps, costs.logging_steps) == (13, 2)
    assert costs.ordinary == pytest.approx(0.001)
    assert costs.ordinary_mean == pytest.approx((13 * 0.001 + 0.0005 + 0.009) / 13)
    assert costs.logging == pytest.approx(0.007)
    assert [name for name, _ in costs.top_logging[:3]] == ["StepTimerCallback.on_step_end", "StepTimerCallback.on_log",
                                                           "model hooks"]
    assert costs.after_logging == pytest.approx(0.0015)
    assert costs.top_after[0] == ("model hooks", pytest.approx(0.001))
    assert costs.mean == pytest.approx((15 * 0.001 + 2 * 0.006 + 0.0005 + 0.009) / 15)
    assert costs.once == pytest.approx(0.5)
