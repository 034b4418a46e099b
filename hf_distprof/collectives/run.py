"""The collective bandwidth benchmark's timing loop (torch): every rank runs :func:`run_benchmark`.

For each op and size: fill rank-dependent inputs (:func:`hf_distprof.collectives.bench.pattern`), run the op once and
check the result on this rank, then ``warmup`` untimed and ``iters`` timed back-to-back runs; the mean time
per iteration is this rank's. One ``all_gather_object`` at the end gives every rank every rank's outcome,
and :func:`hf_distprof.collectives.bench.make_row` keeps the slowest rank's time (nccl-tests' ``-a 3``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hf_distprof.collectives import bench as collbench
from hf_distprof import dist as hdist

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# all_gather_single / reduce_scatter_single are the torch 2.13 names; older releases only have the *_tensor ones.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class BenchConfig:
    """What to run: the ``bench-collectives`` flags."""

    ops: tuple[str, ...]
    sizes: list[int]
    dtype: str = "float32"
    warmup: int = 5
    iters: int = 20
    progress: bool = False
    """Show a progress bar (rank 0 only)."""


@dataclass(frozen=True)
class Group:
    """The process group the benchmark runs on."""

    backend: str
    device: torch.device
    owned: bool
    """Created here, so destroyed here."""


def init_group() -> Group:
    """Use the initialised process group, or create one: NCCL on the launcher's local GPU, else gloo.

    Started by torchrun or accelerate (``RANK`` and ``MASTER_ADDR`` set) it joins the launch; run alone it is a
    world of one, over an in-process store.
    """
    if hdist.is_distributed():
        backend = str(dist.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        return Group(backend, device, owned=False)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, **kwargs)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    return Group(backend, device, owned=True)


def _filled(blocks: tuple[int, ...], numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``numel`` elements in ``len(blocks)`` equal blocks, block i all ``blocks[i]``."""
    values = torch.tensor(blocks, dtype=dtype, device=device)
    return values.repeat_interleave(numel // len(blocks))


def _mismatch(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """The first wrong element, or None when ``got`` equals ``expected`` exactly."""
    if torch.equal(got, expected):
        return None
    index = int((got != expected).nonzero()[0].item())
    return f"element {index} is {got[index].item():g}, expected {expected[index].item():g}"


def _op_call(op: str, buffers: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """The op on the given buffers, as a callable (blocking)."""
    src, out = buffers["in"], buffers["out"]
    if op == "all_reduce":
        return lambda: dist.all_reduce(src)
    if op == "all_gather":
        return lambda: _ALL_GATHER(out, src)
    if op == "reduce_scatter":
        return lambda: _REDUCE_SCATTER(out, src)
    if op == "broadcast":
        return lambda: dist.broadcast(src, 0)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, src)
    raise ValueError(f"unknown op {op!r}")


def _buffers(op: str, count: int, group: Group, dtype: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """This rank's input (and output) buffers of ``op``, filled with its pattern, and the expected output."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tdtype = _DTYPES[dtype]
    pat = collbench.pattern(op, rank, world, dtype)
    in_bytes, out_bytes = collbench.buffer_bytes(op, count, collbench.DTYPE_BYTES[dtype], world)
    in_numel, out_numel = in_bytes // collbench.DTYPE_BYTES[dtype], out_bytes // collbench.DTYPE_BYTES[dtype]
    src = _filled(pat.inputs, in_numel, tdtype, group.device)
    expected = _filled(pat.expected, out_numel, tdtype, group.device)
    # all_reduce and broadcast work in place: their output is their input buffer.
    out = src if op in ("all_reduce", "broadcast") else torch.zeros(out_numel, dtype=tdtype, device=group.device)
    return {"in": src, "out": out}, expected


def _sync(group: Group) -> None:
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)


def measure(op: str, count: int, group: Group, config: BenchConfig) -> collbench.RankOutcome:
    """Check then time one op at one size on this rank (every rank calls it at the same point).

    Returns:
        The mean time per timed iteration, what was wrong in the checked result, or the backend's refusal.
    """
    buffers, expected = _buffers(op, count, group, config.dtype)
    call = _op_call(op, buffers)
    try:
        call()  # the checked run; also the first (connection-setting) call, left out of the timing
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        if "support" in str(exc).lower():  # refused up front, on every rank alike
            return collbench.RankOutcome(None, unsupported=str(exc).splitlines()[0][:200])
        raise
    _sync(group)
    wrong = _mismatch(buffers["out"], expected)
    if op == "all_reduce":
        buffers["in"].zero_()  # in place: repeated sums of zeros stay zero, never overflow
    for _ in range(config.warmup):
        call()
    _sync(group)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(config.iters):
        call()
    _sync(group)
    elapsed_us = (time.perf_counter() - started) * 1e6
    return collbench.RankOutcome(elapsed_us / config.iters, wrong=wrong)


def run_benchmark(config: BenchConfig, group: Group) -> list[collbench.BenchRow]:
    """Every op at every size, on every rank; the rows (identical on every rank) in op, then size order."""
    world = dist.get_world_size()
    elem = collbench.DTYPE_BYTES[config.dtype]
    plan = [(op, collbench.element_count(op, size, elem, world)) for op in config.ops for size in config.sizes]
    plan = list(dict.fromkeys(plan))  # sizes that round to the same count run once
    refused: dict[str, str] = {}
    local: list[collbench.RankOutcome] = []
    bar = _progress(len(plan), config.progress and dist.get_rank() == 0)
    for op, count in plan:
        if bar is not None:
            bar.set_description(f"{op} {collbench.size_label(count * elem)}")
        if op in refused:  # every rank saw the same refusal at this op's first size
            local.append(collbench.RankOutcome(None, unsupported=refused[op]))
        else:
            outcome = measure(op, count, group, config)
            if outcome.unsupported:
                refused[op] = outcome.unsupported
            local.append(outcome)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    every = hdist.all_gather_object(local)  # the one cross-rank exchange, after all the timing
    return [collbench.make_row(op, count, config.dtype, group.backend, config.iters, [r[i] for r in every])
            for i, (op, count) in enumerate(plan)]


def _progress(total: int, show: bool) -> Any:
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="op", leave=False)
