"""Where the step timer attaches: model forward hooks, gradient hooks, the data loader's iterator.

Everything here is installed at train start from the objects a ``TrainerCallback`` receives (``model``,
``train_dataloader``), so it works with any Trainer, and removed at train end. The hooks only take clock
marks, read tensor shapes and name the step's phases (:class:`PhaseLabels`): no device synchronisation, no
``.item()``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function
from torch.utils.data import DataLoader, IterableDataset

from hf_distprof.callbacks.memory import stats as memstats
from hf_distprof.core.advice import LoaderSettings
from hf_distprof.timing.recorder import StepRecorder


def eager(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` run as plain Python under ``torch.compile`` (the Trainer's ``torch_compile``): a module hook is traced
    with the module it hooks, and our clock reads, thread ids and profiler ranges are graph breaks Dynamo cannot always
    handle (a trial: 12 graph breaks without our hooks, 32 with them, one "Failed to handle graph break gracefully ...
    falling back to eager" for the whole function). Disabled, each hook is one clean break at its call."""
    return torch.compiler.disable(hook, recursive=True)


def batch_size_and_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any]:
    """Samples and tokens of one forward call, read from its inputs without a device sync.

    Tokens are the non-padding ones when a 2-D attention mask matches the inputs: the mask itself is returned, and
    the recorder counts its non-zero entries on a logging step (no kernel in the step); else every position. Calls
    with no recognisable input count 0.

    Returns:
        ``(samples, tokens)``; ``tokens`` is an int or the attention mask (its non-zero entries are the count).
    """
    ref = kwargs.get("input_ids")
    if ref is None:
        ref = kwargs.get("inputs_embeds")
    if ref is None and args and isinstance(args[0], torch.Tensor):
        ref = args[0]
    if not isinstance(ref, torch.Tensor):
        return 0, 0
    shape = ref.shape
    if not shape:
        return 0, 0
    samples = int(shape[0])
    if len(shape) < 2:
        return samples, samples
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == shape[:2]:
        return samples, mask
    return samples, samples * int(shape[1])


_profiler_enabled = torch._C._autograd._profiler_enabled

PHASE_PREFIX = "hf_distprof/"
"""Phase ranges are named ``hf_distprof/data``, ``hf_distprof/forward``, ``hf_distprof/backward`` and
``hf_distprof/optimizer``."""


class NvtxRanges:
    """The NVTX ranges pushed and popped through it, counted here: the balance is ours to keep.

    ``torch.cuda.nvtx.range_push`` returns the depth of the range it opened only while an NVTX tool (Nsight Systems)
    is attached; without one it returns a negative number (-2 seen on an H100 with CUDA 13), so a run cannot read
    its NVTX stack from the return values alone. Two counters cost nothing beside the C call.

    Attributes:
        pushed: Ranges pushed.
        popped: Ranges popped.
        deepest: The deepest depth ``range_push`` reported, or None when it never reported one (no tool attached).
    """

    def __init__(self) -> None:
        self.pushed = 0
        self.popped = 0
        self.deepest: int | None = None

    @property
    def open(self) -> int:
        """Ranges pushed and not popped yet."""
        return self.pushed - self.popped

    def push(self, name: str) -> None:
        """Push the NVTX range ``name``."""
        depth = torch.cuda.nvtx.range_push(name)
        self.pushed += 1
        if isinstance(depth, int) and depth >= 0 and (self.deepest is None or depth > self.deepest):
            self.deepest = depth

    def pop(self) -> None:
        """Pop the innermost NVTX range."""
        torch.cuda.nvtx.range_pop()
        self.popped += 1


class PhaseLabels:
    """Names the phases of each optimizer step: ``record_function`` ranges in traces, NVTX ranges for Nsight.

    One phase is open at a time: :meth:`enter` closes the open one and opens the next, :meth:`exit` closes
    it. A ``record_function`` range is opened only while a profiler records (torch's own flag, so a user's
    profiler counts too): outside a profiler's window a phase change costs one C call and no allocation.
    NVTX ranges (``nvtx=True``, CUDA only) are pushed on every step; Nsight decides what it captures.

    The ranges open and close where no other trace event is open around them (callback hooks, the data
    loader's ``next()``, the model's forward hooks), so they nest inside ``ProfilerStep#N`` as trace
    viewers require.

    Args:
        nvtx: Also push each phase as an NVTX range (``torch.cuda.nvtx``), counted in :attr:`nvtx_ranges`.
    """

    def __init__(self, nvtx: bool = False) -> None:
        self.nvtx = nvtx
        self.nvtx_ranges = NvtxRanges()
        self.phase: str | None = None
        self._range: record_function | None = None

    def enter(self, phase: str) -> None:
        """Close the open phase and open ``phase`` (``data``, ``forward``, ``backward`` or ``optimizer``)."""
        # torch's own "a profiler is recording" flag: a record_function costs ~10 us even when none is. With no range
        # open and none to open, a phase change is the name alone (the hot path between a profiler's windows).
        recording = _profiler_enabled()
        if self._range is None and not recording and not self.nvtx:
            self.phase = phase
            return
        self.exit()
        self.phase = phase
        if recording:
            self._range = record_function(PHASE_PREFIX + phase)
            self._range.__enter__()
        if self.nvtx:
            self.nvtx_ranges.push(PHASE_PREFIX + phase)

    def exit(self) -> None:
        """Close the open phase, if any."""
        if self.phase is None:
            return
        self.phase = None
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self.nvtx:
            self.nvtx_ranges.pop()

    def fetch(self) -> None:
        """A batch is being fetched: the data phase starts unless a phase is open."""
        if self.phase is None:
            self.enter("data")


class ModelHooks:
    """Forward and gradient hooks on the trained model that feed a ``StepRecorder`` and name the phases.

    Under DDP the model runs inside ``DistributedDataParallel.forward``, whose own trace range is still open
    when the model's forward ends; the backward phase is opened by a forward hook on the DDP module instead,
    once that range has closed (registered at the first forward, so the first micro-batch's backward is
    left unlabelled).

    Args:
        model: The model the Trainer calls (the unwrapped one: DDP calls it inside its own forward).
        recorder: Receives the marks; it ignores calls outside an optimizer step (evaluation, the
            comm-overhead probe).
        labels: Names the forward and backward phases of calls inside an optimizer step.
    """

    def __init__(self, model: nn.Module, recorder: StepRecorder, labels: PhaseLabels | None = None) -> None:
        self._handles: list[Any] = []
        rec = recorder
        phases = labels if labels is not None else PhaseLabels()
        wrappers: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # the DDP modules hooked
        # Where the backward phase of the forward in progress opens: at its end ("now"), once DDP's forward has
        # returned ("after DDP"), or not at all ("").
        backward_at = ""
        self._grad_calls = 0  # gradient hook calls since the last forward in a step
        self._pruned = False  # whether only the last gradient's hook is left (``_after_backward``)
        self._last_grad: torch.Tensor | None = None
        active_ddp = DistributedDataParallel._get_active_ddp_module

        def pre_forward(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            nonlocal backward_at
            if rec._current is None:  # not inside an optimizer step (``rec.in_step``)
                return
            if self._pruned and self._grad_calls == 1:
                self._grad_calls = 0  # the one gradient hook left fired: nothing to re-arm (``_after_backward``)
            else:
                self._after_backward(rec)
            rec.forward_begin(*batch_size_and_tokens(args, kwargs))
            phases.enter("forward")
            # DDP says which DDP module is running (torch.compile asks it the same way).
            ddp = active_ddp()
            if ddp is None:
                backward_at = "now"
            elif ddp in wrappers:
                backward_at = "after DDP"
            else:
                # A hook added during a module's call runs from its next call on.
                wrappers.add(ddp)
                self._handles.append(ddp.register_forward_hook(eager(after_ddp)))
                backward_at = ""

        def post_forward(_module: nn.Module, _args: Any, _kwargs: Any, _output: Any) -> None:
            rec.forward_end()
            if phases.phase == "forward":
                # One phase change, forward to backward (``enter`` closes the open one), or the forward closed.
                if backward_at == "now":
                    phases.enter("backward")
                else:
                    phases.exit()

        def after_ddp(_module: nn.Module, _args: Any, _output: Any) -> None:
            nonlocal backward_at
            if backward_at == "after DDP":
                backward_at = ""  # an evaluation forward through DDP later opens nothing
                phases.enter("backward")

        def grad_ready(param: torch.Tensor) -> None:
            self._grad_calls += 1
            self._last_grad = param
            rec.grad_ready()

        # prepend: the forward window also covers other pre-hooks (an FSDP2 root's parameter all-gather).
        self._handles.append(model.register_forward_pre_hook(eager(pre_forward), with_kwargs=True, prepend=True))
        self._handles.append(model.register_forward_hook(eager(post_forward), with_kwargs=True))
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._grad_hook = grad_ready
        self._grad_handles: list[Any] = []
        self._arm(self._params)

    def _arm(self, params: list[torch.Tensor]) -> None:
        """A gradient hook on each of ``params`` (the ones there were removed first)."""
        for handle in self._grad_handles:
            handle.remove()
        self._grad_handles = [p.register_post_accumulate_grad_hook(self._grad_hook) for p in params]

    def _after_backward(self, rec: StepRecorder) -> None:
        """At a forward inside a step, once the backward before it ran: keep only the gradient hook that fired last.

        A hook on every parameter calls into Python once per parameter in every backward (hundreds of calls on a
        large model, each taking the GIL from the autograd engine); only the last one marks the end of the backward.
        The first backward shows which parameter's gradient comes last; from then on that parameter's hook alone
        runs. Should it not fire in a later backward (a parameter left out of that step's graph), every hook is put
        back and the last one learned again.
        """
        calls, self._grad_calls = self._grad_calls, 0
        if self._last_grad is None:
            return  # no backward since the hooks were set
        if not self._pruned and calls > 1:
            self._arm([self._last_grad])
            self._pruned = True
            rec.expect_grads(1)
        elif self._pruned and calls == 0:
            self._arm(self._params)
            self._pruned = False
            self._last_grad = None

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles + self._grad_handles:
            handle.remove()
        self._handles.clear()
        self._grad_handles = []


class _TimedIterator:
    """Proxy of a data loader iterator that reports the seconds each ``next()`` blocks."""

    def __init__(self, inner: Iterator[Any], sink: Callable[[float], None], on_fetch: Callable[[], None]) -> None:
        self._inner = inner
        self._sink = sink
        self._on_fetch = on_fetch

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        self._on_fetch()
        start = time.perf_counter()
        try:
            return next(self._inner)
        finally:
            self._sink(time.perf_counter() - start)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # DataLoader calls _reset() etc. on a persistent-workers iterator.
        return getattr(self._inner, name)


def base_dataloader(loader: Any) -> DataLoader[Any] | None:
    """The torch ``DataLoader`` inside an accelerate ``DataLoaderShard``/``Dispatcher`` (or itself)."""
    base = getattr(loader, "base_dataloader", loader)
    return base if isinstance(base, DataLoader) else None


def loads_elsewhere(loader: Any, rank: int) -> bool:
    """Whether rank ``rank`` gets its batches from another rank: accelerate's ``DataLoaderDispatcher``
    (``dispatch_batches``, its default for an ``IterableDataset``) has rank 0 load every rank's batches and broadcast
    them, so the other ranks never call the loader's ``next()``: their data wait is a wait for rank 0, not loading."""
    return rank != 0 and dispatched(loader)


def dispatched(loader: Any) -> bool:
    """Whether accelerate dispatches ``loader``'s batches from rank 0 (its ``DataLoaderDispatcher``)."""
    try:
        from accelerate.data_loader import DataLoaderDispatcher
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return False
    return isinstance(loader, DataLoaderDispatcher)


def loader_settings(loader: Any) -> LoaderSettings | None:
    """What ``loader`` (the Trainer's, as its callbacks receive it: accelerate's wrapper around a torch ``DataLoader``)
    loads with (:class:`~hf_distprof.core.advice.LoaderSettings`); None for a loader that is not a ``DataLoader``."""
    base = base_dataloader(loader)
    if base is None:
        return None
    workers = int(base.num_workers)  # (torch takes a bool too)
    prefetch = base.prefetch_factor if workers > 0 and isinstance(base.prefetch_factor, int) else None
    return LoaderSettings(num_workers=workers, persistent_workers=bool(base.persistent_workers),
                          pin_memory=bool(base.pin_memory), prefetch_factor=prefetch,
                          dispatched=dispatched(loader))


def instrument_loader(
    loader: Any, sink: Callable[[float], None], on_fetch: Callable[[], None] = lambda: None
) -> Callable[[], None] | None:
    """Make every iterator of ``loader`` report how long each ``next()`` blocks.

    The loader's ``_get_iterator`` is shadowed on the instance (``iter()`` looks special methods up on
    the type, so ``__iter__`` cannot be); nothing else changes.

    Args:
        loader: The Trainer's train data loader.
        sink: Called with the seconds of each ``next()``.
        on_fetch: Called before each ``next()`` (opens the data phase, :meth:`PhaseLabels.fetch`).

    Returns:
        A function that undoes it, or None when the loader is not a torch ``DataLoader``.
    """
    timed = _time_iterators(loader, sink, on_fetch)
    if timed is None:
        return None
    undo_copies = _time_resumed_copies(loader, sink, on_fetch)

    def undo() -> None:
        timed()
        undo_copies()

    return undo


def _time_resumed_copies(
    loader: Any, sink: Callable[[float], None], on_fetch: Callable[[], None]
) -> Callable[[], None]:
    """On resume the Trainer iterates, for the rest of the resumed epoch, a copy of ``loader`` that skips the batches
    already trained (accelerate's ``skip_first_batches``, looked up in ``transformers.trainer`` at that moment): that
    copy is timed too. Without it a resumed run's loading went unmeasured, and its data phase (which then holds the
    wait for the peers in the Trainer's token count) made a rank with a slow loader look like its peers (a trial: the
    other rank named slowest). Returns the undo; nothing is done where the Trainer has no such name."""
    try:
        import transformers.trainer as trainer_module
    except ImportError:  # pragma: no cover - transformers is a dependency
        return lambda: None
    original = getattr(trainer_module, "skip_first_batches", None)
    if original is None:
        return lambda: None
    undos: list[Callable[[], None]] = []

    def skip_first_batches(dataloader: Any, *args: Any, **kwargs: Any) -> Any:
        copy = original(dataloader, *args, **kwargs)
        if dataloader is loader and copy is not loader:
            timed = _time_iterators(copy, sink, on_fetch)
            if timed is not None:
                undos.append(timed)
        return copy

    trainer_module.skip_first_batches = skip_first_batches

    def undo() -> None:
        if getattr(trainer_module, "skip_first_batches", None) is skip_first_batches:
            trainer_module.skip_first_batches = original
        for each in undos:
            each()

    return undo


def _time_iterators(
    loader: Any, sink: Callable[[float], None], on_fetch: Callable[[], None]
) -> Callable[[], None] | None:
    """Shadow ``loader``'s ``_get_iterator`` with a timed one; the undo, or None when it is no torch ``DataLoader``."""
    base = base_dataloader(loader)
    if base is None or "_get_iterator" in vars(base):
        return None
    original = base._get_iterator

    def timed_iterator() -> Any:
        return _TimedIterator(original(), sink, on_fetch)

    base._get_iterator = timed_iterator  # type: ignore[method-assign]

    def undo() -> None:
        if vars(base).get("_get_iterator") is timed_iterator:
            del base._get_iterator

    return undo


def sample_batch(loader: Any, batch_size: int, rank: int) -> Any:
    """A real training batch built without advancing the Trainer's data order.

    For a map-style dataset: the loader's own collator over ``batch_size`` consecutive samples (a
    different slice per rank). For an iterable dataset: the first batch of a fresh iterator.

    Raises:
        ValueError: When the dataset is empty.
    """
    base = base_dataloader(loader)
    dataset = getattr(base if base is not None else loader, "dataset", None)
    collate = getattr(base if base is not None else loader, "collate_fn", None)
    if (
        dataset is not None
        and collate is not None
        and not isinstance(dataset, IterableDataset)
        and hasattr(dataset, "__getitem__")
        and hasattr(dataset, "__len__")
    ):
        size = len(dataset)
        if size == 0:
            raise ValueError("the training dataset is empty")
        n = min(batch_size, size)
        start = (rank * n) % (size - n + 1)
        return collate([dataset[i] for i in range(start, start + n)])
    return next(iter(loader))


def peak_memory_bytes(device: torch.device, step: int | None = None) -> int:
    """Peak memory of this rank so far: CUDA peak allocated on GPU, peak RSS of the process on CPU.

    Both are counters kept by the host (no device sync). The peak of the whole run, also when the memory
    logger resets the counters to log a peak per window.
    """
    return memstats.lifetime_peak_bytes(device, step)


def current_memory_bytes(device: torch.device, step: int | None = None) -> int | None:
    """Memory in use now: CUDA allocated on GPU, the process's RSS on CPU; None when unreadable.

    Host counters only (no device sync). Sampled on logging steps, for the memory-growth verdict.
    """
    if device.type == "cuda":
        return memstats.cuda_counters(device, step)[0]  # the memory logger's read at this step, if it took one
    try:
        return memstats.host_rss_bytes()
    except Exception:  # noqa: BLE001 - a sandbox without /proc: no growth check, nothing else lost
        return None
