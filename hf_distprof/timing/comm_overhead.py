"""Communication overhead, measured: forward+backward with gradient sync off, then on (an A/B).

Run once before training on a real batch. ``passes`` forward+backward passes run with gradient sync
disabled (DDP and FSDP1 ``no_sync``; FSDP2 ``set_requires_gradient_sync(False)``), then ``passes`` with sync. The
gradients are dropped after every pass and the optimizer is never stepped. Parameters, gradients,
buffers, the RNG states and the module's train/eval mode are restored afterwards, bit for bit, so the
training that follows is exactly the one that would have run without the measurement.

Every rank must call ``measure_comm_overhead`` at the same point: the synced passes are collectives.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed
from torch import nn
from hf_distprof import dist
from hf_distprof.timing.instrument import sample_batch
from hf_distprof.timing.report import unresolved_note
from hf_distprof.callbacks.parallelism import find_ddp_wrapper, find_fsdp1_wrapper

logger = dist.get_logger(__name__)


@dataclass
class CommOverhead:
    """Result of the A/B on one rank.

    Attributes:
        passes: Timed passes per mode.
        method: How sync was switched off (``ddp.no_sync``, ``fsdp1.no_sync`` or
            ``fsdp2.set_requires_gradient_sync``).
        compute_s: Forward+backward without gradient sync (the least disturbed of the passes).
        with_sync_s: Forward+backward with gradient sync (the least disturbed of the passes).
        comm_s: ``with_sync_s - compute_s``: the communication the backward does not hide.
        overhead_pct: ``comm_s / with_sync_s``: the share of a synced forward+backward spent on it.
        no_sync_passes_s: Every timed pass without sync.
        sync_passes_s: Every timed pass with sync.
        noise_s: The passes' own spread: the larger, over the two modes, of the median pass less the fastest.
        resolved: ``comm_s > noise_s``: the difference stands out from how much passes of one mode differ.
            When not, the machine's noise (other processes, CPU frequency) hides the communication: the figure
            is reported but not as a measurement (a busy 2-core CI machine once gave -1.3 ms).
    """

    passes: int
    method: str
    compute_s: float
    with_sync_s: float
    comm_s: float
    overhead_pct: float
    no_sync_passes_s: list[float]
    sync_passes_s: list[float]
    noise_s: float = 0.0
    resolved: bool = True

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def sync_switch(
    model: nn.Module,
) -> tuple[str, Callable[[], contextlib.AbstractContextManager[Any]], nn.Module]:
    """How to run a pass without gradient sync for ``model``.

    Args:
        model: The (unwrapped) model the Trainer trains.

    Returns:
        ``(method name, factory of a no-sync context, module to call)``.

    Raises:
        ValueError: When the model is neither wrapped in DDP nor an FSDP2 module.
    """
    ddp = find_ddp_wrapper(model)
    if ddp is not None:
        return "ddp.no_sync", ddp.no_sync, ddp
    fsdp1 = find_fsdp1_wrapper(model)
    if fsdp1 is not None:
        # FSDP1's no_sync skips the reduce-scatter and keeps unsharded gradients until the next synced pass.
        return "fsdp1.no_sync", fsdp1.no_sync, fsdp1
    if hasattr(model, "set_requires_gradient_sync"):

        @contextlib.contextmanager
        def fsdp_no_sync() -> Iterator[None]:
            model.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)  # type: ignore[operator]

        return "fsdp2.set_requires_gradient_sync", fsdp_no_sync, model
    raise ValueError(
        f"cannot switch gradient sync off for {type(model).__name__}: it is neither wrapped in "
        "DistributedDataParallel or FSDP1 (FullyShardedDataParallel) nor an FSDP2 (fully_shard) module"
    )


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _loss_of(output: Any) -> torch.Tensor:
    """The loss of a model output; the mean of its first float tensor when it has none.

    The gradient volume, hence the communication, does not depend on which scalar is differentiated.
    """
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    values = output.values() if isinstance(output, Mapping) else output
    if isinstance(values, torch.Tensor):
        return values.float().mean()
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.float().mean()
    raise ValueError(f"the model output {type(output).__name__} holds no floating-point tensor to backward")


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the torch (CPU and CUDA), Python and NumPy RNG states on exit.

    The probe's batch (an MLM collator draws its mask) and dropout draw random numbers; without this the
    training that follows would see a different random stream than it would have without the probe.
    """
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    py_rng = random.getstate()
    np_rng: Any = None
    with contextlib.suppress(ImportError):
        import numpy as np

        np_rng = np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        random.setstate(py_rng)
        if np_rng is not None:
            import numpy as np

            np.random.set_state(np_rng)


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Restore gradients, buffers, RNG states and train/eval mode of ``model`` on exit, bit for bit.

    Gradient tensors keep their identity (DDP may hold bucket views of them); their values are copied back.
    Parameters are not snapshotted: nothing in a forward+backward writes them.
    """
    grads = [(p, p.grad, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    training = model.training
    try:
        with preserved_rng():
            yield
    finally:
        with torch.no_grad():
            for param, grad, values in grads:
                param.grad = grad
                if grad is not None and values is not None:
                    grad.copy_(values)
            for buf, values in buffers:
                buf.copy_(values)
        model.train(training)


def _timed_pass(call: nn.Module, batch: Any, params: list[nn.Parameter], device: torch.device) -> float:
    for p in params:
        p.grad = None
    if dist.is_distributed():
        # Every rank starts together, so a synced pass measures communication, not start-time skew.
        torch.distributed.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    _loss_of(call(**batch) if isinstance(batch, Mapping) else call(batch)).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure_comm_overhead(
    model: nn.Module, batch: Any, passes: int, device: torch.device | None = None
) -> CommOverhead:
    """Time ``passes`` forward+backward passes without gradient sync, then ``passes`` with it.

    One untimed pass of each mode runs first: DDP's first iterations rebuild buckets (with a broadcast)
    and the allocator warms up. The reported figures are the fastest pass of each mode, the one least
    disturbed by other processes; all passes are in the result too.

    Args:
        model: The unwrapped model the Trainer trains (its DDP wrapper is found), or an FSDP2 module.
        batch: A real batch, already on the model's device.
        passes: Timed passes per mode, >= 1.
        device: The device the passes compute on (a CUDA device is synchronised around each pass); None: the first
            parameter's (with CPU offload, the host: pass the training device then).

    Returns:
        This rank's result.

    Raises:
        ValueError: When ``passes`` < 1 or gradient sync cannot be switched off for this model.
    """
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    method, no_sync, call = sync_switch(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if device is None:
        device = params[0].device if params else torch.device("cpu")
    with preserved_state(model):
        model.train()
        _timed_pass(call, batch, params, device)  # warm-up, synced
        with no_sync():
            _timed_pass(call, batch, params, device)  # warm-up, no sync
            no_sync_times = [_timed_pass(call, batch, params, device) for _ in range(passes)]
        # The synced passes come last so that DDP ends in its normal state: nothing left unreduced.
        sync_times = [_timed_pass(call, batch, params, device) for _ in range(passes)]
    compute, synced = min(no_sync_times), min(sync_times)
    comm = synced - compute
    noise = passes_noise(no_sync_times, sync_times)
    return CommOverhead(
        passes=passes,
        method=method,
        compute_s=compute,
        with_sync_s=synced,
        comm_s=comm,
        overhead_pct=comm / synced * 100.0 if synced > 0 else 0.0,
        no_sync_passes_s=no_sync_times,
        sync_passes_s=sync_times,
        noise_s=noise,
        resolved=comm > noise,
    )


def passes_noise(*modes: list[float]) -> float:
    """The passes' spread: over the modes, the largest of (median pass - fastest pass)."""
    return max((statistics.median(times) - min(times) for times in modes if times), default=0.0)


def summarize_ranks(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine every rank's ``CommOverhead.to_json()`` into the run's figure (medians over ranks).

    ``resolved``: the median communication stands out from the median of the ranks' pass spreads.
    """
    keys = ("compute_s", "with_sync_s", "comm_s", "overhead_pct", "noise_s")
    out: dict[str, Any] = {k: statistics.median(r.get(k, 0.0) for r in results) for k in keys}
    out["resolved"] = out["comm_s"] > out["noise_s"]
    out["passes"] = results[0]["passes"]
    out["method"] = results[0]["method"]
    out["per_rank"] = results
    return out


def measure_before_training(
    model: nn.Module, loader: Any, batch_size: int, device: torch.device, passes: int
) -> dict[str, Any] | None:
    """``--measure-comm-overhead``: the no_sync A/B on one real batch of ``loader`` before training, on every rank
    alike (each rank's probe, then the ranks' median, printed by rank 0); None when it cannot run (fewer than 2
    ranks, a batch or a model the probe cannot use: a warning each, training goes on)."""
    if dist.get_world_size() < 2 or not dist.is_distributed():
        logger.warning("--measure-comm-overhead needs at least 2 ranks in a process group; skipped")
        return None
    batch = None
    try:
        with preserved_rng():
            batch = to_device(sample_batch(loader, batch_size, dist.get_rank()), device)
        sync_switch(model)
    except Exception as err:  # noqa: BLE001  # a probe that cannot run must not stop training
        logger.warning(f"--measure-comm-overhead skipped: {err}")
    # Agree before the first collective of the probe: either every rank runs it or none does.
    if not all(dist.all_gather_object(batch is not None)):
        return None
    result: dict[str, Any] | None = None
    try:
        with dist.ours("comm overhead probe"):  # its passes' collectives are ours, not the user's training
            probe = measure_comm_overhead(model, batch, passes, device)
        result = probe.to_json()
    except Exception as err:  # noqa: BLE001  # e.g. a model that rejects the batch: same on every rank
        logger.warning(f"--measure-comm-overhead failed: {err!r}; training goes on without it")
    results = dist.all_gather_object(result)
    if any(r is None for r in results):
        return None
    combined = summarize_ranks(results)
    if dist.get_rank() == 0:
        print(
            f"hf_distprof comm overhead ({combined['method']}, {combined['passes']} passes per mode, "
            "median "
            f"of ranks): compute {combined['compute_s']:.4f}s, with sync {combined['with_sync_s']:.4f}s, "
            f"communication {combined['comm_s']:.4f}s = {combined['overhead_pct']:.1f}% "
            f"of a synced forward+backward (one micro-batch's){unresolved_note(combined)}",
            flush=True,
        )
    return combined
