"""benchmarks/bench_overhead_attribution.py: each variant takes out exactly the instrument it names, and puts it back;
the report's ratios are per round against the same round's ``none``. (The benchmark itself is never timed here.)"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest
import torch

from hf_distprof.timing import cpu_wait, instrument
from hf_distprof.timing.clock import CpuClock
from hf_distprof.timing.recorder import StepRecorder

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_overhead_attribution.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_overhead_attribution", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_each_variant_takes_out_its_instrument_and_puts_it_back(bench):
    model = torch.nn.Linear(3, 2)
    with bench.without("grad"):
        hooks = instrument.ModelHooks(model, StepRecorder(CpuClock()))
        assert hooks._grad_handles == []
        model(torch.randn(1, 3)).sum().backward()
        hooks._after_backward(StepRecorder(CpuClock()))  # not put back after a backward either
        assert hooks._grad_handles == []
    assert len(instrument.ModelHooks(model, StepRecorder(CpuClock()))._grad_handles) == 2  # weight and bias
    raw = cpu_wait.RunQueueClock.raw
    with bench.without("runqueue"):
        assert cpu_wait.RunQueueClock().raw() is None and cpu_wait.RunQueueClock().read() is None
    assert cpu_wait.RunQueueClock.raw is raw
    enter = instrument.PhaseLabels.enter
    with bench.without("labels"):
        assert instrument.PhaseLabels().enter("forward") is None
    assert instrument.PhaseLabels.enter is enter
    assert set(bench.VARIANTS) == {"all", "all@1", "profiler", "memory", "memory@1", "timer", "timer-grad",
                                   "timer-runqueue", "timer-labels", "timer-loader", "memory@1-tensorboard",
                                   "memory@1-peak", "memory@1-state", "memory@1-jsonl"}
    assert bench.VARIANTS["all"][0] == {"enable_profiling": True, "enable_memory_logging": True,
                                        "enable_step_timing": True}  # memory at its default, every 10 steps


def test_ratios_are_taken_per_round_against_that_rounds_none(bench):
    def run(rnd, variant, step):
        return {"round": rnd, "variant": variant, "step_s": [step] * 3}

    per_rank = {0: [run(0, "none", 1.0), run(0, "all", 1.1), run(1, "none", 2.0), run(1, "all", 2.0)],
                1: [run(0, "none", 1.0), run(0, "all", 1.3), run(1, "none", 2.0), run(1, "all", 2.2)]}
    assert bench._ratios(per_rank, "all", "step_s") == pytest.approx([1.2, 1.05])


def test_the_mean_step_ratio_sees_a_cost_paid_on_one_step_in_ten(bench):
    # A 20 ms cost on one step of ten leaves the median where it was and moves the mean by 2 ms a step.
    def run(rnd, variant, steps):
        return {"round": rnd, "variant": variant, "step_s": steps}

    none = [0.1] * 10
    logged = [0.1] * 9 + [0.12]
    per_rank = {0: [run(0, "none", none), run(0, "all", logged)], 1: [run(0, "none", none), run(0, "all", logged)]}
    assert bench._ratios(per_rank, "all", "step_s") == pytest.approx([1.0])
    assert bench._ratios(per_rank, "all", "step_s", statistics.fmean) == pytest.approx([1.02])


def test_bad_flags_exit_2_naming_the_flag(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--steps", "4", "--warmup", "2"])
    assert exc.value.code == 2 and "--steps > --warmup + 2 (here 4)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main(["--variants", "none,all,fast"])
    assert exc.value.code == 2 and "--variants: unknown ['fast']" in capsys.readouterr().err


def test_each_memory_logger_part_is_taken_out_and_put_back(bench, tmp_path):
    from hf_distprof import ProfilingArguments, tensorboard
    from hf_distprof.callbacks.memory import logger as memory, stats as memstats

    from . import fake_trainer

    add_scalars, reset, state = tensorboard.add_scalars, memstats._reset_peak_rss, memory.model_state_memory
    with bench.without("tensorboard"):
        assert memory.tensorboard.add_scalars(None, {"a": 1.0}, 1, 0.0) is None
        assert memory.tensorboard.get_writer is tensorboard.get_writer  # the rest is the module's own
    with bench.without("peak"):
        assert memstats._reset_peak_rss() is None and memstats._reset_peak_rss is not reset
    with bench.without("state"):
        assert memory.model_state_memory(None, None) == dict.fromkeys(memory.MODEL_STATE_METRICS, 0.0)
    def lines(folder):
        args = ProfilingArguments(enable_memory_logging=True, memory_log_steps=1, profiler_output_dir=str(folder))
        fake_trainer.run([memory.MemoryLoggerCallback(args)], 2, folder)
        return [len(p.read_text().splitlines()) for p in folder.rglob("memory_rank*.jsonl")]

    with bench.without("jsonl"):
        assert lines(tmp_path / "without") in ([], [0])  # opened, closed at once: no sample written
    assert lines(tmp_path / "with") == [2]
    assert (memory.tensorboard, memstats._reset_peak_rss, memory.model_state_memory) == (tensorboard, reset, state)
    assert tensorboard.add_scalars is add_scalars
    assert memory.MemoryLoggerCallback.on_train_begin.__name__ == "on_train_begin"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 15])
def test_every_variant_follows_every_other_equally_often(bench, n):
    orders = bench.balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)  # each order holds every variant once
    follows = {}
    for order in orders:
        for before, after in zip(order, order[1:]):
            follows[(before, after)] = follows.get((before, after), 0) + 1
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1, follows
    assert bench.balanced_orders(2) == [[0, 1], [1, 0]]  # A B, B A
