"""What to try when one phase of one rank's step holds the other ranks back: the one wording for the live step
timer's warning and the trace analysis's findings (torch-free, so the analysis layer can import it)."""

from __future__ import annotations

_SLOWER_COMPUTE = (
    "check for uneven sequence lengths across ranks (pad to a fixed length or use --group_by_length), a slower "
    "or throttled device (nvidia-smi -q -d PERFORMANCE,CLOCK), or other processes sharing that device or host"
)

_DATA = (
    "its input pipeline is the bottleneck: raise --dataloader_num_workers, {pin}pre-tokenize the dataset instead of "
    "tokenizing in the collator, and check that host for CPU or disk contention"
)

PHASE_ADVICE = {
    "data": _DATA.format(pin="set --dataloader_pin_memory, "),
    "forward": f"its forward compute is slower: {_SLOWER_COMPUTE}",
    "backward": f"its backward compute is slower: {_SLOWER_COMPUTE}",
    "optimizer": (
        "its optimizer step is slower: look for work only that rank does around optimizer.step() (gradient "
        "clipping or logging on one rank, an optimizer state that is not sharded evenly), or a slower device or host"
    ),
    "compute": f"its compute is slower: {_SLOWER_COMPUTE}",
}
"""phase -> what to try, phrased after "rank R: "."""

PHASE_NAMES = {
    "data": "data loading",
    "forward": "forward",
    "backward": "backward compute",
    "optimizer": "optimizer step",
    "compute": "compute (forward, backward and optimizer)",
}
"""phase -> how a finding names it."""


_SLOWER_HOST = (
    "check for uneven sequence lengths across ranks (pad to a fixed length or use --group_by_length), and that rank's "
    "host for other processes sharing its cores"
)


def phase_advice(phase: str, on_gpu: bool = True) -> str:
    """What to try for a rank slow in ``phase``, phrased after "rank R: "; a run without a GPU gets no advice that
    only a GPU run can use (pinned memory speeds copies to a GPU; nvidia-smi reads a GPU's clocks)."""
    if on_gpu:
        return PHASE_ADVICE.get(phase, PHASE_ADVICE["compute"])
    if phase == "data":
        return _DATA.format(pin="")
    if phase == "optimizer":
        return PHASE_ADVICE["optimizer"].replace("a slower device or host", "a slower or busier host")
    what = {"forward": "its forward compute", "backward": "its backward compute"}.get(phase, "its compute")
    return f"{what} is slower: {_SLOWER_HOST}"
