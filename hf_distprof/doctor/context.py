"""What a check needs of the rank running it: the interface :class:`hf_distprof.doctor.runner.Doctor` offers to
:mod:`hf_distprof.doctor.checks` (each rank's part of a check) and :mod:`hf_distprof.doctor.judge` (rank 0's verdict).

A protocol, so that the checks and the judge depend on this small interface and not on the runner, which uses them:
no import circle, not even one that only a type checker sees.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class RankContext(Protocol):
    """One rank of ``hf-distprof doctor``: who it is, its device and process group, and the bounded waits."""

    args: argparse.Namespace
    rank: int
    world: int
    local_rank: int
    expected_world: int
    backend: str
    device: Any
    """The torch device the collectives' tensors live on."""

    def injected(self, check: str, mode: str) -> bool:
        """Whether the test-only fault ``mode`` applies to ``check`` on this rank."""
        ...

    def clock(self) -> float:
        """Wall-clock time (one hour ahead under the injected clock fault)."""
        ...

    def open_store(self) -> None:
        """Reach the rendezvous store (the init check)."""
        ...

    def init_group(self) -> None:
        """Create the process group (the init check)."""
        ...

    def full(self, value: float, numel: int = ...) -> Any:
        """A payload tensor on the device, filled with ``value``."""
        ...

    def wait(self, work: Any, deadline: float) -> None:
        """Wait for an asynchronous collective until ``deadline``."""
        ...
