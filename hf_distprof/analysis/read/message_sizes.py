"""A collective's message size from what a trace records about it (pure functions over decoded values).

Two sources: ``record_param_comms`` ops, whose ``args`` state element counts, a c10::ScalarType name and the
group size (newer PyTorch with NCCL); and the ``Input Dims`` / ``Input type`` that the profiler records on
every op with ``record_shapes``, read on the ``nccl:*`` / ``gloo:*`` annotations (the collective's input
tensors) and the ``c10d::*`` ops (an (output, input) pair for ``_allgather_base_`` and the like).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

# Bytes per element, by the names traces give dtypes: c10::ScalarType names in ``record_param_comms``'s
# "dtype", C++ type names in "Input type" (as torch 2.13 writes them).
_DTYPE_NAMES = {
    1: ("Bool", "Byte", "Char", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz")
    + ("bool", "unsigned char", "signed char", "c10::Float8_e4m3fn", "c10::Float8_e5m2")
    + ("c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz"),
    2: ("Half", "BFloat16", "Short", "UInt16", "c10::Half", "c10::BFloat16", "short int", "short unsigned int"),
    4: ("Float", "Int", "UInt32", "ComplexHalf", "float", "int", "unsigned int", "c10::complex<c10::Half>"),
    8: ("Double", "Long", "UInt64", "ComplexFloat", "double", "long int", "long unsigned int", "c10::complex<float>"),
    16: ("ComplexDouble", "c10::complex<double>"),
}
DTYPE_BYTES = {name: width for width, names in _DTYPE_NAMES.items() for name in names}


@dataclass(frozen=True)
class MessageSize:
    """What one CPU event says about the size of the collective it issues or runs.

    ``record_param_comms`` gives both sides; an annotation with recorded shapes gives its input tensors,
    a ``c10d::*`` op with an (output, input) pair of tensors both. Which side is *the* size of a collective
    depends on its kind (see :func:`hf_distprof.analysis.read.message_sizes.message_bytes`).
    """

    in_bytes: int | None
    out_bytes: int | None
    group_size: int | None = None


def from_param_comms(
    in_nelems: int | None, out_nelems: int | None, dtype: Any, group_size: int | None
) -> MessageSize | None:
    """The size stated by a ``record_param_comms`` op; None without a known dtype or any element count."""
    width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
    if width is None or (in_nelems is None and out_nelems is None):
        return None
    return MessageSize(
        None if in_nelems is None else in_nelems * width,
        None if out_nelems is None else out_nelems * width,
        group_size,
    )


def from_shapes(name: str, dims: bytes, types: bytes) -> MessageSize | None:
    """The size an op or annotation named ``name`` records in its shapes (the JSON of its ``Input Dims``
    and ``Input type``); None when they say nothing usable.

    A ``c10d::*`` op counts when its first two arguments are tensors of known dtype: (output, input), as
    in ``_allgather_base_``; one on tensor lists (``allreduce_``) records no dtype. An ``nccl:*`` or
    ``gloo:*`` annotation records the collective's input tensors, summed.
    """
    tensors = tensor_bytes(dims, types)
    if name.startswith("c10d::"):
        if len(tensors) < 2 or tensors[0] is None or tensors[1] is None:
            return None
        return MessageSize(tensors[1], tensors[0])
    if not tensors or any(t is None for t in tensors):
        return None
    return MessageSize(sum(t or 0 for t in tensors), None)


def tensor_bytes(dims: bytes, types: bytes) -> list[int | None]:
    """Bytes of each leading tensor argument, from the recorded shapes; None for a tensor (list) of
    unknown dtype, such as the ``TensorList`` of ``c10d::allreduce_``.

    The list stops at the first argument that is not a tensor. Empty when the shapes are malformed: they
    size a table, so a shape that cannot be read leaves that collective without a size.
    """
    try:
        shapes, dtypes = msgspec.json.decode(dims), msgspec.json.decode(types)
    except msgspec.DecodeError:
        return []
    if not isinstance(shapes, list) or not isinstance(dtypes, list):
        return []
    out: list[int | None] = []
    for shape, dtype in zip(shapes, dtypes):
        flat = isinstance(shape, list) and all(type(d) is int for d in shape)
        width = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if width is not None and flat:
            out.append(math.prod(shape) * width)  # a 0-d tensor has shape [] and one element
        elif dtype == "TensorList" or (flat and shape):
            out.append(None)
        else:
            break
    return out


def message_bytes(kind: str, in_bytes: int | None, out_bytes: int | None, group_size: int | None) -> int | None:
    """A collective's size S as nccl-tests define it, from what the trace recorded.

    Args:
        kind: The collective's kind (``all_gather`` ...).
        in_bytes: Bytes of its input on this rank, if recorded.
        out_bytes: Bytes of its output on this rank, if recorded.
        group_size: Ranks in its group; derives an all_gather's output from its input, or a
            reduce_scatter's input from its output, when only one side is recorded.

    Returns:
        S in bytes, or None when the recorded side cannot give it.
    """
    if kind == "all_gather":
        if out_bytes is not None:
            return out_bytes
        return in_bytes * group_size if in_bytes is not None and group_size else None
    if kind == "reduce_scatter":
        if in_bytes is not None:
            return in_bytes
        return out_bytes * group_size if out_bytes is not None and group_size else None
    return in_bytes if in_bytes is not None else out_bytes
