"""StepRecorder: exact phase sums from scripted timelines, on the CPU clock and on a fake CUDA-event clock."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
import torch

from hf_distprof.timing.clock import CpuClock, CudaEventClock, default_clock
from hf_distprof.timing.cpu_wait import SCHEDSTAT, RunQueueClock, waited
from hf_distprof.timing.recorder import StepRecorder


class Timeline:
    """A hand-driven clock: ``now`` only moves when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeCpuClock:
    cheap_marks = True

    def __init__(self, timeline: Timeline) -> None:
        self.t = timeline

    def mark(self) -> float:
        return self.t.now

    def elapsed(self, start: float, end: float) -> float:
        return end - start

    def wait(self, mark: float) -> None:
        pass

    def release(self, marks: list[float]) -> None:
        pass


class FakeEvent:
    """Mimics torch.cuda.Event on one stream: record() captures the timeline; the fake device has reached
    ``log["device_at"]``; synchronize() waits for the event (the device reaches it, and every event recorded before
    it); elapsed_time() raises unless both events completed, as torch's does ("Both events must be completed before
    calculating elapsed time.")."""

    created = 0

    def __init__(self, timeline: Timeline, log: dict[str, int]) -> None:
        FakeEvent.created += 1
        self.t, self.log = timeline, log
        self.time: float | None = None

    def record(self, stream: object = None) -> None:
        self.log["record"] += 1
        # The device reaches the event once the work queued before it is done (``busy_until``: none by default).
        self.time = max(self.t.now, self.log.get("busy_until", self.t.now))

    def query(self) -> bool:
        """Completed: recorded at or before the time the fake device has reached; True for an event never recorded
        (CUDA's cudaEventQuery of an unrecorded event)."""
        self.log["query"] += 1
        return self.time is None or self.time <= self.log["device_at"]

    def synchronize(self) -> None:
        self.log["sync"] += 1
        if self.time is not None:
            self.log["device_at"] = max(self.log["device_at"], self.time)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.time is not None and end.time is not None, "reading an event never recorded"
        if not (self.time <= self.log["device_at"] and end.time <= self.log["device_at"]):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        self.log["read"] += 1
        return (end.time - self.time) * 1000.0  # milliseconds, like CUDA


def fake_cuda_clock(timeline: Timeline) -> tuple[CudaEventClock, dict[str, int]]:
    log = {"record": 0, "sync": 0, "read": 0, "query": 0, "device_at": -1.0}
    return CudaEventClock(event_factory=lambda: FakeEvent(timeline, log)), log


def run_step(
    rec: StepRecorder,
    t: Timeline,
    step: int,
    micro: int = 2,
    params: int = 3,
    data: float = 0.5,
    fwd: float = 1.0,
    compute: float = 2.0,
    sync: float = 0.25,
    opt: float = 0.125,
    tokens: object = 16,
    loads: int = 0,
) -> None:
    """One optimizer step: data (``loads`` timed loader calls in it), ``micro`` x (forward, backward with ``params``
    grad hooks), optimizer."""
    for _ in range(loads):
        t.advance(data / loads)
        rec.add_load_time(data / loads)
    t.advance(0.0 if loads else data)
    rec.step_begin()
    for i in range(micro):
        rec.forward_begin(samples=4, tokens=tokens)
        t.advance(fwd)
        rec.forward_end()
        for _ in range(params):
            t.advance(compute / params)
            rec.grad_ready()
        t.advance(sync)  # the gradient all-reduce (only really on the last micro-batch, here on every one)
        if i < micro - 1:
            rec.micro_end()
    rec.optimizer_begin()
    t.advance(opt)
    rec.optimizer_end()
    rec.step_end(step)


def test_cpu_phases_are_exact_sums_over_micro_batches():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t), loader_timed=True)
    rec.boundary()
    rec.add_load_time(0.375)
    run_step(rec, t, step=1, tokens=torch.tensor(13))
    (s,) = rec.resolve()
    assert s.step == 1 and s.micro_batches == 2 and s.samples == 8 and s.tokens == 26
    assert s.data_s == pytest.approx(0.5)
    assert s.data_load_s == pytest.approx(0.375)
    assert s.forward_s == pytest.approx(2 * 1.0)
    assert s.backward_s == pytest.approx(2 * (2.0 + 0.25))
    assert s.backward_compute_s == pytest.approx(2 * 2.0)
    assert s.optimizer_s == pytest.approx(0.125)
    assert s.step_s == pytest.approx(0.5 + 2 * 3.25 + 0.125)
    assert s.pre_sync_s == pytest.approx(0.375 + 2.0 + 4.0)
    assert s.wait_s == pytest.approx(s.step_s - s.pre_sync_s - s.optimizer_s)
    assert set(s.to_json()) >= {"step", "data_s", "forward_s", "backward_s", "optimizer_s", "step_s"}
    assert rec.resolve() == []  # each step is reported once


def as_if_on_a_device(monkeypatch):
    """The recorder's host-tensor path off: CPU tensors take the device's (counted on the device, read in one copy)."""
    from hf_distprof.timing import tokens

    monkeypatch.setattr(tokens, "host_count", lambda t: None)


def test_device_token_counts_are_read_in_one_copy(monkeypatch):
    """Per micro-batch ``int(tensor)`` would be one device-to-host sync each; resolve reads them once."""
    as_if_on_a_device(monkeypatch)
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    run_step(rec, t, step=1, tokens=torch.tensor(13))
    run_step(rec, t, step=2, tokens=5)  # a plain int (no attention mask): no read at all
    run_step(rec, t, step=3, tokens=torch.tensor(7))
    reads: list[int] = []
    real_tolist = torch.Tensor.tolist

    def counting_tolist(self):
        reads.append(self.numel())
        return real_tolist(self)

    def no_single_read(self, *args):
        raise AssertionError("one device-to-host read per tensor")

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    for name in ("__int__", "__index__", "item"):
        monkeypatch.setattr(torch.Tensor, name, no_single_read)
    steps = rec.resolve()
    assert [s.tokens for s in steps] == [26, 10, 14]
    assert reads == [4]  # the four micro-batch tensors of steps 1 and 3, in one copy


def test_a_step_whose_batches_bypass_the_timed_loader_has_no_load_time():
    """Resuming mid-epoch the Trainer iterates a skip_first_batches copy that was never instrumented."""
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t), loader_timed=True)
    rec.boundary()
    run_step(rec, t, step=1)  # batches from the uninstrumented copy: no add_load_time call
    rec.add_load_time(0.0)  # the instrumented loader again (next epoch), too fast to measure
    run_step(rec, t, step=2)
    rec.add_load_time(0.25)
    rec.add_load_time(0.125)
    run_step(rec, t, step=3)
    assert [s.data_load_s for s in rec.resolve()] == [None, 0.0, 0.375]


def test_a_rank_whose_batches_another_rank_loads_loads_nothing_itself():
    """accelerate's dispatch_batches (the default for an IterableDataset): rank 0 loads every rank's batches and
    broadcasts them; the others never call the loader's next(). Their data wait (0.5 ms here) is a wait for rank 0:
    no loading of theirs, so not in the pre-sync time compared across ranks (it was all of it: a trial's rank 1 "held
    the others back: its data loading", 8.8 ms more per step, on a run where rank 0 did the loading)."""
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t), loader_timed=True, loads_elsewhere=True)
    rec.boundary()
    run_step(rec, t, step=1)
    (s,) = rec.resolve()
    assert s.data_s == pytest.approx(0.5) and s.data_load_s == 0.0 and s.pre_sync_data_s == 0.0
    assert s.pre_sync_s == pytest.approx(2 * 1.0 + 2 * 2.0)


def test_only_accelerate_s_dispatcher_off_rank_0_loads_elsewhere():
    from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
    from torch.utils.data import DataLoader

    from hf_distprof.timing.instrument import loads_elsewhere

    data = list(range(8))
    dispatcher = DataLoaderDispatcher(data, batch_size=2)
    assert [loads_elsewhere(dispatcher, r) for r in (0, 1)] == [False, True]
    for loader in (DataLoaderShard(data, batch_size=2), DataLoader(data, batch_size=2)):
        assert [loads_elsewhere(loader, r) for r in (0, 1)] == [False, False]


def test_a_dying_run_s_finished_steps_are_read_without_waiting_though_their_tokens_are_on_the_device():
    # At exit (training died) the step timer reads the finished steps without waiting for the device. A step holding
    # its attention mask on the device is kept for the pass that waits, so a GPU run flushed none (a review): the
    # tokens are forgotten first (0), the times read.
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    for step in (1, 2):
        run_step(rec, t, step=step, tokens=torch.ones(4, device="meta"))  # stands for a CUDA mask
    log["device_at"] = t.now  # every event completed
    assert rec.resolve(wait=False) == []
    rec.drop_device_tokens()
    steps = rec.resolve(wait=False)
    assert [s.step for s in steps] == [1, 2] and [s.tokens for s in steps] == [0, 0] and log["sync"] == 0
    assert steps[0].step_s == pytest.approx(0.5 + 2 * 3.25 + 0.125)


def test_boundary_after_logging_excludes_logging_time_from_the_next_data_wait():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    run_step(rec, t, step=1, data=0.5)
    t.advance(7.0)  # on_log: gather, TensorBoard writes...
    rec.boundary()
    run_step(rec, t, step=2, data=0.25)
    first, second = rec.resolve()
    assert first.data_s == pytest.approx(0.5)
    assert second.data_s == pytest.approx(0.25)
    assert second.data_load_s is None and second.pre_sync_s == pytest.approx(0.25 + 2.0 + 4.0)


def test_calls_outside_a_step_are_ignored():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.forward_begin(samples=4, tokens=4)  # evaluation or the comm-overhead probe
    rec.forward_end()
    rec.grad_ready()
    rec.micro_end()
    rec.optimizer_begin()
    rec.optimizer_end()
    rec.step_end(3)
    assert not rec.in_step and rec.pending_steps == 0 and rec.resolve() == []


def test_without_forward_hooks_forward_is_unknown_and_backward_covers_both():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    t.advance(1.0)
    rec.step_begin()
    t.advance(3.0)
    rec.optimizer_begin()
    t.advance(0.5)
    rec.optimizer_end()
    rec.step_end(1)
    (s,) = rec.resolve()
    assert s.forward_s is None and s.backward_compute_s is None
    assert s.backward_s == pytest.approx(3.0) and s.step_s == pytest.approx(4.5)


def test_cuda_path_records_events_and_reads_them_only_on_resolve():
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    for step in (1, 2, 3):
        run_step(rec, t, step=step, params=4)
        # Between logging steps: events recorded, never waited on nor read (no host-device sync).
        assert log["sync"] == 0 and log["read"] == 0
    records_in_3_steps = log["record"]
    first, second, third = rec.resolve()
    assert log["sync"] == 1  # one wait per logging step, on the newest event
    # The first backward only learns the gradient-hook count (4): no per-parameter events on GPU.
    assert first.backward_compute_s is None
    assert second.backward_compute_s == pytest.approx(2 * 2.0)
    assert third.forward_s == pytest.approx(2.0) and third.step_s == pytest.approx(0.5 + 2 * 3.25 + 0.125)
    # begin, 2x(fwd begin, fwd end, one grad event, bwd end), pre_opt shares the last bwd end, opt, end,
    # next boundary: far fewer than one event per gradient hook call (8 per step).
    assert records_in_3_steps <= 3 * (2 + 2 * 4 + 3)


def test_on_a_gpu_the_pre_sync_time_counts_the_loading_only_as_far_as_the_device_waited_for_it():
    """The loader's next() (host, 0.5 s) runs while the device still runs the optimizer's kernels (0.4 s past the
    host's optimizer call): the device waits 0.1 s for the data. Then the Trainer's token-count gather waits 0.3 s on
    the device for a peer's loader (the host blocks on its result). Host loading added to device phases counted the
    0.4 s twice, and the step's wait for its peers (the gather, the 0.25 s all-reduce) came out at 0.15 s; capped at
    the device's whole data wait (0.4 s) it would take the gather for this rank's loading."""
    from hf_distprof.timing.series import step_row

    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock, loader_timed=True)
    rec.boundary()
    for step in (1, 2, 3):
        t.advance(0.5)
        rec.add_load_time(0.5)
        log["busy_until"] = t.now + 0.3  # the token-count gather, waiting for a peer on the device
        t.advance(0.3)
        rec.step_begin()
        rec.forward_begin(samples=4, tokens=16)
        t.advance(1.0)
        rec.forward_end()
        for _ in range(2):
            t.advance(1.0)
            rec.grad_ready()
        t.advance(0.25)  # the gradient all-reduce
        rec.optimizer_begin()
        log["busy_until"] = t.now + 0.525  # the optimizer's kernels: 0.525 s on the device, 0.125 s to launch
        t.advance(0.125)
        rec.optimizer_end()
        rec.step_end(step)
    first, second, third = rec.resolve()
    # The first step's data wait starts at the boundary, with the device idle: all of the loading was waited for.
    assert (first.data_load_s, first.loader_wait_s, first.pre_sync_data_s) == (0.5, pytest.approx(0.5),
                                                                               pytest.approx(0.5))
    for timing in (second, third):
        assert (timing.data_load_s, timing.data_s, timing.loader_wait_s) == (0.5, pytest.approx(0.4),
                                                                             pytest.approx(0.1))
        assert timing.optimizer_s == pytest.approx(0.525) and timing.step_s == pytest.approx(4.175)
        assert timing.pre_sync_data_s == pytest.approx(0.1)
        assert timing.pre_sync_s == pytest.approx(0.1 + 1.0 + 2.0)
        assert timing.wait_s == pytest.approx(0.3 + 0.25)
        row = timing.to_json()
        assert "device_timed" not in row and "loader_wait_s" not in row and row["pre_sync_s"] == pytest.approx(3.1)
        # What the live verdict weighs: the data part and the compute part apart.
        assert step_row(timing, host_timed=False)[4:8] == [pytest.approx(3.1), 0.0, pytest.approx(0.1),
                                                          pytest.approx(3.0)]
    # Without the loader's event (a timing made elsewhere) the cap is the device's whole data wait.
    assert dataclasses.replace(second, loader_wait_s=None).pre_sync_data_s == pytest.approx(0.4)
    # On the CPU's clock the loading is host time like every phase: all of it counts.
    cpu = StepRecorder(FakeCpuClock(t), loader_timed=True)
    cpu.boundary()
    t.advance(0.5)
    cpu.add_load_time(0.5)
    cpu.step_begin()
    cpu.optimizer_begin()
    cpu.optimizer_end()
    cpu.step_end(1)
    (only,) = cpu.resolve()
    assert (only.pre_sync_data_s, only.pre_sync_s) == (0.5, 0.5)


def test_cuda_events_are_pooled_across_logging_windows():
    t = Timeline()
    clock, _ = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    FakeEvent.created = 0
    for window in range(5):
        for step in range(3):
            run_step(rec, t, step=window * 3 + step + 1)
        rec.resolve()
        rec.boundary()
        if window == 1:
            created_after_two_windows = FakeEvent.created
    assert FakeEvent.created == created_after_two_windows  # steady state allocates no new events


def test_cuda_path_drops_backward_compute_when_the_graph_changes():
    t = Timeline()
    clock, _ = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    run_step(rec, t, step=1, micro=1, params=4)  # learns 4
    run_step(rec, t, step=2, micro=1, params=4)
    run_step(rec, t, step=3, micro=1, params=6)  # two more parameters got gradients: the 4th was not last
    run_step(rec, t, step=4, micro=1, params=6)  # learned 6
    s1, s2, s3, s4 = rec.resolve()
    assert s1.backward_compute_s is None and s3.backward_compute_s is None
    assert s2.backward_compute_s == pytest.approx(2.0) and s4.backward_compute_s == pytest.approx(2.0)


def test_cuda_event_clock_converts_milliseconds_and_recycles():
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    a = clock.mark()
    t.advance(0.25)
    b = clock.mark()
    clock.wait(b)
    assert clock.elapsed(a, b) == pytest.approx(0.25)
    clock.release([a, b])
    assert {id(clock.mark()), id(clock.mark())} == {id(a), id(b)}
    assert log["record"] == 4


def test_default_clock_is_perf_counter_on_cpu():
    assert isinstance(default_clock(torch.device("cpu")), CpuClock)
    assert isinstance(default_clock(torch.device("cuda", 0)), CudaEventClock)  # construction needs no GPU


@pytest.mark.gpu
def test_real_cuda_events_time_a_step():
    t_rec = StepRecorder(default_clock(torch.device("cuda", 0)))
    x = torch.randn(2048, 2048, device="cuda")
    t_rec.boundary()
    t_rec.step_begin()
    t_rec.forward_begin(samples=1, tokens=torch.ones(4, device="cuda").sum())
    y = x @ x
    t_rec.forward_end()
    t_rec.optimizer_begin()
    t_rec.optimizer_end()
    t_rec.step_end(1)
    (s,) = t_rec.resolve()
    assert y.shape == x.shape and s.forward_s is not None and s.forward_s > 0 and s.tokens == 4


class FakeRunQueue:
    """Run-queue seconds that advance only when the test says so (the thread waited for a CPU)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def raw(self) -> float:
        self.reads += 1
        return self.now

    def seconds(self, raw: float) -> float:
        return raw


def test_cpu_wait_counts_from_the_data_wait_to_the_optimizer_and_own_work_loses_only_the_pre_sync_part():
    t, rq = Timeline(), FakeRunQueue()
    rec = StepRecorder(FakeCpuClock(t), loader_timed=True, run_queue=rq)
    rec.boundary()
    rec.fetch_begin()
    rq.now += 0.25  # waited inside the loader's next()
    rec.add_load_time(0.375)
    rq.now += 0.5  # waited on waking from the token all-gather: in the data wait, in no pre-sync phase
    rec.step_begin()
    rec.forward_begin(samples=4)
    t.advance(1.0)
    rq.now += 0.125  # during the forward
    rec.forward_end()
    t.advance(2.0)
    rq.now += 0.0625  # during the backward compute
    rec.grad_ready()
    rq.now += 1.0  # on waking from the gradient all-reduce: after the last gradient, not counted as own work
    rec.optimizer_begin()
    rq.now += 4.0  # during the optimizer: not counted
    rec.optimizer_end()
    rec.step_end(1)
    (s,) = rec.resolve()
    assert s.cpu_wait_s == pytest.approx(0.25 + 0.5 + 0.125 + 0.0625 + 1.0)
    assert s.pre_sync_cpu_wait_s == pytest.approx(0.25 + 0.125 + 0.0625)
    assert s.pre_sync_s == pytest.approx(0.375 + 1.0 + 2.0)
    assert s.own_work_s == pytest.approx(3.375 - 0.4375) and s.to_json()["pre_sync_cpu_wait_s"] == pytest.approx(0.4375)
    # Reads: the loader's next() (2: the first is also the data wait's start), forward begin and end (the last
    # gradient's reading is not assured yet), the last gradient (learned on this first backward: read at every call
    # until then), pre_opt. Not at the boundaries nor at step begin: with a timed loader its reading says it.
    assert rq.reads == 6
    # The wait never makes own work negative, and an unknown wait takes nothing out.
    assert dataclasses.replace(s, pre_sync_cpu_wait_s=99.0).own_work_s == 0.0
    assert dataclasses.replace(s, pre_sync_cpu_wait_s=None, cpu_wait_s=None).own_work_s == s.pre_sync_s
    # Without the pre-sync part (a loader timed without fetch_begin), the whole wait is taken out, as before.
    assert dataclasses.replace(s, pre_sync_cpu_wait_s=None).own_work_s == pytest.approx(3.375 - 1.9375)


def test_the_pre_sync_wait_reads_the_run_queue_once_per_backward_and_falls_back_when_the_graph_shrinks():
    t, rq = Timeline(), FakeRunQueue()
    rec = StepRecorder(FakeCpuClock(t), run_queue=rq)
    rec.boundary()

    def step(number: int, grads: int) -> int:
        rec.step_begin()
        rec.forward_begin(samples=1)
        rq.now += 0.125
        t.advance(2.0)
        rec.forward_end()
        before = rq.reads
        for _ in range(grads):
            rq.now += 0.25
            rec.grad_ready()
        hook_reads = rq.reads - before
        rq.now += 1.0  # the all-reduce's tail
        rec.optimizer_begin()
        rec.optimizer_end()
        rec.step_end(number)
        return hook_reads

    assert step(1, 3) == 3  # the count is learned on the first backward
    assert step(2, 3) == 1  # then one read, at the last gradient
    assert step(3, 4) == 2  # a larger graph: read from the learned count on
    assert step(4, 2) == 0  # a smaller one: no read at its last gradient
    first, second, larger, smaller = rec.resolve()
    # The loader not timed: the data phase is the whole data wait, here without any wait.
    assert first.pre_sync_cpu_wait_s == pytest.approx(0.125 + 0.75)
    assert second.pre_sync_cpu_wait_s == pytest.approx(0.125 + 0.75)
    assert larger.pre_sync_cpu_wait_s == pytest.approx(0.125 + 1.0)
    assert smaller.pre_sync_cpu_wait_s is None and smaller.own_work_s == pytest.approx(2.0 - 1.625)
    # The whole wait still holds the all-reduce's tail.
    assert [s.cpu_wait_s for s in (first, second, larger, smaller)] == pytest.approx([1.875, 1.875, 2.125, 1.625])


def test_without_a_run_queue_clock_the_wait_is_unknown():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    run_step(rec, t, step=1)
    (s,) = rec.resolve()
    assert s.cpu_wait_s is None and s.own_work_s == s.pre_sync_s


def test_run_queue_clock_reads_the_second_schedstat_field_and_gives_up_on_a_bad_file(tmp_path):
    stat = tmp_path / "schedstat"
    stat.write_text("123456789 2500000000 77\n")
    clock = RunQueueClock(str(stat))
    assert clock.read() == 2.5
    stat.write_text("123456789 3750000000 78\n")  # the same open file, read again from offset 0
    assert clock.read() == 3.75
    clock.close()
    bad = RunQueueClock(str(tmp_path / "missing"))
    assert bad.read() is None and bad.read() is None
    garbled = tmp_path / "garbled"
    garbled.write_text("x\n")
    assert RunQueueClock(str(garbled)).read() is None
    assert waited(1.0, 1.5) == 0.5 and waited(None, 1.0) is None and waited(2.0, 1.0) is None


@pytest.mark.skipif(not os.path.exists(SCHEDSTAT), reason="no /proc/thread-self/schedstat (not Linux or no schedstats)")
def test_the_real_schedstat_is_this_threads_and_grows():
    clock = RunQueueClock()
    first = clock.read()
    assert first is not None and first >= 0.0
    seen: list[float | None] = []
    worker = threading.Thread(target=lambda: seen.append(RunQueueClock().read()))
    worker.start()
    worker.join()
    assert seen[0] is not None and seen[0] < first + 1.0  # a new thread's own, small count
    assert clock.read() >= first


def _cpu_ns(raw: bytes | None) -> int:
    assert raw is not None
    return int(raw.split()[0])


@pytest.mark.skipif(not os.path.exists(SCHEDSTAT), reason="no /proc/thread-self/schedstat (not Linux or no schedstats)")
def test_a_thread_that_reuses_an_ended_readers_id_reads_its_own_file_and_nothing_gives_up():
    # The first reader is served by its thread id; threads reuse ids once theirs ended (glibc recycles their stacks).
    clock = RunQueueClock()
    idents: list[int] = []
    seen: list[bytes | None] = []

    def read() -> None:
        idents.append(threading.get_ident())
        seen.append(clock.raw())

    for _ in range(20):  # until a new thread gets the first reader's id
        worker = threading.Thread(target=read)
        worker.start()
        worker.join()
        if idents.count(idents[0]) > 1:
            break
    if idents.count(idents[0]) == 1:
        pytest.skip("no thread id was reused here")
    assert all(raw is not None for raw in seen) and not clock._broken
    busy = sum(range(2_000_000))  # this thread's CPU time grows past any short-lived thread's
    assert busy and _cpu_ns(clock.raw()) > max(_cpu_ns(raw) for raw in seen)


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.exists(SCHEDSTAT), reason="no fork or no schedstat here")
def test_a_forked_child_reads_its_own_threads_file_not_the_parents():
    clock = RunQueueClock()
    sum(range(2_000_000))
    parent = _cpu_ns(clock.raw())  # this thread is the clock's first reader
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same thread id, another process
        try:
            os.write(write, str(_cpu_ns(clock.raw())).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    assert child < parent  # the child's thread has just started; the parent's file would say at least `parent`


def test_steps_whose_events_have_completed_are_read_before_the_one_wait():
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    for step in (1, 2, 3):
        run_step(rec, t, step=step, micro=1)
        if step == 2:
            log["device_at"] = t.now  # the GPU has finished step 2 when the host ends step 3
    early = rec.resolve(wait=False)
    assert [s.step for s in early] == [1, 2] and log["sync"] == 0 and rec.pending_steps == 1
    assert rec.resolve(wait=False) == []  # step 3 is still running on the device: no wait without asking
    (last,) = rec.resolve()
    assert last.step == 3 and log["sync"] == 1
    assert last.step_s == pytest.approx(0.5 + 3.25 + 0.125)


def test_on_a_gpu_the_run_queue_is_read_twice_per_step_for_the_whole_wait_only():
    t, rq = Timeline(), FakeRunQueue()
    clock, _ = fake_cuda_clock(t)
    rec = StepRecorder(clock, loader_timed=True, run_queue=rq)
    rec.boundary()
    for step in (1, 2):
        rec.fetch_begin()
        rq.now += 0.25
        rec.add_load_time(0.375)
        run_step(rec, t, step=step, micro=1, params=3)
    assert rq.reads == 4  # the first fetch (the data wait's start) and pre_opt, per step
    steps = rec.resolve()
    assert [s.cpu_wait_s for s in steps] == [0.25, 0.25]
    assert [s.pre_sync_cpu_wait_s for s in steps] == [None, None]  # device-time phases: no host wait inside them


def test_attention_masks_are_summed_on_resolve_and_folded_when_many_are_held(monkeypatch):
    from hf_distprof.timing import recorder as recorder_module

    monkeypatch.setattr(recorder_module, "TOKEN_TENSORS_HELD", 3)
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[1, 1, 1]], dtype=torch.bool)]
    for step in range(1, 4):  # 2 micro-batches each: 6 masks, folded once more than 3 are held
        run_step(rec, t, step=step, micro=2, tokens=masks[0])
        rec_tokens = [tok for m in rec._pending for tok in m.tokens]
        if step == 2:
            assert all(tok.dim() == 0 for tok in rec_tokens)  # folded into sums: the masks are no longer held
        if step == 3:
            assert [tok.dim() for tok in rec_tokens] == [0, 0, 0, 0, 2, 2]  # step 3's masks: not over 3 yet
    run_step(rec, t, step=4, micro=2, tokens=masks[1])
    assert [s.tokens for s in rec.resolve()] == [6, 6, 6, 6]


def test_step_slots_are_reused_after_resolve():
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    run_step(rec, t, step=1)
    first_slot = rec._pending[0]
    rec.resolve()
    run_step(rec, t, step=2)
    assert rec._pending[0] is first_slot
    (s,) = rec.resolve()
    assert s.step == 2 and s.micro_batches == 2 and s.samples == 8 and s.tokens == 32


def test_no_cuda_event_goes_back_to_the_pool_twice_and_every_window_times_right():
    # A step's end is also the next step's data-wait start: resolving both must release it once. An event in the pool
    # twice would be handed to two later marks, and the second record would overwrite the first one's time.
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    log["device_at"] = float("inf")  # the device keeps up: the no-wait pass reads the steps too
    for window in range(4):
        for step in range(3):
            run_step(rec, t, step=window * 3 + step + 1, micro=2, params=3)
        first = rec.resolve(wait=False)
        rest = rec.resolve()
        steps = first + rest
        assert len(steps) == 3
        pool = clock._pool
        assert len(pool) == len({id(e) for e in pool}), f"window {window}: an event is in the pool twice"
        # data 0.5 + 2 x (fwd 1 + bwd 2 + sync 0.25) + opt 0.125, every step, every window
        assert [s.step_s for s in steps] == pytest.approx([7.125] * 3)
        assert [s.data_s for s in steps[1:]] == pytest.approx([0.5] * 2)


def test_the_loaders_events_go_back_to_the_pool_once_and_none_leaks():
    # On a GPU every timed next() records an event (the last one's counts): the earlier ones, and the last once its step
    # is read, go back to the pool, each once; a steady state allocates no new event.
    t = Timeline()
    clock, log = fake_cuda_clock(t)
    rec = StepRecorder(clock, loader_timed=True)
    rec.boundary()
    log["device_at"] = float("inf")
    created = []
    for window in range(4):
        for step in range(3):
            run_step(rec, t, step=window * 3 + step + 1, micro=2, params=3, loads=2)
        steps = rec.resolve()
        pool = clock._pool
        assert len(pool) == len({id(e) for e in pool}), f"window {window}: an event is in the pool twice"
        assert [s.loader_wait_s for s in steps] == pytest.approx([0.5] * 3)
        created.append(FakeEvent.created)
    assert created[-1] == created[-2]


def test_an_abandoned_step_gives_each_of_its_events_back_once():
    t = Timeline()
    clock, _ = fake_cuda_clock(t)
    rec = StepRecorder(clock)
    rec.boundary()
    rec.step_begin()
    rec.forward_begin(samples=1)
    rec.forward_end()
    rec.optimizer_begin()  # pre_opt also closes the micro-batch: one event in two places
    rec.step_begin()  # the first step never ended
    assert len(clock._pool) == len({id(e) for e in clock._pool})


def test_device_masks_of_several_shapes_and_dtypes_are_counted_in_one_read(monkeypatch):
    """Each mask counted on its device (no copy of the masks), the counts read in one copy, and each step gets its own
    tokens (empty masks, bool masks and masks padded to other lengths included)."""
    as_if_on_a_device(monkeypatch)
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    masks = [
        [torch.ones(2, 4, dtype=torch.int64), torch.tensor([[1, 1, 0, 0]] * 2)],  # 8 + 4
        [torch.ones(3, 5, dtype=torch.bool)],  # 15, another shape and dtype
        [torch.zeros(2, 0, dtype=torch.int64), 6],  # an empty mask, and a plain count
        [torch.tensor([[1, 0, 1, 0]] * 2), torch.tensor(9)],  # 4, and a sum folded earlier (0-d)
    ]
    for step, batch in enumerate(masks, start=1):
        run_step(rec, t, step=step, micro=1, tokens=batch[0])
        rec._pending[-1].tokens.extend(batch[1:])  # a second micro-batch's count
    reads: list[int] = []
    real_tolist = torch.Tensor.tolist

    def counting_tolist(self):
        reads.append(self.numel())
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    assert [s.tokens for s in rec.resolve()] == [12, 15, 6, 13]
    assert reads == [6]  # the six tensors' counts, in one copy


@pytest.mark.parametrize("on_device", [False, True])
def test_host_masks_are_counted_without_a_torch_operator_and_as_on_a_device(monkeypatch, on_device):
    """A CPU run's masks are counted through numpy (a torch operator between the model's kernels costs several times
    more); a tensor numpy cannot read (bfloat16) takes the device's path. Both count a mask's non-zero entries, so a
    mask holding 2s (not 0/1) counts the same on either path."""
    if on_device:
        as_if_on_a_device(monkeypatch)
    t = Timeline()
    rec = StepRecorder(FakeCpuClock(t))
    rec.boundary()
    for step, tokens in enumerate([torch.tensor([[1, 1, 0], [2, 0, 0]]), torch.ones(2, 3, dtype=torch.bool),
                                   torch.tensor(7), torch.ones(1, 5, dtype=torch.bfloat16)], start=1):
        run_step(rec, t, step=step, micro=1, tokens=tokens)
    if not on_device:
        calls: list[str] = []
        for name in ("sum", "count_nonzero", "stack"):
            real = getattr(torch, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                calls.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(torch, name, counted)
    assert [s.tokens for s in rec.resolve()] == [3, 6, 7, 5]
    if not on_device:
        assert calls == ["count_nonzero", "stack"]  # the bfloat16 mask alone


class _Args:
    def __init__(self, device):
        self._device = device

    @property
    def device(self):
        if isinstance(self._device, Exception):
            raise self._device
        return self._device


@pytest.mark.parametrize(("device", "params", "expected"), [
    # CPU offload: the shards the callbacks see are on the host, the Trainer computes on its GPU.
    (torch.device("cuda", 1), [torch.zeros(1)], torch.device("cuda", 1)),
    (torch.device("cuda", 0), [], torch.device("cuda", 0)),
    (torch.device("cpu"), [torch.zeros(1)], torch.device("cpu")),
    (torch.device("cpu"), [torch.zeros(1, device="meta")], torch.device("meta")),  # not CUDA: the parameters'
    (RuntimeError("no devices"), [torch.zeros(1, device="meta")], torch.device("meta")),
    (None, [], torch.device("cpu")),
])
def test_the_training_device_is_the_trainer_s_cuda_device_even_when_the_parameters_are_offloaded(
        device, params, expected):
    from hf_distprof.timing.clock import training_device

    assert training_device(_Args(device), params) == expected
    assert training_device(object(), params) == (params[0].device if params else torch.device("cpu"))
