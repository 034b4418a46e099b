"""Rank, world and host identity, valid before and after the process group is initialised."""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any

import torch.distributed as dist

_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def is_distributed() -> bool:
    """Whether a default process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank: the process group's, else the launcher's ``RANK``, else 0."""
    if is_distributed():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def get_world_size() -> int:
    """World size: the process group's, else the launcher's ``WORLD_SIZE``, else 1."""
    if is_distributed():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_local_rank() -> int:
    """Rank within this node, from the launcher's ``LOCAL_RANK`` (0 when unset)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_hostname() -> str:
    """Short host name, safe to put in a file name."""
    host = socket.gethostname().split(".")[0] or "host"
    return _HOST_UNSAFE.sub("-", host)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Broadcast one picklable object from ``src`` to every rank; a no-op without a process group.

    Used once at train start (never in the step loop) so that all ranks agree on a run folder.
    """
    if not is_distributed() or get_world_size() == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Gather one picklable object from every rank; ``[obj]`` without a process group.

    Callers use it on logging steps only: it is a collective.
    """
    if not is_distributed() or get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank; a no-op without a process group. Only used at train end."""
    if is_distributed() and get_world_size() > 1:
        dist.barrier()


class RankPrefixAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with ``[RANK n]`` so interleaved multi-rank logs stay readable."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[RANK {get_rank()}] {msg}", kwargs


def get_logger(name: str) -> RankPrefixAdapter:
    """A module logger whose messages carry the rank."""
    return RankPrefixAdapter(logging.getLogger(name), {})
