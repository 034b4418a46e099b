"""Rank and host identity in one process posing as rank 3 of 4 on host ``node-7``: exact names, no guessing.

The 2-rank integration tests see ranks 0 and 1 only; here every name a rank writes is checked for a rank
that is not 0, and the expected names are written out, never computed with the function under test.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_distprof import ProfilerCallback, ProfilingArguments, StepTimerCallback, dist, paths
from hf_distprof.callbacks import step_timer

from . import fake_trainer

RUN = "exp"


@pytest.fixture
def rank3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Rank 3 of 4 as torchrun launches it (``RANK``, ``WORLD_SIZE``), on host ``node-7.cluster.local``.

    Without a process group the broadcast of the run folder is a no-op, so the fake hands this rank what
    rank 0 would have broadcast: the folder name it created, and no error. The Trainer's arguments are
    built first: with ``WORLD_SIZE=4`` accelerate would start a 4-rank process group.
    """
    args = fake_trainer.training_args(tmp_path)
    monkeypatch.setattr(fake_trainer, "training_args", lambda _: args)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "node-7.cluster.local")

    def rank0_chose(obj: Any, src: int = 0) -> Any:
        return (RUN, None) if obj == (None, None) else obj

    monkeypatch.setattr(dist, "broadcast_object", rank0_chose)


def _prof_args(tmp_path: Path, **kw: Any) -> ProfilingArguments:
    return ProfilingArguments(
        enable_profiling=True, profiler_output_dir=str(tmp_path / "traces"), profiler_run_name=RUN,
        profiler_record_shapes=False, profiler_wait_steps=1, profiler_warmup_steps=1, profiler_active_steps=2, **kw
    )


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---- dist: the identity functions themselves ---------------------------------------------------------


def test_rank_and_world_come_from_the_launcher_environment_before_init(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (dist.get_rank(), dist.get_world_size()) == (3, 4)
    assert dist.is_distributed() is False


def test_rank_and_world_come_from_the_process_group_once_it_exists(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(dist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist.dist, "get_rank", lambda: 5)
    monkeypatch.setattr(dist.dist, "get_world_size", lambda: 8)
    assert dist.is_distributed() is True
    assert (dist.get_rank(), dist.get_world_size()) == (5, 8)


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ("node-7.cluster.local", "node-7"),
        ("gpu_box 2", "gpu-box-2"),
        ("host@#1.domain", "host-1"),
        ("", "host"),
        (".hidden", "host"),
    ],
)
def test_hostname_is_short_and_safe_in_a_file_name(monkeypatch, raw, short):
    monkeypatch.setattr(socket, "gethostname", lambda: raw)
    assert dist.get_hostname() == short


def test_without_a_process_group_collectives_are_local(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert dist.broadcast_object({"a": 1}) == {"a": 1}
    assert dist.all_gather_object(7) == [7]
    assert dist.all_gather_floats_async([1.5, 2.0]).result() == [[1.5, 2.0]]
    dist.barrier()  # a no-op: returns


def test_log_prefix_names_this_rank(rank3, caplog):
    with caplog.at_level(logging.INFO):
        dist.get_logger("hf_distprof.test").info("hello")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 3] hello"]


# ---- paths and callbacks as rank 3 -------------------------------------------------------------------


def test_rank3_joins_rank0s_folder_and_logs_to_its_own_file(rank3, tmp_path):
    run_dir = paths.resolve_run_dir(tmp_path, RUN, owner=object())
    assert run_dir == tmp_path.absolute() / RUN
    logging.getLogger("some.library").warning("from rank 3")
    (line,) = (run_dir / "rank3.log").read_text().splitlines()
    assert line.endswith(" rank 3 node-7 WARNING some.library: from rank 3")
    assert _names(run_dir) == ["rank3.log"]


def test_rank3_does_not_create_the_folder_when_rank0_could_not(monkeypatch, rank3, tmp_path, caplog):
    monkeypatch.setattr(dist, "broadcast_object", lambda obj, src=0: (None, "rank 0: disk full"))
    with caplog.at_level(logging.WARNING):
        assert paths.resolve_run_dir(tmp_path, RUN, owner=object()) is None
    assert list(tmp_path.iterdir()) == []
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 3] rank 0: disk full; profiling files are not written, training goes on"
    ]


def test_a_folder_one_rank_cannot_create_means_no_folder_on_any_rank(monkeypatch, rank3, tmp_path, caplog):
    # Rank 1's node-local folder failed: rank 3 created its own, but takes the same path as rank 1 (the
    # callbacks' collectives depend on it), with rank 1's reason.
    gathered: list[Any] = []

    def gather(obj: Any) -> list[Any]:
        gathered.append(obj)
        return [(None, False, "node-0"),
                ("rank 1: cannot create the run folder /x/run: [Errno 28] No space left on device", False, "node-1"),
                (None, False, "node-2"), obj]

    monkeypatch.setattr(dist, "all_gather_object", gather)
    with caplog.at_level(logging.WARNING):
        assert paths.resolve_run_dir(tmp_path, RUN, owner=object()) is None
    assert gathered == [(None, False, "node-7")]  # this rank's own folder was created (it held no earlier run)
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 3] rank 1: cannot create the run folder /x/run: [Errno 28] No space left on device; profiling files "
        "are not written, training goes on"
    ]


def test_profiler_as_rank3_writes_trace_and_summary_named_rank3_node7(rank3, tmp_path):
    cb = ProfilerCallback(_prof_args(tmp_path))
    fake_trainer.run([cb], 4, tmp_path)
    run_dir = tmp_path / "traces" / RUN
    assert cb.run_dir == run_dir.absolute()
    # parallelism.json and manifest.json are rank 0's files; this rank writes its trace, summary, log and manifest part.
    assert _names(run_dir) == [
        "manifest_rank3_node-7.json",
        "rank3.log", "rank3_node-7_step3-4.pt.trace.json.gz", "rank3_node-7_step3-4.pt.trace.json.gz.compact.msgpack",
        "rank3_node-7_step3-4_summary.txt"
    ]
    summary = (run_dir / "rank3_node-7_step3-4_summary.txt").read_text()
    assert summary.startswith("hf_distprof profiler summary: rank 3 of 4, host node-7, optimizer steps 3-4\n")
    with gzip.open(run_dir / "rank3_node-7_step3-4.pt.trace.json.gz", "rt") as fh:
        steps = sorted(e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("Profiler"))
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]


@pytest.mark.parametrize(
    ("ranks", "written"),
    [("0", []), ("3", ["rank3_node-7_step3-4.pt.trace.json.gz"]), ("1,3", ["rank3_node-7_step3-4.pt.trace.json.gz"])],
)
def test_profile_ranks_decides_for_rank3(rank3, tmp_path, ranks, written):
    cb = ProfilerCallback(_prof_args(tmp_path, profile_ranks=ranks))
    fake_trainer.run([cb], 4, tmp_path)
    run_dir = tmp_path / "traces" / RUN
    assert sorted(n for n in _names(run_dir) if n.endswith(".gz")) == written


def test_profile_ranks_0_writes_rank0s_trace(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(socket, "gethostname", lambda: "node-0")
    cb = ProfilerCallback(_prof_args(tmp_path, profile_ranks="0"))
    fake_trainer.run([cb], 4, tmp_path)
    assert [p.name for p in cb.written] == ["rank0_node-0_step3-4.pt.trace.json.gz", "rank0_node-0_step3-4_summary.txt"]
    assert (tmp_path / "traces" / RUN / "rank0_node-0_step3-4.pt.trace.json.gz").stat().st_size > 0


def test_step_timer_as_rank3_names_its_file_and_reports_rank3(rank3, tmp_path, monkeypatch):
    sent: list[Any] = []

    def gather(obj: Any) -> list[Any]:
        sent.append(obj)
        return [obj]  # what this rank contributes; rank 0 would receive it in position 3

    def gather_async(obj: Any, cap: int) -> Any:
        sent.append(obj)
        return real_async(obj, cap)  # no process group: nothing is sent

    real_async = step_timer.dist.all_gather_json_async
    monkeypatch.setattr(step_timer.dist, "all_gather_object", gather)
    monkeypatch.setattr(step_timer.dist, "all_gather_json_async", gather_async)
    cb = StepTimerCallback(ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "prof"),
                                              profiler_run_name=RUN))
    args, state, control = fake_trainer.training_args(tmp_path), TrainerState(), TrainerControl()
    model = torch.nn.Linear(4, 2)
    cb.on_train_begin(args, state, control, model=model)
    for _ in range(4):
        cb.on_step_begin(args, state, control)
        model(torch.randn(3, 4)).sum().backward()
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_optimizer_step(args, state, control)
        state.global_step += 1
        control.should_log = state.global_step == 4
        cb.on_step_end(args, state, control)
    control.should_log = False
    cb.on_log(args, state, control, logs={"loss": 1.0})
    cb.on_train_end(args, state, control)
    run_dir = tmp_path / "prof" / RUN
    # No timing_summary.json: that is rank 0's.
    assert _names(run_dir) == ["rank3.log", "timing_rank3.jsonl"]
    # The run folder's agreement (no error here), the parallelism report's gather (this rank's 10 parameters),
    # the logging step's, the end-of-run one.
    assert sent[:2] == [(None, False, "node-7"), 10] and len(sent) == 4
    for payload in sent[2:]:
        assert (payload["run"]["rank"], payload["run"]["host"]) == (3, "node-7")
    assert (sent[2]["interval"]["rank"], sent[2]["interval"]["host"]) == (3, "node-7")
    lines = [json.loads(x) for x in (run_dir / "timing_rank3.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]


# ---- dist's collectives over a (fake) process group ------------------------------------------------------


class FakeGroup:
    """torch.distributed as a process group of ``world`` ranks would answer, with every call recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, world: int, backend: str = "gloo", rank: int = 1) -> None:
        self.calls: list[tuple] = []
        self.waits = 0
        self.completed = False
        d = dist.dist
        monkeypatch.setattr(d, "is_initialized", lambda: True)
        monkeypatch.setattr(d, "get_world_size", lambda: world)
        monkeypatch.setattr(d, "get_rank", lambda: rank)
        monkeypatch.setattr(d, "get_backend", lambda: backend)
        monkeypatch.setattr(d, "barrier", lambda: self.calls.append(("barrier",)))
        monkeypatch.setattr(d, "broadcast_object_list", self.broadcast_object_list)
        monkeypatch.setattr(d, "all_gather_object", self.all_gather_object)
        monkeypatch.setattr(d, "all_gather", self.all_gather)

    def broadcast_object_list(self, holder: list, src: int) -> None:
        self.calls.append(("broadcast", list(holder), src))
        holder[0] = ("from", src)

    def all_gather_object(self, out: list, obj: Any) -> None:
        self.calls.append(("all_gather_object", len(out), obj))
        out[:] = [(r, obj) for r in range(len(out))]

    def all_gather(self, out: list, local: torch.Tensor, async_op: bool) -> Any:
        self.calls.append(("all_gather", len(out), local.dtype, async_op))
        for r, t in enumerate(out):
            t.copy_(local + 10 * r)
        group = self

        class Work:
            def wait(self) -> None:
                group.waits += 1

            def is_completed(self) -> bool:
                return group.waits > 0 or group.completed

        return Work()


def test_collectives_go_through_the_group_when_there_is_one(monkeypatch):
    group = FakeGroup(monkeypatch, world=3)
    assert dist.broadcast_object("mine", src=2) == ("from", 2)
    assert dist.all_gather_object("x") == [(0, "x"), (1, "x"), (2, "x")]
    pending = dist.all_gather_floats_async([1.5, 2.25])
    assert pending.done() is False  # asks the work, never waits on it
    group.completed = True
    assert pending.done() is True and group.waits == 0
    assert pending.result() == [[1.5, 2.25], [11.5, 12.25], [21.5, 22.25]]
    assert pending.result() == [[1.5, 2.25], [11.5, 12.25], [21.5, 22.25]]  # waits once only
    dist.barrier()
    assert group.calls == [
        ("broadcast", ["mine"], 2),
        ("all_gather_object", 3, "x"),
        ("all_gather", 3, torch.float64, True),
        ("barrier",),
    ]
    assert group.waits == 1


def test_a_group_of_one_needs_no_collective(monkeypatch):
    group = FakeGroup(monkeypatch, world=1, rank=0)
    assert dist.broadcast_object("mine") == "mine" and dist.all_gather_object(3) == [3]
    assert dist.all_gather_floats_async([0.1]).result() == [[0.1]]
    assert dist.all_gather_floats_async([0.1]).done() is True  # nothing to wait for
    dist.barrier()
    assert group.calls == []


def test_on_nccl_the_floats_travel_on_this_ranks_gpu_and_the_host_never_waits(monkeypatch):
    group = FakeGroup(monkeypatch, world=2, backend="nccl")
    dist.barrier()
    assert group.calls == [("barrier",)]  # two ranks are enough to wait for each other
    seen: list[tuple] = []  # what happened, in order (a CPU build has no CUDA tensor to make: fakes)

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        seen.append(("pin", self.tolist()))
        return self

    def to(self: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        seen.append(("upload", device, non_blocking))
        return self

    real_empty, real_copy = torch.empty, torch.Tensor.copy_

    def empty(*shape: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        seen.append(("host buffer", pin_memory))
        return real_empty(*shape, **kwargs)

    def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        seen.append(("download", non_blocking))
        return real_copy(self, src)

    class Event:
        finished = False

        def record(self) -> None:
            seen.append(("event recorded",))

        def query(self) -> bool:
            return self.finished

        def synchronize(self) -> None:
            seen.append(("host waits for the event",))

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(dist.torch, "empty", empty)
    monkeypatch.setattr(dist.torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(dist.torch.cuda, "Event", Event)
    group_gather = group.all_gather

    def all_gather(out: list, local: torch.Tensor, async_op: bool) -> Any:
        seen.append(("all_gather", async_op))
        work = group_gather(out, local, async_op)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)  # from here on, copies are the downloads
        return work

    monkeypatch.setattr(dist.dist, "all_gather", all_gather)
    pending = dist.all_gather_floats_async([1.0, 2.5])
    monkeypatch.setattr(torch.Tensor, "copy_", real_copy)
    assert seen == [
        ("pin", [1.0, 2.5]),
        ("upload", torch.device("cuda", 3), True),
        ("all_gather", True),
        ("host buffer", True), ("host buffer", True),
        ("download", True), ("download", True),
        ("event recorded",),
    ]
    assert group.waits == 1  # Work.wait on NCCL: the stream waits for the gather, the host does not
    assert pending.done() is False  # the event says so, without waiting
    Event.finished = True
    assert pending.done() is True
    assert pending.result() == [[1.0, 2.5], [11.0, 12.5]]
    assert seen[-1] == ("host waits for the event",)  # result() is the one place that may wait


@pytest.mark.gpu
def test_on_a_gpu_starting_and_polling_the_gather_never_synchronises(monkeypatch):
    """CUDA's sync debug mode raises on any operation that makes the host wait for the device."""
    FakeGroup(monkeypatch, world=2, backend="nccl")

    def all_gather(out: list, local: torch.Tensor, async_op: bool) -> Any:
        for r, t in enumerate(out):
            t.copy_(local + 10 * r)  # on the GPU, on the current stream

        class Work:
            def wait(self) -> None:
                pass

        return Work()

    monkeypatch.setattr(dist.dist, "all_gather", all_gather)
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = dist.all_gather_floats_async([1.0, 2.5])
        pending.done()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert pending.result() == [[1.0, 2.5], [11.0, 12.5]]
