"""Names of GPU kernels and CPU collectives -> what they are (pure string functions).

The kernel categories reproduce Holistic Trace Analysis 0.5.0 (``hta/utils/utils.py``) exactly, so that the
temporal breakdown and overlap numbers agree with it: COMMUNICATION is ``^nccl.*Kernel`` (which covers
both ``ncclKernel_*`` and the newer ``ncclDevKernel_*``), MEMORY is ``^Memcpy|^Memset|^dma``, COMPUTATION
is everything that matches none of NCCL, Memcpy, Memset or Sync, and the rest is OTHER.
"""

from __future__ import annotations

import re
from functools import lru_cache

COMPUTATION = "computation"
COMMUNICATION = "communication"
MEMORY = "memory"
OTHER = "other"
CATEGORIES = (COMPUTATION, COMMUNICATION, MEMORY, OTHER)

_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
# Same (odd) grouping as HTA: "^nccl.*Kernel" | ".*Memcpy" | "^Memset" | ".*Sync".
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# ncclKernel_AllReduce_RING_LL_Sum_float(...), ncclDevKernel_AllGather_RING_LL(...), ncclDevKernel_SendRecv(...)
_NCCL_KIND_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CAMEL_RE = re.compile(r"(?<!^)(?=[A-Z])")
# Collective op names with their underscores removed (c10d::_allgather_base_, nccl:_all_gather_base,
# c10d::reduce_scatter_tensor_coalesced_ ...) -> the collective's kind.
_OP_KINDS = {
    "allreduce": "all_reduce",
    "allreducecoalesced": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgathercoalesced": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
}
# The kinds that the per-kind communication tables keep apart; the others are summed as OTHER_KIND.
MAIN_KINDS = ("all_gather", "reduce_scatter", "all_reduce")
OTHER_KIND = "other"


@lru_cache(maxsize=65536)
def kernel_category(name: str) -> str:
    """HTA's kernel type of a GPU event name: computation, communication, memory or other."""
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


@lru_cache(maxsize=4096)
def nccl_kind(name: str) -> str:
    """Collective kind of an NCCL kernel in snake case (``all_reduce``, ``send_recv`` ...), else ``""``."""
    match = _NCCL_KIND_RE.match(name)
    if not match:
        return ""
    return _CAMEL_RE.sub("_", match.group(1)).lower()


def _op_kind(core: str) -> str:
    core = core.strip("_")
    return _OP_KINDS.get(core.replace("_", ""), core)


@lru_cache(maxsize=4096)
def c10d_kind(name: str) -> str:
    """Collective kind of a ``c10d::*`` CPU op (``c10d::_allgather_base_`` -> ``all_gather``), else ``""``."""
    return _op_kind(name[len("c10d::") :]) if name.startswith("c10d::") else ""


@lru_cache(maxsize=4096)
def nccl_op_kind(name: str) -> str:
    """Collective kind of an ``nccl:*`` CPU annotation (``nccl:_all_gather_base`` -> ``all_gather``), else ``""``.

    It names the collective that the NCCL kernel launched under it runs: an all-to-all runs as
    ``ncclKernel_SendRecv``, a reduce-scatter may run as a generic kernel.
    """
    return _op_kind(name[len("nccl:") :]) if name.startswith("nccl:") else ""


def kind_bucket(kind: str) -> str:
    """The row of the per-kind tables a collective kind goes to: a :data:`MAIN_KINDS` or ``other``."""
    return kind if kind in MAIN_KINDS else OTHER_KIND


def gloo_kind(name: str) -> str:
    """Collective kind of a ``gloo:*`` span (``gloo:all_reduce`` -> ``all_reduce``)."""
    return name.split(":", 1)[1] if name.startswith("gloo:") else ""


# The gloo span a c10d collective runs as, when it is not the collective's own kind.
GLOO_RUNS_AS = {"reduce_scatter": "all_reduce"}
# The kinds of c10d ops that start no gloo span of a collective.
NO_GLOO_SPAN = ("", "barrier", "wait", "monitored_barrier")


def short_kernel_name(name: str) -> str:
    """A kernel name without its argument list, for tables (``void f<T>(int)`` -> ``void f<T>``)."""
    cut = name.find("(")
    return name[:cut] if cut > 0 else name
