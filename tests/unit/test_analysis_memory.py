"""``[memory]`` events (``profile_memory``): per-step peaks, top allocators, the imbalance finding, text, report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.core import names
from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_findings, format_summary
from hf_distprof.analysis.rank.memory import NO_OPERATOR, decimate
from hf_distprof.analysis.tell.report import MEMORY_PNG, REPORT_HTML, REPORT_MD, write_report
from hf_distprof.core.text import format_bytes
from hf_distprof.cli.main import main

MAIN, OTHER = 1, 2  # thread ids
# (name, start, end, tid) of the cpu ops around the allocations.
OPS = [
    ("aten::zeros", 10, 30, MAIN),
    ("aten::empty", 10, 15, MAIN),  # starts with aten::zeros, which encloses it
    ("aten::mm", 40, 50, MAIN),
    ("aten::copy_", 40, 50, OTHER),
    ("aten::mm", 110, 120, MAIN),
    ("aten::add", 150, 160, MAIN),
]
# (ts, tid, bytes) of the CPU's [memory] events; steps are [0, 100] and [100, 200].
CPU_EVENTS = [
    (-10, MAIN, 300),  # before the first step: only the level it begins with
    (13, MAIN, 1000),  # aten::empty, the innermost op (inside aten::zeros)
    (45, MAIN, 4000),  # aten::mm
    (47, OTHER, 100),  # aten::copy_ on its own thread, though aten::mm is open on the main thread
    (60, MAIN, -1000),
    (115, MAIN, 4000),  # aten::mm
    (155, MAIN, -4000),
    (170, MAIN, 500),  # outside every op
    (250, MAIN, 1_000_000),  # after the last step: left out
]


def write_trace(
    path: Path, rank: int, scale: float = 1.0, profile_memory: bool = True, first_step: int = 1, offset: float = 0.0
) -> Path:
    """A 2-step gloo trace of ``rank`` with the events above, CPU bytes multiplied by ``scale``, its times
    shifted by ``offset`` us, and one 2 KiB CUDA allocation (unscaled) inside the first aten::mm."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{first_step + k}", "pid": 7, "tid": MAIN,
         "ts": offset + 100 * k, "dur": 100}
        for k in range(2)
    ]
    events += [
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": tid, "ts": offset + start, "dur": end - start}
        for name, start, end, tid in OPS
    ]
    total = 0
    for ts, tid, amount in CPU_EVENTS:
        amount = int(amount * scale)
        total += amount
        events.append(memory_event(offset + ts, tid, amount, total, device_type=0, device_id=-1))
    events.append(memory_event(offset + 46, MAIN, 2048, 2048, device_type=1, device_id=0))
    doc: dict[str, Any] = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}}
    if profile_memory:
        doc["profile_memory"] = 1
    doc["traceEvents"] = events
    path.write_text(json.dumps(doc, indent=1))
    return path


def memory_event(ts: float, tid: int, amount: Any, total: int, device_type: int, device_id: int) -> dict[str, Any]:
    return {
        "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7, "tid": tid, "ts": ts,
        "args": {"Total Reserved": 0, "Total Allocated": total, "Bytes": amount, "Device Id": device_id,
                 "Device Type": device_type, "Addr": 1234, "Ev Idx": 1},
    }


def write_pair(folder: Path, scale: float) -> Path:
    """Rank 0 with the events above, rank 1 with its CPU bytes multiplied by ``scale``."""
    folder.mkdir()
    write_trace(folder / "rank0_host_step1-2.pt.trace.json", rank=0)
    write_trace(folder / "rank1_host_step1-2.pt.trace.json", rank=1, scale=scale)
    return folder


def run_pair(folder: Path, scale: float, **options: Any) -> AnalysisResult:
    return analyze_paths([write_pair(folder, scale)], AnalysisOptions(workers=1, **options))


def memory_findings(result: AnalysisResult) -> list[Any]:
    return [f for f in result.findings if f.kind == "memory_imbalance"]


def test_exact_peaks_steps_and_allocators(tmp_path: Path) -> None:
    result = run_pair(tmp_path / "run", scale=1.0)
    rank = result.ranks[0]
    assert [d.device for d in rank.memory] == ["cpu", "cuda:0"]
    cpu, cuda = rank.memory
    # Step 1 holds 300 from before it; its peak is after aten::copy_ on the other thread: 300 + 1000 + 4000 + 100.
    assert [(s.step, s.peak_allocated_bytes, s.allocated_bytes, s.freed_bytes, s.n_allocations, s.n_frees)
            for s in cpu.steps] == [(1, 5400, 5100, 1000, 3, 1), (2, 8400, 4500, 4000, 2, 1)]
    assert (cpu.peak_allocated_bytes, cpu.peak_step) == (8400, 2)  # the 1 MB after the last step is left out
    assert [(op.name, op.allocated_bytes, op.count) for op in cpu.top_ops] == [
        ("aten::mm", 8000, 2), ("aten::empty", 1000, 1), (NO_OPERATOR, 500, 1), ("aten::copy_", 100, 1)
    ]
    assert cpu.series_bytes == [300, 1300, 5300, 5400, 4400, 8400, 4400, 4900]
    assert cpu.series_ms == pytest.approx([0.0, 0.013, 0.045, 0.047, 0.060, 0.115, 0.155, 0.170])
    # A step without events holds the level the device entered it with.
    assert [(s.step, s.peak_allocated_bytes, s.allocated_bytes) for s in cuda.steps] == [(1, 2048, 2048), (2, 2048, 0)]
    assert (cuda.peak_step, [(op.name, op.count) for op in cuda.top_ops]) == (1, [("aten::mm", 1)])
    out = result.to_dict()["ranks"][1]["memory"][0]
    assert out["device"] == "cpu" and out["peak_allocated_bytes"] == 8400 and out["top_ops"][0]["name"] == "aten::mm"


def test_imbalanced_pair_is_a_finding_naming_the_rank(tmp_path: Path) -> None:
    result = run_pair(tmp_path / "run", scale=2.0)
    [finding] = memory_findings(result)  # the CUDA peaks are equal: no finding for them
    assert finding.title == "Peak cpu memory imbalance across ranks" and finding.ranks == [1]
    assert finding.numbers == {
        "imbalance_pct": pytest.approx(100.0), "max_peak_bytes": 16800.0, "typical_peak_bytes": 8400.0,
        "threshold_pct": 20.0,
    }
    assert f"rank 1 {format_bytes(16800)} on cpu (step 2) vs {format_bytes(8400)}" in finding.evidence
    assert "aten::mm" in finding.evidence and "Peak cpu memory imbalance" in format_findings(result)


def test_balanced_pair_is_silent_until_the_threshold_is_below_its_imbalance(tmp_path: Path) -> None:
    quiet = run_pair(tmp_path / "quiet", scale=1.1)
    assert [d.peak_allocated_bytes for r in quiet.ranks for d in r.memory if d.kind == "cpu"] == [8400, 9240]
    assert memory_findings(quiet) == []
    assert "memory imbalance" not in format_findings(quiet)
    strict = run_pair(tmp_path / "strict", scale=1.1, memory_imbalance_pct=5.0)
    [finding] = memory_findings(strict)
    assert finding.ranks == [1] and finding.numbers["imbalance_pct"] == pytest.approx(10.0)


def test_summary_has_the_memory_section_only_with_memory_events(tmp_path: Path) -> None:
    text = format_summary(run_pair(tmp_path / "run", scale=2.0))
    assert "Memory (from [memory] events" in text
    assert f"   1 cpu        {format_bytes(16800)}       2" in text
    assert f"  rank 1 cpu: aten::mm {format_bytes(16000)} (2), aten::empty {format_bytes(2000)} (1)" in text
    # The same trace without the header's profile_memory is read as before: no memory, no key, no section.
    (tmp_path / "plain").mkdir()
    for rank in (0, 1):
        write_trace(tmp_path / "plain" / f"rank{rank}_host_step1-2.pt.trace.json", rank, profile_memory=False)
    plain = analyze_paths([tmp_path / "plain"], AnalysisOptions(workers=1))
    assert [r.memory for r in plain.ranks] == [[], []] and memory_findings(plain) == []
    assert "Memory (" not in format_summary(plain) and all("memory" not in r for r in plain.to_dict()["ranks"])


def test_two_windows_of_a_rank_are_joined(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0_host_step1-2.pt.trace.json", rank=0)
    write_trace(tmp_path / "rank0_host_step3-4.pt.trace.json", rank=0, first_step=3, offset=1000.0)
    [rank] = analyze_paths([tmp_path], AnalysisOptions(workers=1)).ranks
    cpu = rank.memory[0]
    assert [s.step for s in cpu.steps] == [1, 2, 3, 4] and (cpu.peak_allocated_bytes, cpu.peak_step) == (8400, 2)
    assert (cpu.top_ops[0].name, cpu.top_ops[0].allocated_bytes, cpu.top_ops[0].count) == ("aten::mm", 16000, 4)
    assert len(cpu.series_ms) == 16 and cpu.series_ms[8] == pytest.approx(1.0)  # the second window, 1 ms on


def test_malformed_memory_event_names_the_file_and_value(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "rank0_host_step1-2.pt.trace.json", rank=0)
    doc = json.loads(path.read_text())
    next(e for e in doc["traceEvents"] if e["name"] == "[memory]")["args"]["Bytes"] = "12"
    path.write_text(json.dumps(doc))
    result = analyze_paths([path], AnalysisOptions(workers=1))
    assert result.ranks == [] and result.errors[0].path == str(path)
    assert result.errors[0].reason == "[memory] event at ts -10.0 has Bytes '12', which is not an integer"


def test_decimate_bounds_the_series_and_keeps_the_peak() -> None:
    values = [i % 7 for i in range(10_000)]
    values[4321] = 99
    times = [float(i) for i in range(10_000)]
    kept_t, kept_v = decimate(times, values, buckets=100)
    assert len(kept_v) <= 200 and max(kept_v) == 99 and kept_t == sorted(kept_t) and min(kept_v) == 0
    assert decimate(times[:150], values[:150], buckets=100) == (times[:150], values[:150])


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 profiled steps (after 1 warm-up) of a tiny MLP, with profile_memory, named like the callback's."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    folder = tmp_path_factory.mktemp("real")
    path = folder / names.TRACE_NAME.format(rank=0, host="host", first=1, last=3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        schedule=schedule(wait=0, warmup=1, active=3),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(4):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            prof.step()
    return folder


def reference_steps(path: Path) -> list[tuple[int, int, int]]:
    """(step, peak, bytes allocated) per ProfilerStep, straight from the JSON: the level the step begins
    with and every event inside it."""
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    steps = sorted((e for e in events if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    out = []
    for step in steps:
        before = [e["args"]["Total Allocated"] for e in memory if e["ts"] < step["ts"]]
        inside = [e["args"] for e in memory if step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
        peak = max(before[-1:] + [a["Total Allocated"] for a in inside])
        out.append((int(step["name"].split("#")[1]), peak, sum(a["Bytes"] for a in inside if a["Bytes"] > 0)))
    return out


def test_real_trace_has_memory_for_every_step(real_run: Path) -> None:
    [path] = real_run.iterdir()
    [rank] = analyze_paths([real_run], AnalysisOptions(workers=1)).ranks
    [cpu] = rank.memory
    assert cpu.device == "cpu" and [s.step for s in rank.steps] == [1, 2, 3]
    stats = [(s.step, s.peak_allocated_bytes, s.allocated_bytes) for s in cpu.steps]
    assert stats == reference_steps(path) and all(peak > 0 for _, peak, _ in stats)
    top = {op.name for op in cpu.top_ops}
    assert {"aten::mm", "aten::addmm"} <= top and NO_OPERATOR not in top  # every allocation is under an op
    assert sum(op.allocated_bytes for op in cpu.top_ops) <= sum(s.allocated_bytes for s in cpu.steps)


def test_cli_prints_the_section_and_report_draws_memory(
    real_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(real_run), "--workers", "1", "--report", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "Memory (from [memory] events" in out and "  rank 0 cpu: aten::" in out
    assert (tmp_path / "rep" / MEMORY_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({MEMORY_PNG})" in (tmp_path / "rep" / REPORT_MD).read_text()
    assert (tmp_path / "rep" / REPORT_HTML).read_text().count("data:image/png;base64,") == 7  # + the critical path
    # Without memory events, no plot.
    write_report(analyze_paths([Path(__file__).parents[1] / "data" / "clean"], AnalysisOptions(workers=1)),
                 tmp_path / "plain")
    assert not (tmp_path / "plain" / MEMORY_PNG).exists()


def test_memory_imbalance_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pair(tmp_path / "run", scale=1.1)
    assert main(["analyze", str(tmp_path / "run"), "--workers", "1", "--json", "--memory-imbalance-pct", "5"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["options"]["memory_imbalance_pct"] == 5.0
    assert [f["ranks"] for f in data["findings"] if f["kind"] == "memory_imbalance"] == [[1]]
    assert main(["analyze", str(tmp_path / "run"), "--memory-imbalance-pct", "-1"]) == 2
    assert capsys.readouterr().err == "hf-distprof analyze: error: --memory-imbalance-pct must be >= 0, got -1.0\n"
