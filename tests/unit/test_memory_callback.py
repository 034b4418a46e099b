"""MemoryLoggerCallback: values, cadence, JSON lines and TensorBoard scalars; the GPU path with fakes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import TrainerCallback

from hf_distprof import MemoryLoggerCallback, ProfilingArguments, tensorboard
from hf_distprof.callbacks.memory import stats as memstats
from hf_distprof.callbacks.memory import logger as memory

from ..conftest import REPO_ROOT
from . import fake_trainer

MB = 1024 * 1024


def test_cpu_sample_is_the_process_rss():
    before = psutil.Process().memory_info().rss / MB
    sample = memory.read_memory()
    after = psutil.Process().memory_info().rss / MB
    assert set(sample) == {"rss_mb", "vms_mb", "peak_rss_mb"}
    assert min(before, after) - 1 <= sample["rss_mb"] <= max(before, after) + 1
    assert sample["vms_mb"] >= sample["rss_mb"] and sample["peak_rss_mb"] >= sample["rss_mb"]


def test_a_peak_that_trails_the_resident_size_is_the_resident_size(monkeypatch):
    # getrusage's peak and /proc/self/statm's resident size are summed from per-CPU counters at different moments: a
    # demo run's sample read rss 502.6 MiB with a peak of 502.32.
    monkeypatch.setattr(memstats, "host_memory", lambda: {"rss_mb": 502.6, "vms_mb": 900.0})
    monkeypatch.setattr(memstats, "current_peak_bytes", lambda device, *a: int(502.32 * MB))
    monkeypatch.setattr(memstats, "window_peak_bytes", lambda device, *a: int(502.32 * MB))
    for reset in (False, True):
        assert memory.read_memory(reset_peaks=reset)["peak_rss_mb"] == 502.6
    monkeypatch.setattr(memstats, "window_peak_bytes", lambda device, *a: 600 * MB)
    assert memory.read_memory(reset_peaks=True)["peak_rss_mb"] == 600.0


def test_the_run_s_peak_is_never_below_a_peak_a_sample_reported(monkeypatch):
    # A trial's memory_summary.json said peak_rss_mb 551.14 after memory_rank0.jsonl had logged 551.48 (a sample's
    # peak lifted to the resident size read beside it; the run's peak took the kernel's counter only).
    monkeypatch.setattr(memstats, "_PEAK_BEFORE_RESET", {})
    monkeypatch.setattr(memstats, "host_memory", lambda: {"rss_mb": 551.4765625, "vms_mb": 900.0})
    monkeypatch.setattr(memstats, "current_peak_bytes", lambda device, *a, **k: int(551.14 * MB))
    monkeypatch.setattr(memstats, "_reset_peak_rss", lambda: None)
    assert memory.read_memory(reset_peaks=True)["peak_rss_mb"] == 551.4765625
    assert memstats.lifetime_peak_bytes(torch.device("cpu")) / MB == 551.4765625


def test_host_memory_reads_what_psutil_reads_and_falls_back_to_it_without_statm(monkeypatch):
    info = psutil.Process().memory_info()
    fast = memstats.host_memory()
    assert fast["vms_mb"] == pytest.approx(info.vms / MB, abs=4)  # the same statm fields, a moment apart
    assert fast["rss_mb"] == pytest.approx(info.rss / MB, abs=4)
    assert memstats.host_rss_bytes() == pytest.approx(info.rss, abs=4 * MB)
    assert memstats._STATM is not None and memstats._STATM[0] == os.getpid() and memstats._STATM[1] >= 0

    def no_proc(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(memstats, "_STATM", None)
    monkeypatch.setattr(memstats.os, "open", no_proc)
    slow = memstats.host_memory()
    assert memstats._STATM == (os.getpid(), -1)  # tried once, psutil from then on
    assert slow["vms_mb"] == pytest.approx(info.vms / MB, abs=4)
    assert memstats.host_rss_bytes() == pytest.approx(info.rss, abs=4 * MB)


def test_a_forked_child_reads_its_own_statm_and_resets_its_own_peak_not_its_parents():
    memstats.host_memory()  # the parent's descriptors are open
    memstats.window_peak_bytes(torch.device("cpu"))
    parent = memstats._STATM
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grows by 200 MiB, which only its own statm shows
        try:
            before = memstats.host_memory()["rss_mb"]
            x = b"\x01" * (200 * MB)  # bytes, not a tensor: no OpenMP in a forked child
            grown = memstats.host_memory()["rss_mb"] - before
            ok = memstats._STATM is not None and memstats._STATM[0] == os.getpid() and memstats._STATM != parent
            memstats.window_peak_bytes(torch.device("cpu"))  # resets its own peak, not its parent's
            ok = ok and (memstats._CLEAR_REFS_FD is None or memstats._CLEAR_REFS_FD[0] == os.getpid())
            os.write(write, json.dumps({"grown": grown, "own": ok, "size": len(x)}).encode())
        finally:
            os._exit(0)
    os.close(write)
    got = json.loads(os.read(read, 4096))
    os.waitpid(pid, 0)
    assert got["own"] and 190 <= got["grown"] <= 260, got  # read from its own statm: the parent did not grow


def test_a_logged_peak_belongs_to_its_window_and_the_run_peak_survives_resets():
    memory.read_memory(reset_peaks=True)
    if not memstats.peak_resets(torch.device("cpu")):
        pytest.skip("/proc/self/clear_refs cannot be written here: peaks are per process lifetime")
    rss = memory.read_memory()["rss_mb"]
    x = torch.ones(300 * MB // 4)  # touched: 300 MiB resident
    del x
    first = memory.read_memory(reset_peaks=True)  # the window that held x
    second = memory.read_memory(reset_peaks=True)  # a window without it
    assert first["peak_rss_mb"] >= rss + 280
    assert second["peak_rss_mb"] < first["peak_rss_mb"] - 250
    # The step timer's peak is the run's, resets or not.
    assert memstats.lifetime_peak_bytes(torch.device("cpu")) / MB >= first["peak_rss_mb"] - 1


def test_gpu_sample_reads_allocator_counters_without_synchronising(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    calls = []

    def memory_stats(device):
        calls.append(torch.device(device).index)
        return {"allocated_bytes.all.current": 512 * MB, "reserved_bytes.all.current": 1024 * MB,
                "allocated_bytes.all.peak": 768 * MB, "active_bytes.all.current": 500 * MB}

    def one_read_only(device=None):
        raise AssertionError("read_memory reads memory_stats() once, not a counter that reads it again")

    monkeypatch.setattr(torch.cuda, "memory_stats", memory_stats)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, one_read_only)
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: resets.append(device.index))

    def no_sync(*a, **k):
        raise AssertionError("read_memory must not synchronise the device")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    sample = memory.read_memory()
    assert sample["allocated_mb"] == 512.0
    assert sample["reserved_mb"] == 1024.0
    assert sample["fragmentation_mb"] == 512.0
    assert sample["peak_allocated_mb"] == 768.0
    assert calls == [3] and resets == []  # one read of the allocator's counters per sample
    assert sample["rss_mb"] > 0
    memory.read_memory(reset_peaks=True)
    assert resets == [3]  # the CUDA peak restarts at each logging step
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 100 * MB)  # the peak since the reset
    assert memstats.lifetime_peak_bytes(torch.device("cuda", 3)) == 768 * MB


def test_the_allocator_s_nested_counters_are_read_where_torch_has_them(monkeypatch):
    """A real GPU's path: ``torch._C._cuda_memoryStats`` (the nested dict ``memory_stats()`` flattens) once CUDA is
    initialised; the CPU build has neither, so a test has to give both. A nested dict without a key falls back to
    ``memory_stats()``; a read at a step is shared by the callers of that step."""
    memstats.forget_counters()
    reads = []

    def nested(index):
        reads.append(index)
        return {"allocated_bytes": {"all": {"current": 5 * MB, "peak": 9 * MB}},
                "reserved_bytes": {"all": {"current": 16 * MB, "peak": 16 * MB}}}

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", nested, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: pytest.fail("the nested read is enough"))
    device = torch.device("cuda", 2)
    assert memstats.cuda_counters(device, step=7) == (5 * MB, 16 * MB, 9 * MB)
    assert memstats.cuda_counters(device, step=7) == (5 * MB, 16 * MB, 9 * MB) and reads == [2]  # shared
    assert memstats.cuda_counters(device, step=8) == (5 * MB, 16 * MB, 9 * MB) and reads == [2, 2]
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda index: {"allocated_bytes": {}}, raising=False)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {
        "allocated_bytes.all.current": 1, "reserved_bytes.all.current": 2, "allocated_bytes.all.peak": 3})
    assert memstats.cuda_counters(device) == (1, 2, 3)
    memstats.forget_counters()


@pytest.mark.gpu
def test_gpu_sample_on_a_real_device():
    x = torch.empty(256 * MB // 4, device="cuda")
    sample = memory.read_memory()
    assert sample["allocated_mb"] >= 256
    assert sample["reserved_mb"] >= sample["allocated_mb"]
    assert sample["peak_allocated_mb"] >= 256
    del x


def test_logs_every_n_steps_to_jsonl_and_tensorboard(tmp_path, monkeypatch):
    tb_dir = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tb_dir))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=4,
                                                 profiler_output_dir=str(tmp_path / "out")))
    fake_trainer.run([cb], 10, tmp_path)
    tensorboard.close_writers()
    assert cb.run_dir is not None
    assert sorted(p.name for p in cb.run_dir.iterdir()) == [
        "memory_rank0.jsonl", "memory_summary.json", "parallelism.json", "rank0.log"
    ]
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 8]
    assert all(r["rank"] == 0 and r["rss_mb"] > 10 for r in rows)
    # The fake model: 32x64 + 64 + 64x8 + 8 = 2632 float32 parameters; SGD momentum keeps one buffer each.
    model_bytes = 2632 * 4 / MB
    for r in rows:
        assert (r["params_mb"], r["grads_mb"], r["optimizer_state_mb"]) == (model_bytes, model_bytes, model_bytes)
        assert r["model_state_mb"] == pytest.approx(3 * model_bytes)

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    metrics = ("grads_mb", "model_state_mb", "optimizer_state_mb", "params_mb", "peak_rss_mb", "rss_mb", "vms_mb")
    assert sorted(tags) == sorted(f"memory/{m}/{who}" for m in metrics for who in ("max", "rank0"))
    events = acc.Scalars("memory/rss_mb/rank0")
    assert [e.step for e in events] == [4, 8]
    assert [round(e.value, 3) for e in events] == [round(r["rss_mb"], 3) for r in rows]
    assert [e.value for e in acc.Scalars("memory/params_mb/rank0")] == pytest.approx([model_bytes] * 2)


def test_a_train_that_raised_leaves_its_samples_to_its_file_before_the_next_train(tmp_path, monkeypatch):
    # A notebook: train() raises after step 6 (no logging step yet: nothing gathered), then train() again.
    from hf_distprof.core import signals

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out"), profiler_run_name="run"))
    import atexit

    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", lambda fn: registered.remove(fn) if fn in registered else None)
    fake_trainer.run([cb], 10, tmp_path, stop_after=6, end=False)
    assert cb._write_lines in signals._BEFORE_DEATH  # (a signal's default death: no atexit handler runs)
    fake_trainer.run([cb], 4, tmp_path, stop_after=2, end=False)
    assert registered.count(cb._write_lines) == 1  # once: at exit its lines are written once
    fake_trainer.run([cb], 4, tmp_path)

    def steps(folder):
        return [json.loads(line)["step"] for line in (tmp_path / "out" / folder / "memory_rank0.jsonl").open()]

    assert steps("run") == [2, 4, 6]
    assert steps("run-1") == [2]
    assert steps("run-2") == [2, 4]
    assert cb._write_lines not in signals._BEFORE_DEATH


def test_model_state_counts_the_local_shard_of_dtensors():
    class Sharded(torch.Tensor):
        """Stands for a DTensor: what this rank holds is a quarter of it."""

        def to_local(self):
            return self[: self.numel() // 4]

    weight = torch.nn.Parameter(torch.zeros(400))
    model = torch.nn.Module()
    model.weight = weight
    weight.grad = torch.zeros(400).as_subclass(Sharded)
    opt = torch.optim.AdamW([weight])
    opt.state[weight] = {"exp_avg": torch.zeros(400).as_subclass(Sharded), "step": torch.tensor(3.0)}
    got = memory.model_state_memory(model, opt)
    assert got == {"params_mb": 1600 / MB, "grads_mb": 400 / MB, "optimizer_state_mb": 404 / MB,
                   "model_state_mb": pytest.approx(2404 / MB)}


class FullDisk:
    """A file object whose writes fail as on a full disk."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def close(self):
        pass


def test_a_full_disk_is_one_warning_and_tensorboard_goes_on(tmp_path, monkeypatch, caplog):
    import logging

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    args = fake_trainer.training_args(tmp_path)
    state = fake_trainer.TrainerState()
    state.max_steps = 6
    cb.on_train_begin(args, state, fake_trainer.TrainerControl())
    assert cb._jsonl is not None and cb._jsonl.file is not None
    cb._jsonl.file.close()
    cb._jsonl.file = FullDisk()
    with caplog.at_level(logging.WARNING):
        for step in range(1, 7):
            state.global_step = step
            cb.on_step_end(args, state, fake_trainer.TrainerControl())
        cb.on_train_end(args, state, fake_trainer.TrainerControl())
    tensorboard.close_writers()
    warnings = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(warnings) == 1 and "memory goes to TensorBoard only" in warnings[0]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("memory/rss_mb/rank0")] == [2, 4, 6]


def test_an_output_folder_that_cannot_exist_disables_files_not_training(tmp_path, monkeypatch, caplog):
    import logging

    from hf_distprof import ProfilerCallback

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(blocker / "tb"))  # TensorBoard cannot write either
    prof_args = ProfilingArguments(enable_profiling=True, enable_memory_logging=True, memory_log_steps=2,
                                   enable_step_timing=False, profiler_output_dir=str(blocker / "traces"),
                                   profiler_wait_steps=0, profiler_warmup_steps=0, profiler_active_steps=1)
    profiler, memory_cb = ProfilerCallback(prof_args), MemoryLoggerCallback(prof_args)
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([profiler, memory_cb], 4, tmp_path)  # must not raise
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot create a run folder in --profiler-output-dir" in m for m in messages) == 1
    assert sum("cannot write TensorBoard events" in m for m in messages) == 1
    assert profiler.run_dir is None and profiler.prof is None and profiler.written == []
    assert memory_cb.run_dir is None and memory_cb.jsonl_path is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written anywhere


def test_a_model_state_that_cannot_be_sized_is_nan_and_the_metrics_stay_the_same(tmp_path, monkeypatch, caplog):
    import logging
    import math

    def broken(model, optimizer, params):
        raise RuntimeError("odd optimizer")

    monkeypatch.setattr(memory, "model_state_memory", broken)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 4, tmp_path)
    tensorboard.close_writers()
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    # Every rank gathers the same metrics, sized or not, so the all-gather's lengths agree.
    expected = sorted(["step", "rank", "rss_mb", "vms_mb", "peak_rss_mb", *memory.MODEL_STATE_METRICS])
    assert [sorted(r) for r in rows] == [expected] * 2
    assert all(math.isnan(r[m]) for r in rows for m in memory.MODEL_STATE_METRICS)
    assert sum("could not size the model state" in r.getMessage() for r in caplog.records) == 1  # said once


def test_a_memory_read_that_raises_is_nan_once_warned_and_the_run_and_its_table_go_on(tmp_path, monkeypatch, caplog):
    import logging
    import math

    calls = {"n": 0}
    real = memory.read_memory

    def flaky(reset_peaks=False, step=None):
        calls["n"] += 1
        if step is None and not reset_peaks:  # the end-of-run table
            raise RuntimeError("allocator gone")
        if step is None:  # the peaks' reset at train begin
            return real(reset_peaks=reset_peaks)
        if calls["n"] in (3, 4):  # the second and third samples
            raise RuntimeError("allocator gone")
        return real(reset_peaks=reset_peaks, step=step)

    monkeypatch.setattr(memory, "read_memory", flaky)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 8, tmp_path)  # must not raise
    tensorboard.close_writers()
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    # The same metrics in every sample (the all-gather's lengths agree), nan where the read failed.
    assert len({tuple(sorted(r)) for r in rows}) == 1
    assert [math.isnan(r["rss_mb"]) for r in rows] == [False, True, True, False]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not read memory (" in m for m in messages) == 1  # said once while it fails
    assert sum("could not read memory at the end of training" in m for m in messages) == 1
    assert math.isnan(cb.summary["per_rank"][0]["rss_mb"])


def test_a_publish_that_raises_on_rank_0_is_one_warning_and_the_lines_are_still_written(tmp_path, monkeypatch, caplog):
    import logging

    def broken(*args, **kwargs):
        raise ValueError("odd writer")

    monkeypatch.setattr(memory.tensorboard, "add_scalar_events", broken)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run([cb], 6, tmp_path)  # must not raise
    tensorboard.close_writers()
    assert len((cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()) == 3
    assert sum("could not publish the memory samples" in r.getMessage() for r in caplog.records) == 1


class Leak:
    """A callback that keeps ``mb`` MiB more alive at every step (touched, so resident)."""

    def __init__(self, mb):
        self.mb, self.kept = mb, []

    def __getattr__(self, name):
        return lambda *a, **k: None

    def on_step_end(self, *a, **k):
        if self.mb:
            self.kept.append(torch.ones(self.mb * MB // 4))


def _run_with_leak(tmp_path, monkeypatch, mb, steps=10):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=1,
                                                 profiler_output_dir=str(tmp_path / "out")))
    leak = Leak(mb)
    fake_trainer.run([leak, cb], steps, tmp_path)
    tensorboard.close_writers()
    return cb, leak


def test_a_rank_that_keeps_memory_alive_every_step_is_named_with_its_rate(tmp_path, monkeypatch, capsys, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        cb, _ = _run_with_leak(tmp_path, monkeypatch, mb=40)
    (warning,) = [r.getMessage() for r in caplog.records if "grows" in r.getMessage()]
    # Samples at steps 1..9 reach rank 0 at train end (nothing logs here); four after the warm-up are enough.
    assert warning.startswith("[RANK 0] step ") and "rank 0: process RSS grows " in warning
    growth = cb.summary["memory_growth"]
    assert len(growth) == 1 and growth[0]["rank"] == 0 and growth[0]["first_step"] == 2
    assert 36 <= growth[0]["rate_mb_per_step"] <= 44  # 40 MiB a step
    saved = json.loads((cb.run_dir / "memory_summary.json").read_text())
    assert saved["memory_growth"] == growth and "process RSS grows" in capsys.readouterr().out


def test_a_clean_run_raises_no_growth_and_tabulates_the_end(tmp_path, monkeypatch, capsys, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        cb, _ = _run_with_leak(tmp_path, monkeypatch, mb=0, steps=12)
    assert not [r for r in caplog.records if "grows" in r.getMessage()]
    summary = json.loads((cb.run_dir / "memory_summary.json").read_text())
    assert summary == cb.summary
    assert (summary["world_size"], summary["last_step"], summary["peak_basis"]) == (1, 12, "peak_rss_mb")
    assert summary["memory_growth"] == [] and summary["peak_over_threshold"] is False
    (row,) = summary["per_rank"]
    assert set(row) == {"rank", "host", "rss_mb", "vms_mb", "peak_rss_mb"}
    # The run's peak, not the last window's: at least what the process holds now.
    assert row["peak_rss_mb"] >= row["rss_mb"] - 1
    out = capsys.readouterr().out
    assert f"hf_distprof memory at the end of training ({cb.run_dir})" in out
    assert "peak imbalance (peak_rss_mb): 0.0% (threshold 20%)" in out


def test_memory_summary_names_the_rank_that_peaks_highest():
    peaks = [100, 150, 104, 96]
    rows = [{"rank": r, "host": "h", "rss_mb": 100.0, "peak_rss_mb": peak} for r, peak in enumerate(peaks)]
    summary = memory.memory_summary(rows, ProfilingArguments(), 50, [])
    assert summary["highest_peak_rank"] == 1 and summary["peak_imbalance_pct"] == pytest.approx(50.0)
    assert summary["peak_over_threshold"] is True
    assert summary["peak_warning"].startswith(
        "Peak memory imbalance 50.0% > 20% (peak_rss_mb): rank 1 peaks at 150 MiB vs 96 MiB on rank 3")
    table = memory.format_memory_table(summary, "t").splitlines()
    assert table[1].split() == ["rank", "host", "RSS", "peak", "RSS"]
    assert table[3].split() == ["1", "h", "100", "MiB", "150", "MiB", "<-", "highest", "peak"]
    even = [{**r, "peak_rss_mb": 100.0 + r["rank"]} for r in rows]
    balanced = memory.memory_summary(even, ProfilingArguments(), 50, [])
    assert balanced["peak_over_threshold"] is False and balanced["peak_warning"] is None


def test_the_parameters_are_listed_once_per_train_call_not_per_sample(tmp_path, monkeypatch):
    """Listing a deep model's parameters costs more than sizing them: it happens at the first sample only."""
    import inspect

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    listed_by_sampling = []
    first = []

    def same_model_counting(model):
        """Every train() call trains the first call's model, whose listings by on_optimizer_step are counted."""
        if first:
            return first[0]
        plain = model.parameters

        def parameters(*a, **k):
            if any(f.function == "on_optimizer_step" for f in inspect.stack()[1:4]):
                listed_by_sampling.append(1)
            return plain(*a, **k)

        model.parameters = parameters
        first.append(model)
        return model

    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    for max_steps in (6, 6, 2):
        listed_by_sampling.clear()
        fake_trainer.run([cb], max_steps, tmp_path, wrap=same_model_counting)
        rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows][-(max_steps // 2):] == list(range(2, max_steps + 1, 2))
        # Once per call: the same model in the next call is listed again (the call may have changed it).
        assert len(listed_by_sampling) == 1
        # The reused list sizes the same model state at every sample: 2632 float32 parameters, as above.
        assert {(r["params_mb"], r["grads_mb"], r["optimizer_state_mb"]) for r in rows} == {(2632 * 4 / MB,) * 3}
        assert cb._params is None  # released at train end
    tensorboard.close_writers()


class LogAt(TrainerCallback):
    """Stands for the Trainer's DefaultFlowCallback: sets ``should_log`` at the given steps, before ours run."""

    def __init__(self, steps):
        self.steps = set(steps)

        self.step_ends = {}  # global step -> time.time() just before the memory logger's step end

    def on_step_end(self, args, state, control, **kwargs):
        control.should_log = state.global_step in self.steps
        self.step_ends[state.global_step] = time.time()


def recording_gathers(monkeypatch):
    """The number of floats of every gather the memory logger starts."""
    started = []
    real = memory.dist.all_gather_floats_async

    def gather(values):
        started.append(len(values))
        return real(values)

    monkeypatch.setattr(memory.dist, "all_gather_floats_async", gather)
    return started


def tensorboard_steps(tb_dir, tag):
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return acc, [e.step for e in acc.Scalars(tag)]


def test_samples_are_gathered_on_logging_steps_only_in_one_collective(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    started = recording_gathers(monkeypatch)
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=2,
                                                 profiler_output_dir=str(tmp_path / "out")))
    gathered_at = []
    real_gather = cb._gather

    def gather():
        gathered_at.append([step for step, *_ in cb._ungathered])
        real_gather()

    cb._gather = gather
    published = []  # (sample step, global step when written)
    real_add = memory.tensorboard.add_scalar_events

    def add_scalar_events(writer, events):
        published.extend((step, max(log_at.step_ends)) for _, step, _ in events)
        real_add(writer, events)

    monkeypatch.setattr(memory.tensorboard, "add_scalar_events", add_scalar_events)
    log_at = LogAt({5, 10})
    fake_trainer.run([log_at, cb], 11, tmp_path)
    tensorboard.close_writers()
    # Samples at 2, 4 | 6, 8, 10 | 11 is no sample step: nothing is left for train end.
    assert gathered_at == [[2, 4], [6, 8, 10]]
    # Published at the first step end that finds the gather finished (at once, with one process), not at
    # the next gather.
    assert published == [(2, 6), (4, 6), (6, 11), (8, 11), (10, 11)]
    assert started == [2 * 7, 3 * 7]  # 7 metrics per sample (4 model-state ones + rss, vms, peak rss)
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    acc, steps = tensorboard_steps(tmp_path / "tb", "memory/rss_mb/rank0")
    assert steps == [r["step"] for r in rows] == [2, 4, 6, 8, 10]
    # Each sample lands at its own step with its own value (float32 in TensorBoard).
    assert [e.value for e in acc.Scalars("memory/rss_mb/rank0")] == pytest.approx(
        [r["rss_mb"] for r in rows], rel=1e-6
    )
    assert [e.value for e in acc.Scalars("memory/vms_mb/max")] == pytest.approx([r["vms_mb"] for r in rows], rel=1e-6)
    # ... and at its own wall time: after the step's end began, before the next step's.
    for event in acc.Scalars("memory/rss_mb/rank0"):
        assert log_at.step_ends[event.step] <= event.wall_time < log_at.step_ends[event.step + 1]


def test_samples_left_at_train_end_and_runs_that_never_log_are_still_gathered(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    monkeypatch.setattr(memory, "MAX_UNGATHERED", 3)
    started = recording_gathers(monkeypatch)
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=1,
                                                 profiler_output_dir=str(tmp_path / "out")))
    fake_trainer.run([LogAt(set()), cb], 10, tmp_path)
    tensorboard.close_writers()
    # Never a logging step: every 3 samples, then the last one at train end.
    assert started == [3 * 7, 3 * 7, 3 * 7, 1 * 7]
    assert tensorboard_steps(tmp_path / "tb", "memory/params_mb/rank0")[1] == list(range(1, 11))


def test_lines_are_written_at_each_gather_in_one_write_and_the_sizes_walked_only_when_they_change(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    recording_gathers(monkeypatch)
    sized = []
    real_state_bytes = memory.memory_tools.state_bytes
    monkeypatch.setattr(memory.memory_tools, "state_bytes", lambda *a: sized.append(1) or real_state_bytes(*a))
    cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=1,
                                                 profiler_output_dir=str(tmp_path / "out")))
    lines_at_gather = []
    real_gather = cb._gather

    def gather():
        path = cb.run_dir / "memory_rank0.jsonl"
        lines_at_gather.append(len(path.read_text().splitlines()) if path.exists() else 0)
        real_gather()

    cb._gather = gather
    fake_trainer.run([LogAt({3, 6}), cb], 7, tmp_path)
    tensorboard.close_writers()
    # Before each gather the file holds the lines of the earlier gathers only: a sample step writes nothing.
    assert lines_at_gather == [0, 3, 6]
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 8))
    # Sized at the first sample (on_optimizer_step follows the optimizer's step: its state exists) and not again:
    # nothing the sizes depend on changes after it, and every step has the same figures.
    assert len(sized) == 1
    assert {(r["params_mb"], r["grads_mb"]) for r in rows} == {(2632 * 4 / MB, 2632 * 4 / MB)}
    # A change they depend on sizes again: gradients that are gone, an optimizer whose state grew.
    sized.clear()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    state, control = fake_trainer.TrainerState(), fake_trainer.TrainerControl()
    args = fake_trainer.training_args(tmp_path)

    def sample() -> dict:
        cb.on_optimizer_step(args, state, control, model=model, optimizer=optimizer)
        return dict(cb._model_state)

    no_grads = sample()
    model(torch.ones(1, 4)).sum().backward()
    with_grads = sample()
    optimizer.step()
    with_state = sample()
    assert sample() == with_state and len(sized) == 3
    assert (no_grads["grads_mb"], with_grads["grads_mb"], with_state["optimizer_state_mb"]) == (0.0, 80 / MB,
                                                                                                 2 * 80 / MB + 8 / MB)


def test_a_run_that_raises_still_writes_its_last_samples_as_the_process_exits(tmp_path):
    script = tmp_path / "raise.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT / "tests")!r})
        from unit import fake_trainer
        from hf_distprof import MemoryLoggerCallback, ProfilingArguments
        from transformers import TrainerCallback

        class Boom(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 4:
                    raise RuntimeError("CUDA out of memory (a stand-in)")

        cb = MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=1,
                                                     profiler_output_dir={str(tmp_path / "out")!r},
                                                     profiler_run_name="r"))
        from pathlib import Path
        fake_trainer.run([cb, Boom()], 8, Path({str(tmp_path)!r}))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TENSORBOARD_LOGGING_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "CUDA out of memory (a stand-in)" in proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "out" / "r" / "memory_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # never gathered (no logging step), written at exit


def test_a_line_with_a_nan_or_an_infinity_is_json_s_and_any_other_orjson_s():
    import math

    assert memory._line({"step": 1, "rss_mb": 2.5}) == '{"step":1,"rss_mb":2.5}\n'
    for odd in (float("nan"), float("inf"), -float("inf")):
        line = memory._line({"step": 1, "params_mb": odd})
        value = json.loads(line)["params_mb"]
        assert line.startswith('{"step": 1') and (math.isnan(value) if odd != odd else value == odd)
    assert memory._line({"step": 2, "note": "x", "flag": None}) == '{"step":2,"note":"x","flag":null}\n'  # no number


def test_a_rank_whose_read_failed_is_left_out_of_the_peak_imbalance():
    import math

    rows = [{"rank": r, "host": "h", "rss_mb": 1.0, "peak_rss_mb": p} for r, p in enumerate([100.0, math.nan, 150.0])]
    summary = memory.memory_summary(rows, ProfilingArguments(), 10, [])
    assert summary["highest_peak_rank"] == 2 and summary["peak_imbalance_pct"] == pytest.approx(50.0)
    assert "rank 2 peaks at 150 MiB vs 100 MiB on rank 0" in summary["peak_warning"]
    alone = memory.memory_summary(rows[:2], ProfilingArguments(), 10, [])
    assert alone["peak_imbalance_pct"] == 0.0 and alone["peak_warning"] is None
