"""The memory views behind ``--track-activation-memory``, ``--memory-tracker`` and ``--memory-snapshot``.

- :class:`ActivationCounter`: bytes autograd saves for backward during a forward (``saved_tensors_hooks``),
  parameters left out, each storage counted once.
- :func:`make_tracker` / :func:`module_rows`: torch's ``MemTracker`` (``FSDPMemTracker`` for an FSDP2 model)
  over one step, reduced to one row per module.
- :class:`AllocatorHistory`: the CUDA caching allocator's history (``_record_memory_history``), dumped as a
  pickle that https://pytorch.org/memory_viz opens, and an out-of-memory observer that dumps one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hf_distprof.callbacks.memory.stats import MB


def _is_parameter(t: torch.Tensor) -> bool:
    """A parameter (FSDP2's unsharded ones too), or a view of one (``weight.t()`` saved by a matmul)."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def _storage_key(t: torch.Tensor) -> tuple[str, int, int]:
    """(device, storage address, storage bytes): two views of one storage share it."""
    try:
        storage = t.untyped_storage()
        return str(t.device), storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without a storage (subclasses)
        return str(t.device), id(t), t.numel() * t.element_size()


class ActivationCounter:
    """Counts what one forward saves for backward: the activation memory of that forward.

    Entered before the forward and left after it (``enter``/``exit``, so that module hooks can drive
    it). While entered, every tensor autograd saves passes through a pack hook that records its storage
    unless it belongs to a parameter; the tensor itself is returned untouched (no copy, no sync).

    Attributes:
        bytes: Bytes of the distinct storages saved in the last forward.
        tensors: How many tensors were saved (parameters included).
    """

    def __init__(self) -> None:
        self._storages: dict[tuple[str, int], int] = {}
        self.tensors = 0
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.tensors += 1
        if not _is_parameter(t):
            device, address, size = _storage_key(t)
            self._storages[(device, address)] = size
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def enter(self) -> None:
        """Start counting (a fresh count)."""
        self._storages.clear()
        self.tensors = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def exit(self) -> None:
        """Stop counting; safe to call when not entered."""
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())


# ---- the per-module tracker -------------------------------------------------------------------------


def is_fsdp2(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded with FSDP2's ``fully_shard`` (its root is an ``FSDPModule``)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer under accelerate's ``AcceleratedOptimizer`` (or the optimizer itself).

    ``AcceleratedOptimizer`` subclasses ``torch.optim.Optimizer`` without its state (no step hooks of its
    own), so wrappers are unwrapped while they hold an ``optimizer``.
    """
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def enter_tracker(tracker: Any) -> None:
    """Enter ``tracker``; when that fails half-way, take its hooks out again before re-raising.

    A half-entered ``FSDPMemTracker`` leaves FSDP's forward hooks replaced, and the next forward fails:
    a memory view must not break training.
    """
    try:
        tracker.__enter__()
    except Exception:
        for undo in ("_deregister_module_and_optimizer_hooks", "_deregister_param_and_optimizer_hooks",
                     "_restore_resize"):
            with contextlib.suppress(Exception):
                getattr(tracker, undo, lambda: None)()
        with contextlib.suppress(Exception):
            tracker._mod_tracker.clear_user_hooks()
        raise


def tracker_unsupported(model: torch.nn.Module) -> str | None:
    """Why torch's memory trackers cannot follow ``model``; None when they can.

    ``MemTracker`` hooks every parameter's gradient; FSDP1's parameters (``FullyShardedDataParallel``) are
    views of a flat parameter during forward, which takes no such hook, and the forward would fail.
    """
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # torch without FSDP
        return None
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return "FSDP1 (FullyShardedDataParallel) parameters are flat-parameter views torch's MemTracker cannot hook"
    return None


def make_tracker(model: torch.nn.Module, optimizer: Any) -> Any:
    """A ``MemTracker`` (``FSDPMemTracker`` for an FSDP2 model) that knows the model and optimizer.

    Enter it before the step and leave it after: it is a ``TorchDispatchMode`` and sees every tensor
    op in between, which is why it runs for one step only.
    """
    optim = inner_optimizer(optimizer)
    if is_fsdp2(model):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(model, optim)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, *([optim] if optim is not None else []))
    return tracker


def _local_bytes(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    to_local = getattr(t, "to_local", None)
    local = to_local() if callable(to_local) else t
    return local.numel() * local.element_size()


def state_bytes(params: Sequence[torch.Tensor], optimizer: Any) -> dict[str, int]:
    """Bytes of ``params``, of their gradients and of their optimizer state, on this rank.

    Sharded (DTensor) parameters count their local shard. Read while gradients exist (after backward,
    before ``zero_grad``). A few microseconds per parameter: the caller lists the parameters, which is
    the costly part on a deep model (``module.parameters()`` walks every submodule).

    Returns:
        ``params``, ``grads`` and ``optimizer_state``.
    """
    state = getattr(inner_optimizer(optimizer), "state", None) or {}
    optim = 0
    for p in params:
        for value in (state.get(p) or {}).values():
            if isinstance(value, torch.Tensor):
                optim += _local_bytes(value)
    return {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params),
        "optimizer_state": optim,
    }


def own_state_bytes(module: torch.nn.Module, optimizer: Any) -> dict[str, int]:
    """This rank's parameters, gradients and optimizer state of ``module`` (its submodules included).

    :func:`state_bytes` of the module's parameters, plus ``params_storage``: what the parameters' storages
    really hold, more than ``params`` when a shard is a view into a larger tensor, which keeps all of that
    tensor alive.
    """
    params = list(module.parameters())
    storages: dict[tuple[str, int], int] = {}
    for p in params:
        local = p.to_local() if callable(getattr(p, "to_local", None)) else p
        device, address, size = _storage_key(local)
        storages[(device, address)] = size
    own = state_bytes(params, optimizer)
    return {
        "params": own["params"],
        "params_storage": sum(storages.values()),
        "grads": own["grads"],
        "optimizer_state": own["optimizer_state"],
    }


def _category_bytes(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """One MemTracker snapshot ({device: {category: bytes}}) summed over devices, keyed by category name."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for category, value in per_device.items():
            name = getattr(category, "value", str(category))
            out[name] = out.get(name, 0) + int(value)
    return out


def modules_to_depth(model: torch.nn.Module, depth: int) -> dict[str, torch.nn.Module]:
    """The modules the table lists, named ``<class>.<attribute path>``, in model order.

    Down to ``depth`` (1 = the model itself). Under FSDP2 every FSDP unit (``fully_shard`` module) instead,
    whatever its depth: those are the modules ``FSDPMemTracker`` follows.
    """
    root = type(model).__name__
    fsdp = is_fsdp2(model)
    out = {}
    for name, module in model.named_modules():
        keep = is_fsdp2(module) if fsdp else (not name or name.count(".") + 2 <= depth)
        if keep:
            out[f"{root}.{name}" if name else root] = module
    return out


def module_rows(
    tracker: Any, modules: dict[str, torch.nn.Module], own: dict[int, dict[str, int]]
) -> list[dict[str, Any]]:
    """One row per module of ``modules`` that the tracker saw, in model order.

    Args:
        tracker: A ``MemTracker``/``FSDPMemTracker`` that ran over one step.
        modules: :func:`modules_to_depth` of the model. The tracker names modules after the first one it
            saw run (a DDP wrapper, say); rows use these names instead.
        own: :func:`own_state_bytes` per ``id(module)``, read during that step.

    Returns:
        Rows with the module's ``name`` and ``depth``; its own ``params``, ``grads``, ``optimizer_state``
        (this rank's share); ``activations``: what its forward added to the activation memory (after
        minus before its forward, from the tracker); and ``peak_forward`` / ``peak_backward``: the
        tracker's whole-process breakdown (by category, plus ``Total``) when that module's forward or
        backward peaked.
    """
    seen = {id(module): stats for module, stats in tracker.memory_tracking.items()}
    rows = []
    for name, module in modules.items():
        stats = seen.get(id(module))
        if stats is None:
            continue  # never ran a forward in the tracked step
        snaps = {getattr(k, "value", str(k)): _category_bytes(v[-1]) for k, v in stats.snapshots.items() if v}
        before = snaps.get("Pre-Forward") or snaps.get("Before Pre-Forward") or {}
        after = snaps.get("Post-Forward") or snaps.get("After Post-Forward") or {}
        rows.append({
            "name": name,
            "depth": name.count(".") + 1,
            **own.get(id(module), {"params": 0, "params_storage": 0, "grads": 0, "optimizer_state": 0}),
            "activations": max(0, after.get("Activation", 0) - before.get("Activation", 0)),
            "peak_forward": snaps.get("Peak-Forward") or snaps.get("Peak Forward") or {},
            "peak_backward": snaps.get("Peak-Backward") or snaps.get("Peak Backward") or {},
        })
    return rows


def format_module_table(rows: list[dict[str, Any]], peak: dict[str, int], title: str) -> str:
    """The per-module table, as written to ``rank{R}_memory_modules.txt`` (MiB, or KiB for a tiny model)."""
    largest = max([peak.get("Total", 0)] + [r["peak_backward"].get("Total", 0) for r in rows])
    unit, scale = ("MiB", MB) if largest >= MB else ("KiB", 1024)
    header = (
        f"{'module':<48}{'params':>10}{'grads':>10}{'optim':>10}{'activ.':>10}"
        f"{'peak fw':>10}{'peak bw':>10}"
    )
    lines = [title, f"{unit}; params/grads/optim: this module's own (this rank's shard); activ.: what its forward "
             "made that is alive when it returns (saved for backward and its outputs, such as logits); peak fw/bw: the "
             "whole process at this module's forward/backward peak", header]
    for r in rows:
        path = r["name"].split(".", 1)[1] if r["depth"] > 1 else r["name"]
        name = ("  " * min(r["depth"] - 1, 1) + path)[:47]
        cells = [r["params"], r["grads"], r["optimizer_state"], r["activations"],
                 r["peak_forward"].get("Total", 0), r["peak_backward"].get("Total", 0)]
        lines.append(f"{name:<48}" + "".join(f"{c / scale:>10.2f}" for c in cells))
    if peak:
        parts = ", ".join(f"{k} {v / scale:.2f}" for k, v in peak.items() if k != "Total" and v)
        lines.append(f"peak of the step: {peak.get('Total', 0) / scale:.2f} {unit} ({parts})")
    root = rows[0] if rows else None
    children = [r for r in rows[1:] if r["depth"] == 2]
    if root is not None and children and sum(r["params"] for r in children) > root["params"]:
        # (Trial T: GPT-2's lm_head shares the embedding's weight: transformer 0.12 + lm_head 0.06 > the model's 0.12.)
        lines.append("note: the rows below the model add up to more parameters than it holds: they share some (tied "
                     "weights, such as an output layer's and the embedding's); a shared tensor counts in each row")
    inside = max((r[k].get("Total", 0) for r in rows for k in ("peak_forward", "peak_backward")), default=0)
    if peak and root is not None and peak.get("Total", 0) > 1.05 * inside:
        # (Trial T, FSDP2: the step's peak 157.63 MiB, every module's at most 125.65.)
        lines.append(
            f"note: the step's peak lies outside every module's forward and backward (at most {inside / scale:.2f} "
            f"{unit} there): between them or after the last backward (a gradient reduce-scatter or all-reduce, the "
            "optimizer step; the loss on the logits): its breakdown above says of what"
        )
    if root is not None and root.get("params_storage", 0) > 1.2 * root["params"]:
        lines.append(
            f"note: this rank's parameter storages hold {root['params_storage'] / scale:.2f} {unit} for "
            f"{root['params'] / scale:.2f} {unit} of parameters: the shards are views into larger (unsharded) "
            "tensors, which stay alive; copy the shards (or load sharded) to get the saving"
        )
    return "\n".join(lines) + "\n"


# ---- the CUDA allocator's history -------------------------------------------------------------------


class AllocatorHistory:
    """Records the CUDA caching allocator's events with Python stacks, and dumps them for memory_viz.

    Python-only stacks keep a dump to seconds (torchtitan measured minutes with C++ stacks); the history is
    a ring buffer of ``max_entries`` events.

    Args:
        max_entries: Allocator events kept.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.recording = False

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=self.max_entries
        )
        self.recording = True

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            torch.cuda.memory._record_memory_history(enabled=None)

    @staticmethod
    def dump(path: Path) -> float:
        """Write the snapshot (history and segments) to ``path``; returns the seconds it took."""
        begin = time.perf_counter()
        torch.cuda.memory._dump_snapshot(str(path))
        return time.perf_counter() - begin


def attach_oom_observer(observer: Callable[[int, int, int, int], None]) -> bool:
    """Have ``observer(device, alloc, device_alloc, device_free)`` called when a CUDA allocation fails.

    It runs before ``torch.OutOfMemoryError`` is raised, which then goes on as usual. False where the
    build has no CUDA (nothing attached). An observer cannot be detached: make it a no-op when done.
    """
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False
    attach(observer)
    return True
