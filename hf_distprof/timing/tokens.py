"""Token counts of the steps a recorder resolves: its micro-batches' attention masks (held until a logging step, as the
batch gave them) counted then, a mask's non-zero entries (its sum, for the 0/1 masks tokenizers make).

Host tensors (a CPU run's masks) are counted through numpy: a torch operator between the model's kernels costs 10-25
us each, numpy's ``count_nonzero`` a few. Device tensors are counted on their device and read in one copy per device:
one ``int()`` per mask would be one device-to-host sync each.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch


def grouped_counts(tensors: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """Each tensor's token count, as int64 on its own device: a mask's non-zero entries, a 0-d tensor's value (a count
    folded earlier). For each device: the indices of its tensors and a 1-D tensor of their counts, in that order. One
    small kernel per tensor (``count_nonzero``: no copy of the masks, which a logging step near the memory limit
    could not afford) and one stack of the counts, and no copy between host and device, so never a wait for it."""
    by_device: dict[torch.device, list[int]] = {}
    for k, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(k)
    return [(indices, torch.stack([tensors[k].to(torch.int64) if tensors[k].dim() == 0 else
                                   torch.count_nonzero(tensors[k]) for k in indices]))
            for indices in by_device.values()]


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
    for indices, sums in grouped_counts([t for _, t in held]):  # one read per device
        for k, value in zip(indices, sums.tolist(), strict=True):
            counts[held[k][0]] += value
    return counts
