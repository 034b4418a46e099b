"""Turn hook calls into one ``StepTiming`` per optimizer step, without blocking the step.

The callback calls the recorder at each phase boundary of an optimizer step:

``boundary`` (end of the previous step, or of logging/saving after it) -> ``step_begin`` ->
per micro-batch [``forward_begin`` -> ``forward_end`` -> ``grad_ready``... -> ``micro_end``] ->
``optimizer_begin`` (closes the last micro-batch) -> ``optimizer_end`` -> ``step_end``.

Each call only takes a clock mark. Marks are turned into seconds by ``resolve``, which the callback
calls on logging steps only: on GPU that is the one place where the host waits for the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_distprof.timing.clock import Clock, Mark
from hf_distprof.timing.cpu_wait import RunQueueClock, waited


@dataclass
class StepTiming:
    """Phase durations of one optimizer step on one rank, in seconds, summed over micro-batches.

    Attributes:
        step: The optimizer step (``state.global_step`` after the step, so the first is 1).
        data_s: From the end of the previous step (or of the logging/saving after it) to this step's
            start: fetching the batches, plus the Trainer's cross-rank token count, which waits for
            the slowest rank's loader.
        forward_s: Time inside the model's forward. None when the forward hooks did not fire.
        backward_s: From the end of forward to the end of backward, including the DDP/FSDP gradient
            sync and gradient clipping on the last micro-batch.
        optimizer_s: ``optimizer.step()``.
        step_s: The whole step, from where ``data_s`` starts to the step's end.
        data_load_s: Host seconds spent inside the data loader's ``next()``; None when the loader could
            not be instrumented, or the step's batches came from another loader (resuming mid-epoch).
            Unlike ``data_s`` it holds no cross-rank wait.
        backward_compute_s: From the end of forward to the last parameter gradient being ready: the
            backward computation without the wait for the final gradient all-reduce. None when
            gradient hooks did not fire on every micro-batch (FSDP2, a changing graph on GPU).
        micro_batches: Forward passes in the step (the gradient accumulation steps).
        samples: Samples in the step on this rank.
        tokens: Tokens in the step on this rank (non-padding ones when an attention mask was given).
        cpu_wait_s: Seconds the training thread was ready to run but waiting for a CPU (Linux run-queue
            delay) from the start of the data wait to the optimizer step; None where the kernel does not say.
        pre_sync_cpu_wait_s: The part of ``cpu_wait_s`` inside the phases ``pre_sync_s`` counts (the loader's
            ``next()`` calls, each forward and backward compute): what ``own_work_s`` takes out. None when a
            reading is missing; ``own_work_s`` then takes out ``cpu_wait_s``.
    """

    step: int
    data_s: float
    forward_s: float | None
    backward_s: float
    optimizer_s: float
    step_s: float
    data_load_s: float | None = None
    backward_compute_s: float | None = None
    micro_batches: int = 0
    samples: int = 0
    tokens: int = 0
    cpu_wait_s: float | None = None
    pre_sync_cpu_wait_s: float | None = None

    @property
    def pre_sync_s(self) -> float:
        """Time this rank spends on its own work before the gradient sync can complete.

        Data loading + forward + the compute part of backward. Under DDP every rank's ``step_s`` is the
        same, because the fast ranks wait inside the sync for the slow one; this sum is what differs.
        """
        data = self.data_load_s if self.data_load_s is not None else self.data_s
        return data + (self.forward_s or 0.0) + (self.backward_compute_s or 0.0)

    @property
    def own_work_s(self) -> float:
        """``pre_sync_s`` less the time the thread waited for a CPU in it: the work itself, what ranks are compared on.

        A rank whose host has more runnable threads than cores takes longer in wall time for the same work;
        that is the machine's doing, reported as CPU wait, not a slow rank. Only the wait inside the pre-sync
        phases is taken out (``pre_sync_cpu_wait_s``): the wait accrued outside them (on waking from the Trainer's
        token all-gather or from the gradient all-reduce's tail, which the rank that waited there pays) is no
        part of the work. Taken out too, it made the figure's step-to-step noise a median 36% instead of 7% of
        it (2 ranks beside a busy core, load 7-13 on 2 cores), and a collator sleeping a quarter of a step on
        one rank came out "within the noise".
        """
        wait = self.pre_sync_cpu_wait_s if self.pre_sync_cpu_wait_s is not None else self.cpu_wait_s
        return max(0.0, self.pre_sync_s - (wait or 0.0))

    @property
    def own_step_s(self) -> float:
        """``step_s`` less the time the thread waited for a CPU: the step as long as the work made it."""
        return max(0.0, self.step_s - (self.cpu_wait_s or 0.0))

    @property
    def wait_s(self) -> float:
        """Step time not spent on this rank's own work: mostly waiting in collectives for slower ranks."""
        return max(0.0, self.step_s - self.pre_sync_s - self.optimizer_s)

    def to_json(self) -> dict[str, Any]:
        """One ``timing_rank{R}.jsonl`` line: the fixed keys first, then the derived ones."""
        out = dataclasses.asdict(self)
        out["pre_sync_s"] = self.pre_sync_s
        out["wait_s"] = self.wait_s
        return out


@dataclass
class _Micro:
    fwd_begin: Mark = None
    fwd_end: Mark = None
    grad: Mark = None
    bwd_end: Mark = None
    # Run-queue readings (RunQueueClock) at the forward's start and end and at ``grad``; ``grad_calls``: the
    # gradient hook call the ``grad`` reading was taken at (stale when a later call moved ``grad``).
    run_queue_begin: float | None = None
    run_queue_fwd_end: float | None = None
    run_queue_grad: float | None = None
    grad_calls: int = 0


@dataclass
class _Marks:
    prev_end: Mark
    begin: Mark
    load_s: float | None
    micros: list[_Micro] = field(default_factory=list)
    pre_opt: Mark = None
    opt: Mark = None
    end: Mark = None
    step: int = 0
    samples: int = 0
    tokens: list[Any] = field(default_factory=list)  # ints, or 0-d device tensors read on resolve
    run_queue_begin: float | None = None  # RunQueueClock readings at the data wait's start and at pre_opt
    run_queue_end: float | None = None
    run_queue_step: float | None = None  # at step_begin: the end of the data wait
    load_wait: float | None = None  # run-queue seconds inside the loader's next() calls; None: not read

    def all_marks(self) -> list[Mark]:
        marks = [self.prev_end, self.begin, self.pre_opt, self.opt, self.end]
        for m in self.micros:
            marks += [m.fwd_begin, m.fwd_end, m.grad, m.bwd_end]
        return marks


class StepRecorder:
    """Collects phase marks per optimizer step; ``resolve`` turns finished steps into ``StepTiming``.

    Args:
        clock: Where marks come from.
        loader_timed: Whether ``add_load_time`` is fed by an instrumented data loader; when False,
            ``StepTiming.data_load_s`` is None. It is None as well for a step before which the loader
            was never called (its batches came from a loader that is not instrumented).
    """

    def __init__(self, clock: Clock, loader_timed: bool = False, run_queue: RunQueueClock | None = None) -> None:
        self.clock = clock
        self.loader_timed = loader_timed
        self.run_queue = run_queue
        self._prev_end: Mark = None
        self._prev_run_queue: float | None = None
        self._load_s = 0.0
        self._load_calls = 0
        self._load_wait: float | None = 0.0
        self._fetch_run_queue: float | None = None
        self._current: _Marks | None = None
        self._pending: list[_Marks] = []
        self._grad_calls = 0
        # Gradient hook calls per backward, learned on the first micro-batch: on GPU only the call that
        # completes the count records an event (one event per parameter would cost more than the step).
        self._grad_expected: int | None = None
        # The same count for the run-queue reading at the last gradient, on every clock (one read per backward).
        self._grad_learned: int | None = None

    @property
    def in_step(self) -> bool:
        """Whether an optimizer step is open (hooks outside a step, e.g. evaluation, are ignored)."""
        return self._current is not None

    @property
    def pending_steps(self) -> int:
        """Finished steps not yet resolved."""
        return len(self._pending)

    def boundary(self) -> None:
        """Mark where the next step's data wait starts (end of a step, of logging, of saving...)."""
        old = self._prev_end
        self._prev_end = self.clock.mark()
        self._prev_run_queue = self._run_queue()
        if old is not None:
            self.clock.release([old])

    def fetch_begin(self) -> None:
        """The data loader's ``next()`` starts (before the clock it reports to ``add_load_time`` starts)."""
        self._fetch_run_queue = self._run_queue()

    def add_load_time(self, seconds: float) -> None:
        """Add host seconds spent inside the data loader; they count towards the next step.

        With ``fetch_begin`` called before the ``next()``, the thread's wait for a CPU inside it is added too.
        """
        self._load_s += seconds
        self._load_calls += 1
        begin, self._fetch_run_queue = self._fetch_run_queue, None
        wait = waited(begin, self._run_queue())
        self._load_wait = None if wait is None or self._load_wait is None else self._load_wait + wait

    def step_begin(self) -> None:
        """Start an optimizer step."""
        if self._current is not None:  # a step that never ended (exception, skipped hook): drop it
            self.clock.release(self._current.all_marks())
        # No next() on the instrumented loader since the last step: the batches came from another loader
        # (on resume the Trainer iterates a skip_first_batches copy for the rest of the epoch): unknown.
        load = self._load_s if self.loader_timed and self._load_calls else None
        load_wait = self._load_wait if load is not None else None
        self._load_s, self._load_calls, self._load_wait = 0.0, 0, 0.0
        now = self._run_queue()
        waited_from = self._prev_run_queue if self._prev_end is not None else now
        self._current = _Marks(prev_end=self._prev_end, begin=self.clock.mark(), load_s=load,
                               run_queue_begin=waited_from, run_queue_step=now, load_wait=load_wait)
        self._prev_end = None

    def forward_begin(self, samples: int = 0, tokens: Any = 0) -> None:
        """The model's forward starts; ``tokens`` may be an int or a 0-d tensor (read on resolve)."""
        cur = self._current
        if cur is None:
            return
        mark = self.clock.mark()
        if cur.micros and cur.micros[-1].bwd_end is None:
            self._close_micro(cur.micros[-1], mark)
        cur.micros.append(_Micro(fwd_begin=mark, run_queue_begin=self._run_queue()))
        cur.samples += samples
        cur.tokens.append(tokens)
        self._grad_calls = 0

    def forward_end(self) -> None:
        """The model's forward returned."""
        cur = self._current
        if cur is not None and cur.micros and cur.micros[-1].fwd_end is None:
            cur.micros[-1].fwd_end = self.clock.mark()
            cur.micros[-1].run_queue_fwd_end = self._run_queue()

    def grad_ready(self) -> None:
        """One parameter's gradient was accumulated (called from a gradient hook)."""
        cur = self._current
        if cur is None or not cur.micros:
            return
        self._grad_calls += 1
        micro = cur.micros[-1]
        if self.clock.cheap_marks or self._grad_calls == self._grad_expected:
            if micro.grad is not None:
                self.clock.release([micro.grad])
            micro.grad = self.clock.mark()
        # The run queue at the last gradient: read at the call that completes the count learned on the first
        # backward (and at every call until it is learned, or past it), not once per parameter.
        if self.run_queue is not None and (self._grad_learned is None or self._grad_calls >= self._grad_learned):
            micro.run_queue_grad, micro.grad_calls = self._run_queue(), self._grad_calls

    def expect_grads(self, calls: int) -> None:
        """From now on each backward makes ``calls`` gradient-hook calls (the hooks were pruned to the parameter whose
        gradient comes last): the call that completes the count is the backward's end."""
        self._grad_expected = self._grad_learned = calls

    def micro_end(self) -> None:
        """A non-final micro-batch's backward finished (``on_substep_end``)."""
        cur = self._current
        if cur is not None and cur.micros and cur.micros[-1].bwd_end is None:
            self._close_micro(cur.micros[-1], self.clock.mark())

    def optimizer_begin(self) -> None:
        """``on_pre_optimizer_step``: closes the last micro-batch's backward."""
        cur = self._current
        if cur is None:
            return
        cur.pre_opt = self.clock.mark()
        cur.run_queue_end = self._run_queue()
        if cur.micros and cur.micros[-1].bwd_end is None:
            self._close_micro(cur.micros[-1], cur.pre_opt)

    def optimizer_end(self) -> None:
        """``on_optimizer_step``."""
        if self._current is not None:
            self._current.opt = self.clock.mark()

    def step_end(self, step: int) -> None:
        """``on_step_end``: the step is finished and queued for ``resolve``."""
        cur = self._current
        if cur is None:
            return
        cur.end = self.clock.mark()
        cur.step = step
        self._pending.append(cur)
        self._current = None
        self.boundary()

    def _run_queue(self) -> float | None:
        return self.run_queue.read() if self.run_queue is not None else None

    def _close_micro(self, micro: _Micro, mark: Mark) -> None:
        micro.bwd_end = mark
        if micro.grad_calls != self._grad_calls:  # fewer gradients than learned: the reading is not the last one's
            micro.run_queue_grad = None
        self._grad_learned = self._grad_calls or None
        if not self.clock.cheap_marks and self._grad_calls != self._grad_expected:
            # The count changed (first backward, or the graph changed): any event taken is not the last.
            if micro.grad is not None:
                self.clock.release([micro.grad])
                micro.grad = None
            self._grad_expected = self._grad_calls or None
        elif self._grad_calls == 0:
            micro.grad = None

    def resolve(self) -> list[StepTiming]:
        """Turn every finished step into seconds; on GPU this waits for the newest event.

        Returns:
            The finished steps since the last call, oldest first.
        """
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        self.clock.wait(pending[-1].end)
        tokens = _token_counts(pending)
        out = [self._durations(m, n) for m, n in zip(pending, tokens, strict=True)]
        for m in pending:
            self.clock.release(list({id(x): x for x in m.all_marks() if x is not None}.values()))
        return out

    def _durations(self, m: _Marks, tokens: int) -> StepTiming:
        el = self.clock.elapsed
        start = m.prev_end if m.prev_end is not None else m.begin
        forward = backward = compute = 0.0
        complete_fwd = bool(m.micros)
        complete_grad = bool(m.micros)
        for micro in m.micros:
            if micro.fwd_begin is None or micro.fwd_end is None:
                complete_fwd = False
                continue
            forward += el(micro.fwd_begin, micro.fwd_end)
            if micro.bwd_end is not None:
                backward += el(micro.fwd_end, micro.bwd_end)
            if micro.grad is not None:
                compute += el(micro.fwd_end, micro.grad)
            else:
                complete_grad = False
        bwd_stop = m.pre_opt if m.pre_opt is not None else m.end
        if not complete_fwd:
            # Without forward marks forward and backward cannot be told apart: all of it is "backward".
            backward = el(m.begin, bwd_stop)
        return StepTiming(
            step=m.step,
            data_s=el(start, m.begin) if m.prev_end is not None else 0.0,
            forward_s=forward if complete_fwd else None,
            backward_s=backward,
            optimizer_s=el(m.pre_opt, m.opt) if m.pre_opt is not None and m.opt is not None else 0.0,
            step_s=el(start, m.end),
            data_load_s=m.load_s,
            backward_compute_s=compute if complete_fwd and complete_grad else None,
            micro_batches=len(m.micros),
            samples=m.samples,
            tokens=tokens,
            cpu_wait_s=waited(m.run_queue_begin, m.run_queue_end),
            pre_sync_cpu_wait_s=_pre_sync_wait(m, complete_fwd, complete_fwd and complete_grad),
        )


def _pre_sync_wait(m: _Marks, forward: bool, compute: bool) -> float | None:
    """Run-queue seconds inside the phases ``StepTiming.pre_sync_s`` counts; None when a reading is missing.

    The data phase: the loader's ``next()`` calls when the loader was timed, else the whole data wait. Each
    micro-batch: from its forward's start to its last gradient (``compute``), or to its forward's end.
    """
    if m.load_s is not None:
        data = m.load_wait
    else:
        data = waited(m.run_queue_begin, m.run_queue_step) if m.prev_end is not None else 0.0
    if data is None:
        return None
    total = data
    for micro in m.micros if forward else []:
        wait = waited(micro.run_queue_begin, micro.run_queue_grad if compute else micro.run_queue_fwd_end)
        if wait is None:
            return None
        total += wait
    return total


def _token_counts(pending: list[_Marks]) -> list[int]:
    """Tokens of each step: the micro-batch counts left on the device are read in one copy per device.

    One ``int()`` per micro-batch tensor would be one device-to-host sync each.
    """
    counts = [sum(int(t) for t in m.tokens if not isinstance(t, torch.Tensor)) for m in pending]
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, m in enumerate(pending):
        for t in m.tokens:
            if isinstance(t, torch.Tensor):
                by_device.setdefault(t.device, []).append((i, t))
    for items in by_device.values():
        values = torch.stack([t.reshape(()).to(torch.int64) for _, t in items]).tolist()
        for (i, _), value in zip(items, values, strict=True):
            counts[i] += value
    return counts
