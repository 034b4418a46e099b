"""Token counts of the steps a recorder resolves: its micro-batches' attention masks (held until a logging step, as the
batch gave them) counted then, a mask's non-zero entries (its sum, for the 0/1 masks tokenizers make).

Host tensors (a CPU run's masks) are counted through numpy: a torch operator between the model's kernels costs 10-25
us each, numpy's ``count_nonzero`` a few. Device tensors are counted on their device, one kernel per group of masks of
one shape and dtype, and read in one copy per device: one ``int()`` per mask would be one device-to-host sync each.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch


def grouped_counts(tensors: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Each tensor's token count, as int64 on its own device: a mask's non-zero entries, a 0-d tensor's value (a count
    folded earlier). For each group of tensors of one device, shape and dtype (the micro-batches' masks are mostly one
    group): their indices and a 1-D tensor of their counts, in that order. One stack and one kernel per group, and no
    copy between host and device, so never a wait for the device."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, t in enumerate(tensors):
        groups.setdefault((t.device, t.shape, t.dtype), []).append(k)
    out = []
    for indices in groups.values():
        first = tensors[indices[0]]
        stacked = torch.stack([tensors[k] for k in indices]) if len(indices) > 1 else first.unsqueeze(0)
        if first.dim() == 0:
            counts = stacked.to(torch.int64)
        else:
            counts = torch.count_nonzero(stacked.reshape(len(indices), first.numel()), dim=1)
        out.append((indices, counts))
    return out


def host_count(t: torch.Tensor) -> int | None:
    """A host tensor's token count (as :func:`grouped_counts` counts) through numpy; None when numpy cannot read it (a
    dtype numpy lacks, a tensor that needs its gradient)."""
    try:
        array = t.numpy()
    except (TypeError, RuntimeError):
        return None
    return int(array) if array.ndim == 0 else int(numpy.count_nonzero(array))


def token_counts(steps: list[list[Any]]) -> list[int]:
    """The tokens of each step, given as its micro-batches' counts: ints, or tensors (masks, or counts folded from
    them)."""
    counts = [0] * len(steps)
    held: list[tuple[int, torch.Tensor]] = []
    for i, step in enumerate(steps):
        for t in step:
            if not isinstance(t, torch.Tensor):
                counts[i] += int(t)
                continue
            n = host_count(t) if t.is_cpu else None
            if n is None:
                held.append((i, t))
            else:
                counts[i] += n
    if not held:
        return counts
    by_device: dict[torch.device, list[tuple[list[int], torch.Tensor]]] = {}
    for indices, sums in grouped_counts([t for _, t in held]):
        by_device.setdefault(sums.device, []).append((indices, sums))
    for groups in by_device.values():
        values = (torch.cat([sums for _, sums in groups]) if len(groups) > 1 else groups[0][1]).tolist()
        for k, value in zip((k for indices, _ in groups for k in indices), values, strict=True):
            counts[held[k][0]] += value
    return counts
