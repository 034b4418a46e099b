"""MemoryViewsCallback and memory_tools: activation bytes, per-module tables, the YAML, the GPU paths with fakes."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
import torch
import yaml

from hf_distprof import MemoryViewsCallback, ProfilingArguments, build_callbacks, dist
from hf_distprof.callbacks.memory import tools as memory_tools

from . import fake_trainer

# The fake trainer's model: Linear(32, 64) -> ReLU -> Linear(64, 8), batch 16, float32.
PARAMS = {"0": 32 * 64 * 4 + 64 * 4, "1": 0, "2": 64 * 8 * 4 + 8 * 4}
ROOT_PARAMS = sum(PARAMS.values())  # 10528
# Saved for backward: the input x (16x32) for the first weight's gradient, the ReLU output (16x64), which
# the second Linear saves too (one storage); the weights are parameters and left out.
ACTIVATION_BYTES = 16 * 32 * 4 + 16 * 64 * 4


def _args(tmp_path, **kw):
    base = dict(profiler_output_dir=str(tmp_path / "out"), profiler_wait_steps=1, profiler_warmup_steps=1,
                profiler_active_steps=2)
    return ProfilingArguments(**{**base, **kw})


def test_the_views_are_built_only_when_asked():
    assert not [cb for cb in build_callbacks(ProfilingArguments()) if isinstance(cb, MemoryViewsCallback)]
    for flag in ("memory_snapshot", "memory_tracker", "track_activation_memory"):
        cb, _ = build_callbacks(ProfilingArguments(**{flag: True}))  # and the end-of-run block
        assert isinstance(cb, MemoryViewsCallback)


def test_activation_counter_counts_saved_storages_once_and_leaves_parameters_out():
    lin1, lin2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)
    counter = memory_tools.ActivationCounter()
    counter.enter()
    x = torch.randn(16, 32, requires_grad=True)  # needs its gradient: the weights are saved too (as views)
    hidden = torch.relu(lin1(x))
    lin2(hidden).sum()
    counter.exit()
    # x, relu's output (saved by relu and by lin2), lin1's pre-activation is not kept; weights excluded.
    assert counter.bytes == 16 * 32 * 4 + 16 * 64 * 4
    assert counter.tensors >= 4  # the weight views went through the hook and were left out
    counter.exit()  # leaving twice is harmless
    counter.enter()
    counter.exit()
    assert counter.bytes == 0 and counter.tensors == 0  # a fresh count per forward


def test_window_yaml_and_module_table_on_a_real_step(tmp_path):
    cb = MemoryViewsCallback(_args(tmp_path, track_activation_memory=True, memory_tracker=True))
    fake_trainer.run([cb], 6, tmp_path)
    run = cb.run_dir
    assert sorted(p.name for p in run.iterdir()) == [
        "rank0.log", "rank0_memory_modules.json", "rank0_memory_modules.txt", "rank0_memory_stats.yaml"
    ]
    stats = yaml.safe_load((run / "rank0_memory_stats.yaml").read_text())
    assert (stats["rank"], stats["device"]) == (0, "cpu")
    assert stats["views"] == {"track_activation_memory": True, "memory_tracker": True, "memory_snapshot": False}
    # wait 1, warmup 1, active 2: the window is steps 3-4.
    assert sorted(stats["steps"]) == [3, 4]
    for step in (3, 4):
        entry = stats["steps"][step]
        assert set(entry) == {"start", "forward", "end"}
        assert set(entry["start"]) == set(entry["end"]) == {"rss_mb", "vms_mb"}
        (forward,) = entry["forward"]  # one micro-batch
        assert forward["activation_bytes"] == ACTIVATION_BYTES
        assert forward["rss_after_mb"] > 0 and forward["vms_before_mb"] >= forward["rss_before_mb"]

    modules = json.loads((run / "rank0_memory_modules.json").read_text())
    assert (modules["step"], modules["tracker"]) == (5, "MemTracker")  # the first step after the window
    rows = {r["name"]: r for r in modules["modules"]}
    assert list(rows) == ["Sequential", "Sequential.0", "Sequential.1", "Sequential.2"]
    assert rows["Sequential"]["params"] == ROOT_PARAMS
    for name, size in PARAMS.items():
        row = rows[f"Sequential.{name}"]
        # SGD with momentum keeps one buffer per parameter; gradients are read before zero_grad.
        assert (row["params"], row["grads"], row["optimizer_state"], row["params_storage"]) == (size,) * 4
    # What each module's forward made that is alive when it returns (saved for backward and its output), as the
    # tracker saw it: the root keeps ReLU's output (saved) and its own output (not saved): more than it saved for
    # backward less the input it was given (activation_bytes counts x, made before the forward); Sequential.0's
    # output is alive when it returns (ReLU frees nothing of it until then), though nothing saves it.
    assert {name: row["activations"] for name, row in rows.items()} == {
        "Sequential": 16 * 64 * 4 + 16 * 8 * 4, "Sequential.0": 16 * 64 * 4, "Sequential.1": 16 * 64 * 4,
        "Sequential.2": 16 * 8 * 4}
    peak = modules["peak"]
    assert peak["Parameter"] == ROOT_PARAMS and peak["Optstate"] == ROOT_PARAMS and peak["Total"] > ROOT_PARAMS
    text = (run / "rank0_memory_modules.txt").read_text().splitlines()
    assert text[0] == "hf_distprof memory per module: rank 0, step 5 (MemTracker)"
    assert text[3].split()[:4] == ["Sequential", "10.28", "10.28", "10.28"]  # KiB for a model this small
    assert [line.split()[0] for line in text[4:7]] == ["0", "1", "2"]


def test_tracker_depth_limits_the_rows(tmp_path):
    cb = MemoryViewsCallback(_args(tmp_path, memory_tracker=True, memory_tracker_depth=1))
    fake_trainer.run([cb], 6, tmp_path)
    modules = json.loads((cb.run_dir / "rank0_memory_modules.json").read_text())
    assert [r["name"] for r in modules["modules"]] == ["Sequential"]


def test_a_tracker_step_that_never_comes_is_said(tmp_path, caplog):
    cb = MemoryViewsCallback(_args(tmp_path, memory_tracker=True))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 4, tmp_path)  # the window ends with training
    (warning,) = [r.getMessage() for r in caplog.records if "--memory-tracker" in r.getMessage()]
    assert "training ended at step 4, before it" in warning
    assert not (cb.run_dir / "rank0_memory_modules.txt").exists()


def test_a_tracker_that_fails_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    def broken(model, optimizer):
        raise RuntimeError("tracker exploded")

    monkeypatch.setattr(memory_tools, "make_tracker", broken)
    cb = MemoryViewsCallback(_args(tmp_path, memory_tracker=True, track_activation_memory=True))
    with caplog.at_level(logging.WARNING):
        state = fake_trainer.run([cb], 8, tmp_path)
    assert state.global_step == 8
    warnings = [r.getMessage() for r in caplog.records if "tracker exploded" in r.getMessage()]
    assert len(warnings) == 1 and "training and the other views go on" in warnings[0]
    assert sorted(yaml.safe_load((cb.run_dir / "rank0_memory_stats.yaml").read_text())["steps"]) == [3, 4]


def test_a_half_entered_tracker_takes_its_hooks_out_again():
    calls = []

    class HalfEntered:
        def __enter__(self):
            raise AttributeError("no step hooks on this optimizer")

        def _deregister_module_and_optimizer_hooks(self):
            calls.append("hooks")

        def _restore_resize(self):
            calls.append("resize")

    with pytest.raises(AttributeError):
        memory_tools.enter_tracker(HalfEntered())
    assert calls == ["hooks", "resize"]


def test_the_optimizer_under_accelerates_wrapper_is_tracked():
    from accelerate.optimizer import AcceleratedOptimizer

    model = torch.nn.Linear(4, 4)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    # Built without an Accelerator (its __init__ needs one); what matters is that it is an Optimizer
    # subclass without the Optimizer's own state, holding the real one.
    wrapped = AcceleratedOptimizer.__new__(AcceleratedOptimizer)
    wrapped.optimizer = inner
    assert isinstance(wrapped, torch.optim.Optimizer) and not hasattr(wrapped, "_optimizer_step_pre_hooks")
    assert memory_tools.inner_optimizer(wrapped) is inner
    assert memory_tools.inner_optimizer(inner) is inner and memory_tools.inner_optimizer(None) is None


def test_a_shard_that_views_a_larger_tensor_is_pointed_out():
    full = torch.zeros(1000)
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(full[:500])  # a "shard" that keeps the whole tensor alive
    own = memory_tools.own_state_bytes(module, None)
    assert (own["params"], own["params_storage"]) == (2000, 4000)
    rows = [{"name": "M", "depth": 1, **own, "activations": 0, "peak_forward": {}, "peak_backward": {}}]
    text = memory_tools.format_module_table(rows, {}, "t")
    assert "parameter storages hold 3.91 KiB for 1.95 KiB of parameters" in text


def test_a_step_peak_above_every_module_s_peak_is_pointed_out():
    # Trial T (FSDP2): "peak of the step: 157.63 MiB" under a root whose peak fw/bw were 125.65 and 98.16 MiB, and no
    # word of where the rest was.
    mib = 2**20
    rows = [{"name": "M", "depth": 1, "params": 0, "grads": 0, "optimizer_state": 0, "params_storage": 0,
             "activations": 0, "peak_forward": {"Total": 125 * mib}, "peak_backward": {"Total": 98 * mib}}]
    text = memory_tools.format_module_table(rows, {"Total": 157 * mib, "Temp": 64 * mib}, "t")
    assert ("note: the step's peak lies outside every module's forward and backward (at most 125.00 MiB there)"
            in text.replace("\n", " "))
    assert "outside every module" not in memory_tools.format_module_table(rows, {"Total": 130 * mib}, "t")


def test_tied_weights_are_pointed_out_where_the_rows_add_up_to_more_than_the_model():
    embed = torch.nn.Embedding(16, 8)
    head = torch.nn.Linear(8, 16, bias=False)
    head.weight = embed.weight  # tied, as GPT-2's lm_head and wte
    model = torch.nn.Sequential(embed, head)
    rows = [{"name": name, "depth": 1 if module is model else 2, **memory_tools.own_state_bytes(module, None),
             "activations": 0, "peak_forward": {}, "peak_backward": {}}
            for name, module in (("Sequential", model), ("Sequential.0", embed), ("Sequential.1", head))]
    assert [r["params"] for r in rows] == [512, 512, 512]
    text = memory_tools.format_module_table(rows, {}, "t")
    assert "note: the rows below the model add up to more parameters than it holds: they share some" in text
    rows[2]["params"] = 0
    assert "share some" not in memory_tools.format_module_table(rows, {}, "t")


def test_memory_snapshot_on_cpu_says_once_that_it_needs_a_gpu(tmp_path, caplog):
    cb = MemoryViewsCallback(_args(tmp_path, memory_snapshot=True, track_activation_memory=True))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 6, tmp_path)
    (warning,) = [r.getMessage() for r in caplog.records if "--memory-snapshot" in r.getMessage()]
    assert "needs a GPU" in warning and "the other memory views go on" in warning
    assert sorted(p.name for p in cb.run_dir.iterdir()) == ["rank0.log", "rank0_memory_stats.yaml"]
    assert yaml.safe_load((cb.run_dir / "rank0_memory_stats.yaml").read_text())["views"]["memory_snapshot"] is False


class FakeCuda:
    """Stands in for the CUDA allocator's history API and its out-of-memory observer."""

    def __init__(self, monkeypatch):
        self.history_calls: list[dict] = []
        self.observers: list = []
        self.dumps: list[str] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {
            "allocated_bytes.all.current": 300, "reserved_bytes.all.current": 1000, "num_ooms": 0,
        })
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                            lambda enabled="all", **kw: self.history_calls.append({"enabled": enabled, **kw}))
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", self._dump)
        monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", self.observers.append, raising=False)

    def _dump(self, filename):
        self.dumps.append(filename)
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)


def test_memory_snapshot_records_each_window_and_dumps_one_pickle_per_rank_and_window(tmp_path, monkeypatch):
    fake = FakeCuda(monkeypatch)
    cb = MemoryViewsCallback(_args(tmp_path, memory_snapshot=True, memory_snapshot_max_entries=1234,
                                   profiler_repeat=2))
    fake_trainer.run([cb], 10, tmp_path)
    host = dist.get_hostname()
    # Two windows (steps 3-4 and 7-8), each recorded then stopped.
    assert fake.history_calls == [
        {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 1234}, {"enabled": None},
    ] * 2
    first, second = f"rank0_{host}_step3-4_memory_snapshot.pickle", f"rank0_{host}_step7-8_memory_snapshot.pickle"
    expected = [first, second, "rank0.log", "rank0_memory_stats.yaml"]
    assert sorted(p.name for p in cb.run_dir.iterdir()) == sorted(expected)
    assert pickle.loads((cb.run_dir / first).read_bytes())["segments"] == []
    stats = yaml.safe_load((cb.run_dir / "rank0_memory_stats.yaml").read_text())
    assert stats["device"] == "cuda:0" and sorted(stats["steps"]) == [3, 4, 7, 8]
    cuda = stats["steps"][3]["start"]["cuda"]
    assert (cuda["num_ooms"], cuda["fragmentation_bytes"]) == (0, 700)
    assert len(fake.observers) == 1


def test_an_out_of_memory_error_dumps_a_snapshot_and_still_raises(tmp_path, monkeypatch, caplog):
    fake = FakeCuda(monkeypatch)
    cb = MemoryViewsCallback(_args(tmp_path, memory_snapshot=True))

    class OutOfMemoryAtStep5:
        """Allocates at step 5 as CUDA would: the observer is called, then the error is raised."""

        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == 5:
                for observer in fake.observers:
                    observer(0, 2 * 2**30, 10 * 2**30, 2**20)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 2.00 GiB"):
        fake_trainer.run([cb, OutOfMemoryAtStep5()], 8, tmp_path)
    host = dist.get_hostname()
    assert (cb.run_dir / f"rank0_{host}_oom_step5_memory_snapshot.pickle").exists()
    # Step 5 is past the window (3-4), whose end stopped the history: the warning says the dump holds none.
    said = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert said == ["[RANK 0] CUDA out of memory at step 5 (asked 2048 MiB, 1 MiB free): dumping a memory snapshot, "
                    "the memory in use, without allocation history (recorded only inside --memory-snapshot windows)"], \
        said
    # The window 3-4 came before, dumped as usual; after close() the observer does nothing.
    assert (cb.run_dir / f"rank0_{host}_step3-4_memory_snapshot.pickle").exists()
    cb.close(5)
    fake.observers[0](0, 1, 1, 1)
    assert len(fake.dumps) == 2


def test_a_snapshot_that_cannot_be_written_is_one_warning(tmp_path, monkeypatch, caplog):
    FakeCuda(monkeypatch)

    def full_disk(filename):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", full_disk)
    cb = MemoryViewsCallback(_args(tmp_path, memory_snapshot=True))
    with caplog.at_level(logging.WARNING):
        state = fake_trainer.run([cb], 6, tmp_path)
    assert state.global_step == 6
    (warning,) = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert "could not write the memory snapshot" in warning and "training goes on" in warning
    assert not list(cb.run_dir.glob("*.pickle*"))  # no partial file left behind


@pytest.mark.gpu
def test_a_real_allocator_history_loads_as_a_snapshot(tmp_path):
    history = memory_tools.AllocatorHistory(max_entries=1000)
    history.start()
    x = torch.empty(64 * 2**20, device="cuda")
    del x
    seconds = history.dump(tmp_path / "s.pickle")
    history.stop()
    snapshot = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert seconds >= 0 and "segments" in snapshot and snapshot["device_traces"][0]
    actions = {event["action"] for event in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested"} <= actions


@pytest.mark.gpu
def test_a_real_out_of_memory_error_dumps_a_snapshot_and_still_raises(tmp_path):
    cb = MemoryViewsCallback(_args(tmp_path, memory_snapshot=True))

    class Allocate:
        def __getattr__(self, name):
            return lambda *a, **k: None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == 5:
                torch.empty(2**50, dtype=torch.uint8, device="cuda")  # 1 PiB: no GPU has it

    with pytest.raises(torch.OutOfMemoryError):
        fake_trainer.run([cb, Allocate()], 8, tmp_path, device="cuda")
    host = dist.get_hostname()
    snapshot = pickle.loads((cb.run_dir / f"rank0_{host}_oom_step5_memory_snapshot.pickle").read_bytes())
    assert "segments" in snapshot
    assert (cb.run_dir / f"rank0_{host}_step3-4_memory_snapshot.pickle").exists()
    cb.close(5)


def test_the_tracker_s_step_is_marked_for_the_step_timer_and_left_out_of_its_verdicts(tmp_path):
    # Trial T: --memory-tracker's step took 44 ms against ~10 ms and was an ordinary step in timing_rank0.jsonl
    # (traced false, profiler_busy false): in the step timer's means and verdicts, and in compare's samples.
    from hf_distprof.callbacks.step_timer import StepTimerCallback

    args = _args(tmp_path, memory_tracker=True, enable_step_timing=True, profiler_wait_steps=1,
                 profiler_warmup_steps=0, profiler_active_steps=1, track_activation_memory=True)
    callbacks = [cb for cb in build_callbacks(args) if isinstance(cb, (MemoryViewsCallback, StepTimerCallback))]
    views, timer = callbacks
    assert timer.memory_busy == views.tracking
    fake_trainer.run(callbacks, 5, tmp_path)
    modules = json.loads((views.run_dir / "rank0_memory_modules.json").read_text())
    rows = [json.loads(line) for line in (timer.run_dir / "timing_rank0.jsonl").read_text().splitlines()]
    assert modules["step"] == 3  # the first step after the window (step 2)
    assert [r["step"] for r in rows if r["profiler_busy"]] == [3]
    assert not views.tracking()
