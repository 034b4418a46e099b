"""MemoryLoggerCallback: values, cadence, JSON lines and TensorBoard scalars; the GPU path with fakes."""

from __future__ import annotations

import json

import psutil
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hf_distprof import MemoryLoggerCallback, ProfilingArguments, tensorboard
from hf_distprof.callbacks import memory

from . import fake_trainer

MB = 1024 * 1024


def test_cpu_sample_is_the_process_rss():
    before = psutil.Process().memory_info().rss / MB
    sample = memory.read_memory()
    after = psutil.Process().memory_info().rss / MB
    assert set(sample) == {"rss_mb"}
    assert min(before, after) - 1 <= sample["rss_mb"] <= max(before, after) + 1


def test_gpu_sample_reads_allocator_counters_without_synchronising(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    calls = []

    def counter(value):
        def read(device):
            calls.append(device)
            return value
        return read

    monkeypatch.setattr(torch.cuda, "memory_allocated", counter(512 * MB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", counter(1024 * MB))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", counter(768 * MB))

    def no_sync(*a, **k):
        raise AssertionError("read_memory must not synchronise the device")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    sample = memory.read_memory()
    assert sample["allocated_mb"] == 512.0
    assert sample["reserved_mb"] == 1024.0
    assert sample["peak_allocated_mb"] == 768.0
    assert calls == [3, 3, 3]
    assert sample["rss_mb"] > 0


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
    assert sorted(p.name for p in cb.run_dir.iterdir()) == ["memory_rank0.jsonl"]
    rows = [json.loads(line) for line in (cb.run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 8]
    assert all(r["rank"] == 0 and r["rss_mb"] > 10 for r in rows)

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert sorted(tags) == ["memory/rss_mb/max", "memory/rss_mb/rank0"]
    events = acc.Scalars("memory/rss_mb/rank0")
    assert [e.step for e in events] == [4, 8]
    assert [round(e.value, 3) for e in events] == [round(r["rss_mb"], 3) for r in rows]
