"""The checks: what each rank does for each one, returning a JSON-ready result that it posts to the board.

A check's result holds ``error`` when the process group failed under it (rank 0 then skips the later checks
that use the group), ``wrong`` when data arrived but was not what it must be; :mod:`hf_distprof.doctor.judge`
turns every rank's results into rank 0's verdict.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from hf_distprof.core.clock import ntp_offset
from hf_distprof.core.versions import library_versions
from hf_distprof.doctor.context import RankContext

# The order they run in: the store-only checks first, so that a mismatch that explains a failing collective
# is already on the screen when the collective fails.
CHECKS = ("init", "versions", "environment", "memory", "p2p", "all_reduce", "all_gather", "reduce_scatter",
          "broadcast", "barrier", "clock_skew")
# Checks that run over the process group; skipped once it is broken.
GROUP_CHECKS = CHECKS[4:]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
INJECT_ENV = "HF_DISTPROF_DOCTOR_INJECT"
INJECTABLE = {"wrong": ("p2p", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "clock_skew"),
              "hang": ("init", *GROUP_CHECKS)}
PAYLOAD_NUMEL = 1 << 18  # float32 elements: 1 MiB per point-to-point message and per collective buffer
REPEATS = 3  # timed runs of each collective, after one untimed warm-up
SKEW_SAMPLES = 8  # ping-pongs per rank; the one with the shortest round trip gives the offset
ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
ENV_MUST_AGREE = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")


def round_robin_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Pair ``n`` ranks so every pair meets once and no rank is in two pairs of one round (circle method).

    Ranks that work through their own pairs in round order cannot deadlock: both sides of every round-k pair
    are done with rounds < k. An odd ``n`` gets one idle rank per round.

    Returns:
        One list of ``(low, high)`` pairs per round; empty for fewer than 2 ranks.
    """
    if n < 2:
        return []
    seats: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [(seats[i], seats[-1 - i]) for i in range(half)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


def describe(exc: BaseException) -> str:
    """One line of an exception: the type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def _local_init(doc: RankContext, deadline: float) -> dict[str, Any]:
    import socket

    doc.open_store()
    started = time.monotonic()
    result: dict[str, Any] = {"host": socket.gethostname(), "local_rank": doc.local_rank, "pid": os.getpid(),
                              "device": str(doc.device)}
    try:
        doc.init_group()
    except (RuntimeError, ValueError) as exc:
        result["error"] = describe(exc)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _local_versions(doc: RankContext, deadline: float) -> dict[str, Any]:
    versions = library_versions(device=True, own=False)
    # Said in words, as the check prints them.
    return {k: v or ("none" if k in ("cuda", "nccl") else "not installed") for k, v in versions.items()}


def _local_environment(doc: RankContext, deadline: float) -> dict[str, Any]:
    return {"env": {k: v for k, v in sorted(os.environ.items()) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}}


def _local_memory(doc: RankContext, deadline: float) -> dict[str, Any]:
    import psutil
    import torch

    if doc.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(doc.device)
        kind = f"{doc.device} memory"
    else:
        vm = psutil.virtual_memory()
        free, total, kind = vm.available, vm.total, "host memory"
    return {"kind": kind, "free_gb": round(free / 2**30, 3), "total_gb": round(total / 2**30, 3)}


def _mismatch(got: Any, expected: Any) -> str | None:
    """None when the tensors are equal, else where and how they differ."""
    wrong = (got != expected).nonzero()
    if len(wrong) == 0:
        return None
    i = int(wrong[0])
    return f"element {i} is {got[i].item():g}, expected {expected[i].item():g} ({len(wrong)} of {got.numel()} wrong)"


def _exchange(doc: RankContext, peer: int, deadline: float) -> dict[str, Any]:
    """1 MiB each way with ``peer``: the lower rank sends first; its round trip is the pair's time."""
    import torch.distributed as dist

    outgoing, incoming = doc.full(doc.rank * doc.world + peer), doc.full(-1)
    steps = [(dist.isend, outgoing), (dist.irecv, incoming)]
    started = time.perf_counter()
    try:
        for op, buf in steps if doc.rank < peer else steps[::-1]:
            doc.wait(op(buf, peer), deadline)
    except (RuntimeError, TimeoutError) as exc:
        return {"peer": peer, "error": describe(exc)}
    result: dict[str, Any] = {"peer": peer, "ms": round((time.perf_counter() - started) * 1e3, 3)}
    if doc.injected("p2p", "wrong"):
        incoming.add_(1)
    wrong = _mismatch(incoming, doc.full(peer * doc.world + doc.rank))
    if wrong:
        result["wrong"] = f"from rank {peer}: {wrong}"
    return result


def _local_p2p(doc: RankContext, deadline: float) -> dict[str, Any]:
    pairs = [pair for rnd in round_robin_rounds(doc.world) for pair in rnd if doc.rank in pair]
    exchanges = [_exchange(doc, b if a == doc.rank else a, deadline) for a, b in pairs]
    errors = [f"with rank {x['peer']}: {x['error']}" for x in exchanges if "error" in x]
    return {"pairs": exchanges, **({"error": errors[0]} if errors else {})}


# (start the operation, its output, the output it must produce); output None: nothing to verify
_Spec = tuple[Callable[[], Any], Any, Any]


def _spec_all_reduce(doc: RankContext) -> _Spec:
    import torch.distributed as dist

    out, expected = doc.full(0), doc.full(doc.world * (doc.world + 1) / 2)
    return lambda: dist.all_reduce(out.fill_(doc.rank + 1), async_op=True), out, expected


def _blocks(doc: RankContext, scale: float) -> tuple[Any, int]:
    """``scale * (i + 1)`` in block i of ``world`` blocks of 1 MiB in all, and the block size."""
    import torch

    block = max(1, PAYLOAD_NUMEL // doc.world)
    values = torch.arange(1, doc.world + 1, dtype=torch.float32, device=doc.device) * scale
    return values.repeat_interleave(block), block


def _spec_all_gather(doc: RankContext) -> _Spec:
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    expected, block = _blocks(doc, 1.0)
    out = doc.full(0, expected.numel())
    return lambda: gather(out, doc.full(doc.rank + 1, block), async_op=True), out, expected


def _spec_reduce_scatter(doc: RankContext) -> _Spec:
    import torch.distributed as dist

    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # as above
    contribution, block = _blocks(doc, doc.rank + 1.0)
    out = doc.full(0, block)
    expected = doc.full((doc.rank + 1) * doc.world * (doc.world + 1) / 2, block)
    return lambda: reduce_scatter(out, contribution, async_op=True), out, expected


def _spec_broadcast(doc: RankContext) -> _Spec:
    import torch
    import torch.distributed as dist

    pattern = (torch.arange(PAYLOAD_NUMEL, device=doc.device) % 251).float()
    out = doc.full(0)
    start = pattern if doc.rank == 0 else doc.full(0)
    return lambda: dist.broadcast(out.copy_(start), 0, async_op=True), out, pattern


def _spec_barrier(doc: RankContext) -> _Spec:
    import torch.distributed as dist

    return lambda: dist.barrier(async_op=True), None, None


_SPECS: dict[str, Callable[[RankContext], _Spec]] = {
    "all_reduce": _spec_all_reduce, "all_gather": _spec_all_gather, "reduce_scatter": _spec_reduce_scatter,
    "broadcast": _spec_broadcast, "barrier": _spec_barrier}


def _local_collective(doc: RankContext, deadline: float, name: str) -> dict[str, Any]:
    """One untimed then :data:`REPEATS` timed runs of a collective; the last result verified."""
    start, out, expected = _SPECS[name](doc)
    times = []
    for run in range(1 + REPEATS):
        started = time.perf_counter()
        try:
            work = start()
        except (RuntimeError, NotImplementedError) as exc:
            if run == 0 and "support" in str(exc).lower():  # refused up front, on every rank alike
                return {"unsupported": describe(exc)}
            raise
        doc.wait(work, deadline)
        times.append(round((time.perf_counter() - started) * 1e3, 3))
    result: dict[str, Any] = {"ms": times[1:]}
    if out is not None:
        if doc.injected(name, "wrong"):
            out.add_(1)
        wrong = _mismatch(out, expected)
        if wrong:
            result["wrong"] = wrong
    return result


def _ping(doc: RankContext, peer: int, deadline: float) -> tuple[float, float, float, float]:
    """One round: when this rank sent, the peer's clock (read once: receive and reply alike), when it got back."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(1, dtype=torch.float64, device=doc.device)
    sent = doc.clock()
    doc.wait(dist.isend(buf, peer), deadline)
    doc.wait(dist.irecv(buf, peer), deadline)
    peer_time = float(buf.item())
    return sent, peer_time, peer_time, doc.clock()


def _local_clock_skew(doc: RankContext, deadline: float) -> dict[str, Any]:
    """Rank 0 ping-pongs each rank in turn; the others answer with their clock."""
    import torch
    import torch.distributed as dist

    if doc.rank != 0:
        buf = torch.zeros(1, dtype=torch.float64, device=doc.device)
        for _ in range(SKEW_SAMPLES):
            doc.wait(dist.irecv(buf, 0), deadline)
            doc.wait(dist.isend(buf.fill_(doc.clock()), 0), deadline)
        return {}
    peers: list[dict[str, float]] = []
    for peer in range(1, doc.world):
        try:
            offset, rtt = ntp_offset([_ping(doc, peer, deadline) for _ in range(SKEW_SAMPLES)])
        except (RuntimeError, TimeoutError) as exc:
            return {"peers": peers, "error": f"rank {peer}: {describe(exc)}"}
        peers.append({"rank": peer, "offset_ms": round(offset * 1e3, 3), "rtt_ms": round(rtt * 1e3, 3)})
    return {"peers": peers}


# Each check's part on one rank: (the doctor, the check's deadline) -> its result.
LOCAL: dict[str, Callable[[RankContext, float], dict[str, Any]]] = {
    "init": _local_init, "versions": _local_versions, "environment": _local_environment, "memory": _local_memory,
    "p2p": _local_p2p, "clock_skew": _local_clock_skew,
    **{name: functools.partial(_local_collective, name=name) for name in COLLECTIVES}}
