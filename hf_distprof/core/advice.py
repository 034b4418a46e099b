"""What to try when one phase of one rank's step holds the other ranks back: the one wording for the live step
timer's warning and the trace analysis's findings (torch-free, so the analysis layer can import it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

_SLOWER_COMPUTE = (
    "check for uneven sequence lengths across ranks (pad to a fixed length or use --group_by_length), a slower "
    "or throttled device (nvidia-smi -q -d PERFORMANCE,CLOCK), or other processes sharing that device or host"
)

_DATA = (
    "its input pipeline is the bottleneck: {asks}pre-tokenize the dataset instead of "
    "tokenizing in the collator, and check that host for CPU or disk contention"
)


@dataclass(frozen=True)
class LoaderSettings:
    """The training DataLoader as the run used it (rank 0's; ``timing_summary.json``'s ``dataloader``): the data
    loading advice asks for what is not set already (a trial's run with 2 persistent workers was told "num_workers > 0,
    persistent_workers=True")."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool
    prefetch_factor: int | None
    """Batches each worker loads ahead (None without workers)."""
    dispatched: bool = False
    """accelerate dispatches the batches (``dispatch_batches``, its default for an ``IterableDataset``): rank 0 loads
    every rank's and sends them."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def loader_from_json(doc: Any) -> LoaderSettings | None:
    """:meth:`LoaderSettings.to_json` read back; None when absent or of the wrong types."""
    if not isinstance(doc, dict):
        return None
    workers, prefetch = doc.get("num_workers"), doc.get("prefetch_factor")
    flags = [doc.get(k) for k in ("persistent_workers", "pin_memory", "dispatched")]
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0 or not all(
            isinstance(f, bool) for f in flags) or not (prefetch is None or (isinstance(prefetch, int)
                                                                            and not isinstance(prefetch, bool))):
        return None
    return LoaderSettings(workers, flags[0], flags[1], prefetch, flags[2])


def loading_asks(on_gpu: bool, loader: LoaderSettings | None) -> str:
    """What to set to load data ahead of the step, leaving out what ``loader`` sets already (the flags of the
    Trainer: ``--dataloader_num_workers`` ...); the generic list without settings."""
    pin = on_gpu and (loader is None or not loader.pin_memory)
    if loader is None:
        return "raise --dataloader_num_workers, " + ("set --dataloader_pin_memory, " if pin else "")
    asks = []
    if loader.dispatched:
        asks.append("give each rank its own shard of the data and set --accelerator_config "
                    "'{\"dispatch_batches\": false}' (accelerate now dispatches the batches: rank 0 loads every rank's "
                    "and sends them)")
    if loader.num_workers == 0:
        asks.append("raise --dataloader_num_workers (0 now: the training process loads each batch between steps)")
    else:
        asks.append(f"raise --dataloader_num_workers above its {loader.num_workers}")
        if not loader.persistent_workers:
            asks.append("set --dataloader_persistent_workers (the workers restart every epoch now)")
        if loader.prefetch_factor is not None:
            asks.append(f"raise --dataloader_prefetch_factor above its {loader.prefetch_factor}")
    if pin:
        asks.append("set --dataloader_pin_memory")
    return ", ".join(asks) + ", "


PHASE_ADVICE = {
    "data": _DATA.format(asks=loading_asks(True, None)),
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


def load_ahead(on_gpu: bool, loader: LoaderSettings | None) -> str:
    """A data-loading finding's first thing to try: the DataLoader settings that load ahead of the step, those
    ``loader`` has already left out."""
    if loader is None:
        return (f"Load data ahead of the step: DataLoader num_workers > 0, {'pin_memory=True, ' if on_gpu else ''}"
                "persistent_workers=True, prefetch_factor")
    return "Load data ahead of the step: " + loading_asks(on_gpu, loader).removesuffix(", ")


def phase_advice(phase: str, on_gpu: bool = True, loader: LoaderSettings | None = None) -> str:
    """What to try for a rank slow in ``phase``, phrased after "rank R: "; a run without a GPU gets no advice that
    only a GPU run can use (pinned memory speeds copies to a GPU; nvidia-smi reads a GPU's clocks); data loading's
    leaves out what ``loader`` sets already (:func:`loading_asks`)."""
    if phase == "data":
        return _DATA.format(asks=loading_asks(on_gpu, loader))
    if on_gpu:
        return PHASE_ADVICE.get(phase, PHASE_ADVICE["compute"])
    if phase == "optimizer":
        return PHASE_ADVICE["optimizer"].replace("a slower device or host", "a slower or busier host")
    what = {"forward": "its forward compute", "backward": "its backward compute"}.get(phase, "its compute")
    return f"{what} is slower: {_SLOWER_HOST}"
