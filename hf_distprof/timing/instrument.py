"""Where the step timer attaches: model forward hooks, gradient hooks, the data loader's iterator.

Everything here is installed at train start from the objects a ``TrainerCallback`` receives (``model``,
``train_dataloader``), so it works with any Trainer, and removed at train end. The hooks only take clock
marks and read tensor shapes: no device synchronisation, no ``.item()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from hf_distprof import memstats
from hf_distprof.timing.recorder import StepRecorder


def batch_size_and_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any]:
    """Samples and tokens of one forward call, read from its inputs without a device sync.

    Tokens are the non-padding ones (``attention_mask.sum()``, a 0-d tensor left on the device) when a 2-D
    attention mask matches the inputs, else every position. Calls with no recognisable input count 0.

    Returns:
        ``(samples, tokens)``; ``tokens`` is an int or a 0-d tensor.
    """
    ref = kwargs.get("input_ids")
    if ref is None:
        ref = kwargs.get("inputs_embeds")
    if ref is None and args and isinstance(args[0], torch.Tensor):
        ref = args[0]
    if not isinstance(ref, torch.Tensor) or ref.dim() == 0:
        return 0, 0
    samples = int(ref.shape[0])
    positions = samples * int(ref.shape[1]) if ref.dim() >= 2 else samples
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and ref.dim() >= 2 and mask.shape == ref.shape[:2]:
        return samples, mask.sum()
    return samples, positions


class ModelHooks:
    """Forward and gradient hooks on the trained model that feed a ``StepRecorder``.

    Args:
        model: The model the Trainer calls (the unwrapped one: DDP calls it inside its own forward).
        recorder: Receives the marks; it ignores calls outside an optimizer step (evaluation, the
            comm-overhead probe).
    """

    def __init__(self, model: nn.Module, recorder: StepRecorder) -> None:
        self._handles: list[Any] = []
        rec = recorder

        def pre_forward(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if rec.in_step:
                rec.forward_begin(*batch_size_and_tokens(args, kwargs))

        def post_forward(_module: nn.Module, _args: Any, _kwargs: Any, _output: Any) -> None:
            rec.forward_end()

        def grad_ready(_param: torch.Tensor) -> None:
            rec.grad_ready()

        # prepend: the forward window also covers other pre-hooks (an FSDP2 root's parameter all-gather).
        self._handles.append(model.register_forward_pre_hook(pre_forward, with_kwargs=True, prepend=True))
        self._handles.append(model.register_forward_hook(post_forward, with_kwargs=True))
        for param in model.parameters():
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(grad_ready))

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _TimedIterator:
    """Proxy of a data loader iterator that reports the seconds each ``next()`` blocks."""

    def __init__(self, inner: Iterator[Any], sink: Callable[[float], None]) -> None:
        self._inner = inner
        self._sink = sink

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
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


def instrument_loader(loader: Any, sink: Callable[[float], None]) -> Callable[[], None] | None:
    """Make every iterator of ``loader`` report how long each ``next()`` blocks.

    The loader's ``_get_iterator`` is shadowed on the instance (``iter()`` looks special methods up on
    the type, so ``__iter__`` cannot be); nothing else changes.

    Args:
        loader: The Trainer's train data loader.
        sink: Called with the seconds of each ``next()``.

    Returns:
        A function that undoes it, or None when the loader is not a torch ``DataLoader``.
    """
    base = base_dataloader(loader)
    if base is None or "_get_iterator" in vars(base):
        return None
    original = base._get_iterator

    def timed_iterator() -> Any:
        return _TimedIterator(original(), sink)

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


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank so far: CUDA peak allocated on GPU, peak RSS of the process on CPU.

    Both are counters kept by the host (no device sync). The peak of the whole run, also when the memory
    logger resets the counters to log a peak per window.
    """
    return memstats.lifetime_peak_bytes(device)


def current_memory_bytes(device: torch.device) -> int | None:
    """Memory in use now: CUDA allocated on GPU, the process's RSS on CPU (psutil); None when unreadable.

    Host counters only (no device sync). Sampled on logging steps, for the memory-growth verdict.
    """
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        return int(memstats.this_process().memory_info().rss)
    except Exception:  # noqa: BLE001 - a sandbox without /proc: no growth check, nothing else lost
        return None
