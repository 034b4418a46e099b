"""Phase labels (record_function ranges in traces, NVTX with --nvtx) and --nsys-window's capture window."""

from __future__ import annotations

import gzip
import json
import logging
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile
from transformers import ModernBertForMaskedLM, Trainer, TrainerCallback, TrainingArguments

from hf_distprof import ProfilingArguments, StepTimerCallback, build_callbacks
from hf_distprof.analysis.api import analyze_file
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.callbacks.nsys import NsightCallback
from hf_distprof.recipe.models import tiny_modernbert_config
from hf_distprof.timing.clock import default_clock
from hf_distprof.timing.instrument import PHASE_PREFIX, ModelHooks, NvtxRanges, PhaseLabels
from hf_distprof.timing.recorder import StepRecorder

from . import fake_trainer

SEQ = 8
STEP = ["forward", "backward", "optimizer"]  # per optimizer step of the fake trainer (no data loader there)


# ---- PhaseLabels ---------------------------------------------------------------------------------------------


def test_no_range_is_opened_while_no_profiler_records(monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr("hf_distprof.timing.instrument.record_function", opened.append)
    labels = PhaseLabels()
    for phase in ("data", "forward", "backward", "optimizer"):
        labels.enter(phase)
    labels.exit()
    assert opened == []


def test_ranges_are_recorded_while_a_profiler_records():
    labels = PhaseLabels()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        labels.fetch()
        labels.fetch()  # a second batch of the same data phase opens nothing
        labels.enter("forward")
        labels.enter("backward")
        labels.exit()
        labels.exit()  # nothing open: nothing to close
    names = [e.name for e in prof.events() if e.name.startswith(PHASE_PREFIX)]
    assert names == ["hf_distprof/data", "hf_distprof/forward", "hf_distprof/backward"]


# ---- --nvtx over a fake run ----------------------------------------------------------------------------------


@pytest.fixture
def nvtx_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    return calls


def assert_nvtx_balanced(ranges: NvtxRanges, probe_depth: int) -> None:
    """Every phase range pushed was popped: by our own count, and by the tool's depth where one is attached.

    ``probe_depth`` is what ``range_push`` returned for a range pushed after the run: the depth of the NVTX stack
    then under a tool (0: empty), negative without one (the depth cannot be read).
    """
    assert ranges.pushed > 0, "the run pushed no NVTX range"
    assert ranges.open == 0, f"{ranges.open} NVTX range(s) left open ({ranges.pushed} pushed, {ranges.popped} popped)"
    if probe_depth >= 0:
        assert probe_depth == 0, f"the NVTX stack is {probe_depth} deep after the run"
    if ranges.deepest is not None:
        assert ranges.deepest == 0, f"a phase range was pushed {ranges.deepest} deep: phases nest or one stayed open"


class FakeNvtxTool:
    """``torch.cuda.nvtx.range_push``/``range_pop`` as an attached tool answers them: the stack's depth."""

    def __init__(self) -> None:
        self.stack: list[str] = []

    def push(self, name: str) -> int:
        self.stack.append(name)
        return len(self.stack) - 1

    def pop(self) -> int:
        self.stack.pop()
        return len(self.stack)


@pytest.fixture(params=["no tool", "a tool"])
def nvtx_api(request, monkeypatch) -> str:
    """CUDA and NVTX faked on CPU: without a tool every call returns -2 (as on an H100 without nsys), with one the
    depth."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if request.param == "no tool":
        monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: -2)
        monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: -2)
    else:
        tool = FakeNvtxTool()
        monkeypatch.setattr(torch.cuda.nvtx, "range_push", tool.push)
        monkeypatch.setattr(torch.cuda.nvtx, "range_pop", tool.pop)
    return request.param


def _timed_run(tmp_path) -> StepTimerCallback:
    timer = StepTimerCallback(ProfilingArguments(nvtx=True, enable_step_timing=True,
                                                 profiler_output_dir=str(tmp_path / "prof")))
    fake_trainer.run([timer], max_steps=3, tmp_path=tmp_path)
    return timer


def test_the_nvtx_balance_check_passes_a_clean_run_with_or_without_a_tool(tmp_path, nvtx_api):
    timer = _timed_run(tmp_path)
    ranges = timer._labels.nvtx_ranges
    assert (ranges.pushed, ranges.popped) == (9, 9)  # 3 phases a step, 3 steps
    assert ranges.deepest == (None if nvtx_api == "no tool" else 0)
    assert_nvtx_balanced(ranges, torch.cuda.nvtx.range_push("probe"))


def test_the_nvtx_balance_check_fails_a_run_that_leaves_a_phase_open(tmp_path, nvtx_api):
    timer = _timed_run(tmp_path)
    timer._labels.enter("optimizer")  # a phase opened and never closed, as a missed exit would leave it
    with pytest.raises(AssertionError, match=r"1 NVTX range\(s\) left open \(10 pushed, 9 popped\)"):
        assert_nvtx_balanced(timer._labels.nvtx_ranges, torch.cuda.nvtx.range_push("probe"))


def test_with_a_tool_a_range_pushed_around_the_run_shows_in_the_depth(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    tool = FakeNvtxTool()
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", tool.push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", tool.pop)
    tool.push("left open before the run")  # not ours: our counts balance, the tool's depth does not
    ranges = _timed_run(tmp_path)._labels.nvtx_ranges
    assert ranges.open == 0 and ranges.deepest == 1
    with pytest.raises(AssertionError, match="the NVTX stack is 1 deep after the run"):
        assert_nvtx_balanced(ranges, tool.push("probe"))


def _pushes_and_pops(phases: list[str]) -> list[str]:
    return [call for phase in phases for call in (f"push hf_distprof/{phase}", "pop")]


def test_nvtx_ranges_follow_the_phases_of_every_step(tmp_path, nvtx_calls):
    args = ProfilingArguments(nvtx=True, enable_step_timing=True, profiler_output_dir=str(tmp_path / "prof"))
    fake_trainer.run(build_callbacks(args), max_steps=3, tmp_path=tmp_path)
    assert nvtx_calls == _pushes_and_pops(STEP * 3)


def test_no_nvtx_without_the_flag_or_without_cuda(tmp_path, nvtx_calls, monkeypatch):
    args = ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "prof"))
    fake_trainer.run([StepTimerCallback(args)], max_steps=2, tmp_path=tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args.nvtx = True
    fake_trainer.run([StepTimerCallback(args)], max_steps=2, tmp_path=tmp_path)
    assert nvtx_calls == []


def test_on_cpu_the_nsight_flags_say_once_that_they_need_cuda(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    callback = NsightCallback(ProfilingArguments(nvtx=True, nsys_window=True))
    with caplog.at_level(logging.WARNING, logger="hf_distprof.callbacks.nsys"):
        fake_trainer.run([callback], max_steps=2, tmp_path=tmp_path)
        fake_trainer.run([callback], max_steps=2, tmp_path=tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 0] --nvtx and --nsys-window: CUDA only (NVTX ranges and cudaProfilerStart/Stop are CUDA APIs), and "
        "this run has no CUDA device: nothing is done for them"
    ]


def test_nvtx_without_step_timing_is_said(tmp_path, nvtx_calls, caplog):
    args = ProfilingArguments(nvtx=True, enable_step_timing=False)
    with caplog.at_level(logging.WARNING, logger="hf_distprof.callbacks.nsys"):
        fake_trainer.run(build_callbacks(args), max_steps=2, tmp_path=tmp_path)
    assert nvtx_calls == []
    assert "no NVTX ranges in this run" in caplog.text


# ---- --nsys-window over a fake run ---------------------------------------------------------------------------


class StepEnds(TrainerCallback):
    """Writes ``end N`` into the same list as the fake CUDA profiler, to show where it started and stopped."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def on_step_end(self, args, state, control, **kwargs):
        self.log.append(f"end {state.global_step}")


@pytest.fixture
def cuda_profiler(monkeypatch) -> list[str]:
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: log.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: log.append("stop"))
    return log


def _window_run(tmp_path, log: list[str], max_steps: int, **flags) -> list[str]:
    args = ProfilingArguments(nsys_window=True, profiler_wait_steps=2, profiler_warmup_steps=1,
                              profiler_active_steps=2, **flags)
    fake_trainer.run([StepEnds(log), NsightCallback(args)], max_steps=max_steps, tmp_path=tmp_path)
    return log


def test_the_capture_window_is_the_profiler_schedules_active_steps(tmp_path, cuda_profiler):
    # Steps 4-5 are active: capture from the end of step 3 (where ProfilerStep#4 starts) to the end of step 5.
    assert _window_run(tmp_path, cuda_profiler, max_steps=7) == [
        "end 1", "end 2", "end 3", "start", "end 4", "end 5", "stop", "end 6", "end 7"
    ]


def test_every_repeat_opens_a_window_and_the_end_of_training_closes_one(tmp_path, cuda_profiler):
    log = _window_run(tmp_path, cuda_profiler, max_steps=9, profiler_repeat=2)
    assert [x for x in log if not x.startswith("end")] == ["start", "stop", "start", "stop"]
    assert log[log.index("stop") + 1 :] == ["end 6", "end 7", "end 8", "start", "end 9", "stop"]


def test_ranks_outside_profile_ranks_open_no_window(tmp_path, cuda_profiler):
    assert "start" not in _window_run(tmp_path, cuda_profiler, max_steps=7, profile_ranks="1")


def test_a_failing_start_is_one_warning_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls: list[str] = []

    def start() -> None:
        calls.append("start")
        raise RuntimeError("CUDA error: profiler disabled")

    monkeypatch.setattr(torch.cuda.profiler, "start", start)
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    with caplog.at_level(logging.WARNING, logger="hf_distprof.callbacks.nsys"):
        log = _window_run(tmp_path, [], max_steps=12, profiler_repeat=0)
    assert log[-1] == "end 12" and calls == ["start"]  # no second window, no stop of a window never opened
    assert "--nsys-window: start() failed (RuntimeError('CUDA error: profiler disabled'))" in caplog.text


# ---- a real CPU trace ----------------------------------------------------------------------------------------


def _dataset(n: int = 24) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(5, 60, (SEQ,), generator=g)), "labels": ids.clone()} for _ in range(n)]


def _tiny_model() -> ModernBertForMaskedLM:
    torch.manual_seed(0)
    return ModernBertForMaskedLM(tiny_modernbert_config(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                                                         seq_len=SEQ))


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    """A real Trainer (gradient accumulation 2) profiled over steps 3-4 with the default callbacks."""
    tmp = tmp_path_factory.mktemp("phase_trace")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
        prof = ProfilingArguments(enable_profiling=True, profiler_wait_steps=1, profiler_warmup_steps=1,
                                  profiler_active_steps=2, profiler_output_dir=str(tmp / "prof"),
                                  profiler_run_name="run")
        training_args = TrainingArguments(output_dir=str(tmp / "out"), use_cpu=True, max_steps=5, logging_steps=2,
                                          per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          report_to="none", save_strategy="no", disable_tqdm=True)
        Trainer(model=_tiny_model(), args=training_args, train_dataset=_dataset(),
                callbacks=build_callbacks(prof)).train()
    (trace,) = (tmp / "prof" / "run").glob("*.pt.trace.json.gz")
    return trace


def _main_thread_events(trace: Path) -> tuple[dict[int, dict], list[dict]]:
    events = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    steps = {int(e["name"].split("#")[1]): e for e in events if e["name"].startswith("ProfilerStep#")}
    tid = next(iter(steps.values()))["tid"]
    return steps, [e for e in events if e["tid"] == tid and e.get("cat") in ("cpu_op", "user_annotation")]


def test_each_recorded_step_holds_its_phases_in_order(cpu_trace):
    steps, events = _main_thread_events(cpu_trace)
    assert sorted(steps) == [3, 4]
    for step in steps.values():
        inside = sorted(
            (e for e in events if e["name"].startswith(PHASE_PREFIX)
             and step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]),
            key=lambda e: e["ts"],
        )
        names = [e["name"].removeprefix(PHASE_PREFIX) for e in inside]
        assert names == ["data", "forward", "backward", "forward", "backward", "optimizer"]
    assert sum(e["name"].startswith(PHASE_PREFIX) for e in events) == 12  # none outside the steps


def _nests(a: dict, b: dict) -> bool:
    """Whether two events on one thread are disjoint or one holds the other (what trace viewers need)."""
    a0, a1, b0, b1 = a["ts"], a["ts"] + a["dur"], b["ts"], b["ts"] + b["dur"]
    return a1 <= b0 or b1 <= a0 or (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)


def test_the_phase_ranges_nest_with_every_other_event_of_the_thread(cpu_trace):
    _, events = _main_thread_events(cpu_trace)
    phases = [e for e in events if e["name"].startswith(PHASE_PREFIX)]
    bad = [(p["name"], e["name"]) for p in phases for e in events if e is not p and not _nests(p, e)]
    assert bad == []


def _without_phases(trace: Path, target: Path) -> Path:
    data = json.loads(gzip.decompress(trace.read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] if not str(e.get("name", "")).startswith(PHASE_PREFIX)]
    target.write_bytes(gzip.compress(json.dumps(data).encode()))
    return target


def test_the_phase_ranges_change_no_number_of_the_analysis(cpu_trace, tmp_path):
    bare = _without_phases(cpu_trace, tmp_path / "rank0_bare.pt.trace.json.gz")
    with_labels, without = analyze_file(str(cpu_trace), AnalysisOptions()), analyze_file(str(bare), AnalysisOptions())
    assert [s.cpu for s in with_labels.steps] == [s.cpu for s in without.steps]


# ---- DDP: the backward phase starts once DistributedDataParallel.forward has closed ------------------------


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_under_ddp_backward_opens_after_the_ddp_forward_range(one_rank_group):
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DistributedDataParallel(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder, labels = StepRecorder(default_clock(torch.device("cpu"))), PhaseLabels()
    hooks = ModelHooks(inner, recorder, labels)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(1, 4):  # what the step timer does at each Trainer hook
            recorder.step_begin()
            model(torch.randn(8, 16)).square().mean().backward()
            recorder.optimizer_begin()
            labels.enter("optimizer")
            opt.step()
            labels.exit()
            recorder.optimizer_end()
            recorder.step_end(step)
            with torch.no_grad():
                model(torch.randn(8, 16))  # an evaluation forward between steps: no phase
    hooks.remove()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    ddp = [e for e in events if e.name == "DistributedDataParallel.forward"][::2]  # the training forwards
    backward = [e for e in events if e.name == "hf_distprof/backward"]
    # The first forward registers the hook on the DDP module, which runs from the next call on.
    assert len(ddp) == 3 and len(backward) == 2
    for fwd, bwd in zip(ddp[1:], backward, strict=True):
        assert fwd.time_range.end <= bwd.time_range.start
    assert [e.name for e in events if e.name.startswith(PHASE_PREFIX)] == [
        "hf_distprof/forward", "hf_distprof/optimizer", *["hf_distprof/forward", "hf_distprof/backward",
                                                         "hf_distprof/optimizer"] * 2
    ]


# ---- GPU -----------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_on_gpu_a_run_leaves_the_nvtx_stack_balanced_and_the_trace_labelled(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    prof = ProfilingArguments(enable_profiling=True, nvtx=True, nsys_window=True, profiler_wait_steps=1,
                              profiler_warmup_steps=1, profiler_active_steps=2,
                              profiler_output_dir=str(tmp_path / "prof"), profiler_run_name="run")
    training_args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=2,
                                      report_to="none", save_strategy="no", disable_tqdm=True)
    callbacks = build_callbacks(prof)
    (timer,) = [cb for cb in callbacks if isinstance(cb, StepTimerCallback)]
    Trainer(model=_tiny_model(), args=training_args, train_dataset=_dataset(), callbacks=callbacks).train()
    probe = torch.cuda.nvtx.range_push("probe")  # a depth under an NVTX tool (nsys), -2 without one
    torch.cuda.nvtx.range_pop()
    assert_nvtx_balanced(timer._labels.nvtx_ranges, probe)
    (trace,) = (tmp_path / "prof" / "run").glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    on_gpu = {e["name"] for e in events if e.get("cat") == "gpu_user_annotation"}
    on_host = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert {"hf_distprof/forward", "hf_distprof/backward"} <= on_gpu
    # Kineto puts a kernel under the innermost user range around its launch: the optimizer's kernels are launched
    # inside torch's own `Optimizer.step#AdamW.step`, which opens inside our optimizer phase (seen on an H100), so
    # that phase is on the host timeline and its kernels on the GPU under torch's name.
    assert on_host.count("hf_distprof/optimizer") == 2  # the two active steps
    assert "hf_distprof/optimizer" in on_gpu or any(n.startswith("Optimizer.step#") for n in on_gpu)


@pytest.mark.gpu
def test_on_gpu_the_cuda_profiler_calls_succeed(tmp_path, monkeypatch):
    calls: list[str] = []
    real_start, real_stop = torch.cuda.profiler.start, torch.cuda.profiler.stop
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: (calls.append("start"), real_start())[1])
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: (calls.append("stop"), real_stop())[1])
    args = ProfilingArguments(nsys_window=True, profiler_wait_steps=1, profiler_warmup_steps=0,
                              profiler_active_steps=1)
    fake_trainer.run([NsightCallback(args)], max_steps=3, tmp_path=tmp_path, device="cuda")
    assert calls == ["start", "stop"]
