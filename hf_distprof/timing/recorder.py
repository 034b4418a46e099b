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
from dataclasses import dataclass
from typing import Any

import torch

from hf_distprof.timing.tokens import grouped_counts, token_counts
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
        device_timed: Whether the phases are device time (CUDA events) while ``data_load_s`` is host time: then
            ``pre_sync_s`` counts the loading only as far as the device waited for it (not a ``jsonl`` key).
        loader_wait_s: On a GPU, the device's time from the previous step's end to the end of the loader's last
            ``next()`` (an event recorded there): how long the device waited for the loading, without the Trainer's
            token-count gather after it, which waits for the slowest rank's loader. None elsewhere (not a ``jsonl``
            key).
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
    device_timed: bool = False
    loader_wait_s: float | None = None

    @property
    def pre_sync_s(self) -> float:
        """Time this rank spends on its own work before the gradient sync can complete.

        Data loading + forward + the compute part of backward. Under DDP every rank's ``step_s`` is the
        same, because the fast ranks wait inside the sync for the slow one; this sum is what differs.

        On a GPU the loader's ``next()`` runs on the host while the device may still be busy with the previous
        step's queued work: only the part of it the device waited for is the rank's. That is at most the device's
        own data wait (``data_s``, between the previous step's end and this step's start on the device): a loader the
        device hid entirely adds nothing, rather than its host seconds added to device seconds (which counted the
        overlap twice and made a rank with a slow but hidden loader the slow rank).
        """
        return self.pre_sync_data_s + (self.forward_s or 0.0) + (self.backward_compute_s or 0.0)

    @property
    def pre_sync_data_s(self) -> float:
        """The data loading ``pre_sync_s`` counts: ``data_load_s`` (``data_s`` without it); on a GPU at most the
        device's wait for it (``loader_wait_s``, else ``data_s``, which also holds the token-count gather)."""
        if self.data_load_s is None:
            return self.data_s
        if not self.device_timed:
            return self.data_load_s
        return min(self.data_load_s, self.loader_wait_s if self.loader_wait_s is not None else self.data_s)

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
        """One ``timing_rank{R}.jsonl`` line: the fixed keys first, then the derived ones. (Every field is a number or
        None: ``dataclasses.asdict``'s deep copy of each would only cost, on every logging step.)"""
        out = {key: getattr(self, key) for key in _TIMING_FIELDS}
        out["pre_sync_s"] = self.pre_sync_s
        out["wait_s"] = self.wait_s
        return out


_NOT_WRITTEN = ("device_timed", "loader_wait_s")
_TIMING_FIELDS = tuple(f.name for f in dataclasses.fields(StepTiming) if f.name not in _NOT_WRITTEN)


class _Micro:
    """One micro-batch's marks; recycled (:class:`StepRecorder` keeps a free list), so a step allocates nothing."""

    __slots__ = ("fwd_begin", "fwd_end", "grad", "bwd_end", "run_queue_begin", "run_queue_fwd_end", "run_queue_grad",
                 "grad_calls")

    def __init__(self) -> None:
        self.reset(None, None)

    def reset(self, fwd_begin: Mark, run_queue_begin: Any) -> None:
        self.fwd_begin = fwd_begin
        self.fwd_end: Mark = None
        self.grad: Mark = None
        self.bwd_end: Mark = None
        # Raw run-queue readings (RunQueueClock.raw) at the forward's start and end and at ``grad``; ``grad_calls``:
        # the gradient hook call the ``grad`` reading was taken at (stale when a later call moved ``grad``).
        self.run_queue_begin = run_queue_begin
        self.run_queue_fwd_end: Any = None
        self.run_queue_grad: Any = None
        self.grad_calls = 0


class _Marks:
    """One optimizer step's marks; recycled like :class:`_Micro`."""

    __slots__ = ("prev_end", "begin", "load_s", "micros", "pre_opt", "opt", "end", "step", "samples", "tokens",
                 "run_queue_begin", "run_queue_end", "run_queue_step", "load_waits", "load_end")

    def __init__(self) -> None:
        self.micros: list[_Micro] = []
        self.tokens: list[Any] = []  # ints, or tensors (masks) counted on resolve
        self.load_waits: list[Any] = []  # raw run-queue readings around each loader next(): begin, end, begin, ...

    def reset(self, prev_end: Mark, begin: Mark, load_s: float | None) -> None:
        self.prev_end, self.begin, self.load_s = prev_end, begin, load_s
        self.load_end: Mark = None  # on a GPU: the loader's last next() returned (an event)
        self.micros.clear()
        self.tokens.clear()
        self.pre_opt: Mark = None
        self.opt: Mark = None
        self.end: Mark = None
        self.step = 0
        self.samples = 0
        # Raw run-queue readings at the data wait's start, at pre_opt and at step_begin (the end of the data wait).
        self.run_queue_begin: Any = None
        self.run_queue_end: Any = None
        self.run_queue_step: Any = None

    def all_marks(self) -> list[Mark]:
        marks = [self.prev_end, self.begin, self.pre_opt, self.opt, self.end, self.load_end]
        for m in self.micros:
            marks += [m.fwd_begin, m.fwd_end, m.grad, m.bwd_end]
        return marks


# Device tensors of token counts (attention masks) a recorder holds; past this many they are counted (a small kernel
# each, no sync) into 0-d tensors, so that a rare logging step cannot pile up the batches' masks.
TOKEN_TENSORS_HELD = 32


class StepRecorder:
    """Collects phase marks per optimizer step; ``resolve`` turns finished steps into ``StepTiming``.

    Per step it only stamps: clock marks (floats on CPU, CUDA events on a GPU), raw run-queue readings, the batch's
    sizes, into step slots reused from a free list. Everything else (seconds, token sums, the run-queue arithmetic)
    waits for ``resolve``, on logging steps.

    Args:
        clock: Where marks come from.
        loader_timed: Whether ``add_load_time`` is fed by an instrumented data loader; when False,
            ``StepTiming.data_load_s`` is None. It is None as well for a step before which the loader
            was never called (its batches came from a loader that is not instrumented), unless ``loads_elsewhere``.
        loads_elsewhere: Another rank loads this rank's batches (accelerate's ``dispatch_batches``: rank 0 loads
            every rank's and broadcasts them): a step without a ``next()`` on the loader loaded nothing itself
            (``data_load_s`` 0), and its data wait is a wait for that rank.
        run_queue: The thread's run-queue clock (:class:`~hf_distprof.timing.cpu_wait.RunQueueClock`), or None.
            On host-timed phases (CPU, ``clock.cheap_marks``) it is read around each pre-sync phase, for
            ``pre_sync_cpu_wait_s``; on a GPU only at the data wait's start and before the optimizer, for
            ``cpu_wait_s`` (the phases are device time: a host thread's wait is in none of them).
    """

    def __init__(self, clock: Clock, loader_timed: bool = False, run_queue: RunQueueClock | None = None,
                 loads_elsewhere: bool = False) -> None:
        self.clock = clock
        self.loader_timed = loader_timed
        self.loads_elsewhere = loads_elsewhere
        self.run_queue = run_queue
        # Bound once: the hooks below run on every phase of every step, where each lookup costs.
        self._mark = clock.mark
        self._raw = run_queue.raw if run_queue is not None else _no_reading
        self._cheap = bool(clock.cheap_marks)
        self._phase_waits = self._cheap and run_queue is not None
        self._prev_end: Mark = None
        self._prev_end_owned = False  # the boundary's own mark (else it is the previous step's end, still pending)
        self._prev_run_queue: Any = None
        self._load_s = 0.0
        self._load_calls = 0
        self._load_waits: list[Any] = []
        self._first_fetch: Any = None  # the run queue at the first loader next() since the last step began
        self._load_end: Mark = None  # on a GPU: an event at the end of the last loader next() since the last step
        self._current: _Marks | None = None
        self._pending: list[_Marks] = []
        self._free: list[_Marks] = []
        self._free_micros: list[_Micro] = []
        self._token_tensors = 0  # device tensors held in pending steps' token lists
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
        old, owned = self._prev_end, self._prev_end_owned
        self._prev_end, self._prev_end_owned = self._mark(), True
        # With a timed loader the data wait's run-queue reading is its first next()'s (the step's first fetch).
        self._prev_run_queue = self._raw() if not self.loader_timed else None
        self._first_fetch = None
        # The previous step's end, once that step is resolved (no longer pending), is no one's either.
        if old is not None and (owned or not any(m.end is old for m in self._pending)):
            self.clock.release([old])

    def fetch_begin(self) -> None:
        """The data loader's ``next()`` starts (before the clock it reports to ``add_load_time`` starts)."""
        if self._phase_waits:
            reading = self._raw()
            self._load_waits.append(reading)
            if self._first_fetch is None:
                self._first_fetch = reading
        elif self._first_fetch is None and self.run_queue is not None:
            self._first_fetch = self._raw()

    def add_load_time(self, seconds: float) -> None:
        """Add host seconds spent inside the data loader; they count towards the next step.

        With ``fetch_begin`` called before the ``next()``, the thread's wait for a CPU inside it is added too.
        """
        self._load_s += seconds
        self._load_calls += 1
        if not self._cheap:  # on a GPU: where the device's wait for the loading ends (the last call's end counts)
            old, self._load_end = self._load_end, self._mark()
            if old is not None:
                self.clock.release([old])
        if self._phase_waits:
            if len(self._load_waits) % 2:  # its fetch_begin was read: close the pair
                self._load_waits.append(self._raw())
            else:  # a next() timed without fetch_begin: the wait inside it is unknown
                self._load_waits += (None, None)

    def step_begin(self) -> None:
        """Start an optimizer step."""
        if self._current is not None:  # a step that never ended (exception, skipped hook): drop it
            self._abandon(self._current)
        # No next() on the instrumented loader since the last step: the batches came from another loader
        # (on resume the Trainer iterates a skip_first_batches copy for the rest of the epoch): unknown.
        load = self._load_s if self.loader_timed and (self._load_calls or self.loads_elsewhere) else None
        slot = self._free.pop() if self._free else _Marks()
        slot.reset(self._prev_end, self._mark(), load)
        if self._load_end is not None:
            if load is not None:
                slot.load_end = self._load_end
            else:
                self.clock.release([self._load_end])
            self._load_end = None
        slot.load_waits, self._load_waits = self._load_waits, slot.load_waits
        self._load_waits.clear()
        if self.run_queue is not None:
            if load is not None and self._first_fetch is not None:
                slot.run_queue_begin = slot.run_queue_step = self._first_fetch  # the loader's waits say the data's
            else:
                now = self._raw()
                slot.run_queue_step = now
                slot.run_queue_begin = self._prev_run_queue if self._prev_end is not None and \
                    self._prev_run_queue is not None else now
                if load is None:
                    slot.load_waits.clear()
        self._load_s, self._load_calls, self._first_fetch = 0.0, 0, None
        self._current = slot
        self._prev_end, self._prev_end_owned = None, False

    def forward_begin(self, samples: int = 0, tokens: Any = 0) -> None:
        """The model's forward starts; ``tokens`` may be an int or a device tensor whose sum is the count (the
        attention mask: its non-zero entries counted on resolve, or folded into a 0-d count when many are held)."""
        cur = self._current
        if cur is None:
            return
        mark = self._mark()
        micros = cur.micros
        if micros and micros[-1].bwd_end is None:
            self._close_micro(micros[-1], mark)
        micro = self._free_micros.pop() if self._free_micros else _Micro()
        micro.reset(mark, self._raw() if self._phase_waits else None)
        micros.append(micro)
        cur.samples += samples
        cur.tokens.append(tokens)
        if type(tokens) is not int and isinstance(tokens, torch.Tensor) and tokens.dim() > 0:
            self._token_tensors += 1
        self._grad_calls = 0

    def forward_end(self) -> None:
        """The model's forward returned."""
        cur = self._current
        if cur is not None and cur.micros and cur.micros[-1].fwd_end is None:
            micro = cur.micros[-1]
            micro.fwd_end = self._mark()
            # Read only while the last gradient's reading (which supersedes it) is not assured.
            if self._phase_waits and self._grad_learned is None:
                micro.run_queue_fwd_end = self._raw()

    def grad_ready(self) -> None:
        """One parameter's gradient was accumulated (called from a gradient hook)."""
        cur = self._current
        if cur is None or not cur.micros:
            return
        calls = self._grad_calls = self._grad_calls + 1
        micro = cur.micros[-1]
        if self._cheap:
            micro.grad = self._mark()  # a float: nothing to give back
        elif calls == self._grad_expected:
            if micro.grad is not None:
                self.clock.release([micro.grad])
            micro.grad = self._mark()
        # The run queue at the last gradient: read at the call that completes the count learned on the first
        # backward (and at every call until it is learned, or past it), not once per parameter.
        if self._phase_waits and (self._grad_learned is None or calls >= self._grad_learned):
            micro.run_queue_grad, micro.grad_calls = self._raw(), calls

    def expect_grads(self, calls: int) -> None:
        """From now on each backward makes ``calls`` gradient-hook calls (the hooks were pruned to the parameter whose
        gradient comes last): the call that completes the count is the backward's end."""
        self._grad_expected = self._grad_learned = calls

    def micro_end(self) -> None:
        """A non-final micro-batch's backward finished (``on_substep_end``)."""
        cur = self._current
        if cur is not None and cur.micros and cur.micros[-1].bwd_end is None:
            self._close_micro(cur.micros[-1], self._mark())

    def optimizer_begin(self) -> None:
        """``on_pre_optimizer_step``: closes the last micro-batch's backward."""
        cur = self._current
        if cur is None:
            return
        cur.pre_opt = self._mark()
        if self.run_queue is not None:
            cur.run_queue_end = self._raw()
        if cur.micros and cur.micros[-1].bwd_end is None:
            self._close_micro(cur.micros[-1], cur.pre_opt)

    def optimizer_end(self) -> None:
        """``on_optimizer_step``."""
        if self._current is not None:
            self._current.opt = self._mark()

    def step_end(self, step: int) -> None:
        """``on_step_end``: the step is finished and queued for ``resolve``. Its end mark is also where the next
        step's data wait starts (until a later ``boundary``): one mark, not two."""
        cur = self._current
        if cur is None:
            return
        cur.end = self._mark()
        cur.step = step
        self._pending.append(cur)
        self._current = None
        old, owned = self._prev_end, self._prev_end_owned
        self._prev_end, self._prev_end_owned = cur.end, False
        self._prev_run_queue = self._raw() if not self.loader_timed and self.run_queue is not None else None
        self._first_fetch = None
        if old is not None and owned:
            self.clock.release([old])
        if self._token_tensors > TOKEN_TENSORS_HELD:
            try:
                self._fold_tokens()
            except Exception:  # noqa: BLE001 - out of device memory, say: those steps' token counts are lost, not the run
                for m in self._pending:
                    m.tokens[:] = [t if not isinstance(t, torch.Tensor) or t.dim() == 0 else 0 for t in m.tokens]
                self._token_tensors = 0

    def _close_micro(self, micro: _Micro, mark: Mark) -> None:
        micro.bwd_end = mark
        if micro.grad_calls != self._grad_calls:  # fewer gradients than learned: the reading is not the last one's
            micro.run_queue_grad = None
        self._grad_learned = self._grad_calls or None
        if not self._cheap and self._grad_calls != self._grad_expected:
            # The count changed (first backward, or the graph changed): any event taken is not the last.
            if micro.grad is not None:
                self.clock.release([micro.grad])
                micro.grad = None
            self._grad_expected = self._grad_calls or None
        elif self._grad_calls == 0:
            micro.grad = None

    def _abandon(self, m: _Marks) -> None:
        """Drop a step that never ended; its ``prev_end`` may still be a pending step's end: not released."""
        marks = {id(x): x for x in m.all_marks()[1:] if x is not None and x is not m.prev_end}
        self.clock.release(list(marks.values()))  # once each: pre_opt or a micro's fwd_begin may close another
        self._token_tensors -= sum(isinstance(t, torch.Tensor) and t.dim() > 0 for t in m.tokens)
        self._recycle(m)

    def _recycle(self, m: _Marks) -> None:
        self._free_micros.extend(m.micros)
        m.micros.clear()
        m.tokens.clear()
        self._free.append(m)

    def _fold_tokens(self) -> None:
        """Count the token tensors (masks) held by pending steps into 0-d tensors, without a sync: they no longer hold
        the batches' masks."""
        held = [(m, i, t) for m in self._pending for i, t in enumerate(m.tokens)
                if isinstance(t, torch.Tensor) and t.dim() > 0]
        for indices, sums in grouped_counts([t for *_, t in held]):
            for j, k in enumerate(indices):
                m, i, _ = held[k]
                m.tokens[i] = sums[j]
        self._token_tensors = 0

    def drop_device_tokens(self) -> None:
        """Forget the token counts still on the device (their steps read 0 tokens): counting them waits for the device,
        which a dying run's hung collective may never free, and ``resolve(wait=False)`` keeps a step holding one."""
        for m in self._pending:
            m.tokens[:] = [0 if isinstance(t, torch.Tensor) and t.device.type != "cpu" else t for t in m.tokens]
        self._token_tensors = 0

    def resolve(self, wait: bool = True) -> list[StepTiming]:
        """Turn finished steps into seconds, oldest first. On a GPU the steps whose last event has already completed
        are read first; with ``wait`` the host then waits for the newest event (the one wait of a logging step) and
        reads the rest, else the rest stays pending.

        Returns:
            The finished steps since the last call (those already complete, without ``wait``), oldest first.
        """
        if not self._pending:
            return []
        ready = len(self._pending)
        if not self._cheap:
            ready = 0
            # A step holding token tensors on the device waits for the pass that waits: reading them waits anyway.
            while ready < len(self._pending) and self.clock.ready(self._pending[ready].end) and not any(
                    isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in self._pending[ready].tokens):
                ready += 1
            if wait and ready < len(self._pending):
                self.clock.wait(self._pending[-1].end)
                ready = len(self._pending)
        if not ready:
            return []
        done, self._pending = self._pending[:ready], self._pending[ready:]
        counts = token_counts([m.tokens for m in done])
        self._token_tensors = sum(isinstance(t, torch.Tensor) and t.dim() > 0 for m in self._pending for t in m.tokens)
        out = [self._durations(m, n) for m, n in zip(done, counts, strict=True)]
        if self._cheap:  # floats: nothing to give back
            for m in done:
                self._recycle(m)
            return out
        # Marks a later step still reads: the next step's data wait starts at the last one's end.
        live = {id(self._prev_end)}
        if self._current is not None:
            live.add(id(self._current.prev_end))
        if self._pending:
            live.add(id(self._pending[0].prev_end))
        # One release per mark across the steps read: a step's end is also the next one's data-wait start.
        marks = {id(x): x for m in done for x in m.all_marks() if x is not None}
        self.clock.release([x for key, x in marks.items() if key not in live])
        for m in done:
            self._recycle(m)
        return out

    def _durations(self, m: _Marks, tokens: int) -> StepTiming:
        el = self.clock.elapsed
        sec = self.run_queue.seconds if self.run_queue is not None else _no_seconds  # (None for a None reading)
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
            cpu_wait_s=waited(sec(m.run_queue_begin), sec(m.run_queue_end)),
            pre_sync_cpu_wait_s=_pre_sync_wait(m, complete_fwd, complete_fwd and complete_grad, sec)
            if self._phase_waits else None,
            device_timed=not self._cheap,
            loader_wait_s=el(start, m.load_end) if m.load_end is not None and m.prev_end is not None else None,
        )


def _no_reading() -> None:
    """The run-queue reading of a recorder without a run-queue clock."""
    return None


def _no_seconds(raw: Any) -> None:
    """The run-queue seconds of a recorder without a run-queue clock."""
    return None


def _pre_sync_wait(m: _Marks, forward: bool, compute: bool, sec: Any) -> float | None:
    """Run-queue seconds inside the phases ``StepTiming.pre_sync_s`` counts; None when a reading is missing.

    The data phase: the loader's ``next()`` calls when the loader was timed, else the whole data wait. Each
    micro-batch: from its forward's start to its last gradient (``compute``), or to its forward's end. ``sec`` turns a
    raw reading into seconds.
    """
    if m.load_s is not None:
        data: float | None = 0.0
        for i in range(0, len(m.load_waits) - 1, 2):
            wait = waited(sec(m.load_waits[i]), sec(m.load_waits[i + 1]))
            data = None if wait is None or data is None else data + wait
    else:
        data = waited(sec(m.run_queue_begin), sec(m.run_queue_step)) if m.prev_end is not None else 0.0
    if data is None:
        return None
    total = data
    for micro in m.micros if forward else []:
        wait = waited(sec(micro.run_queue_begin), sec(micro.run_queue_grad if compute else micro.run_queue_fwd_end))
        if wait is None:
            return None
        total += wait
    return total
