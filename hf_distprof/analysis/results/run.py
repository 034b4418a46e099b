"""The run as read from disk besides the traces' events (plain data): the files found, the step timer's records
and summary, and the run manifest's account (hosts, windows, what is missing), as ``analyze`` reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hf_distprof.analysis.results.rank import FileError
from hf_distprof.analysis.results.timer import TimerRecords, TimingSummary


@dataclass
class RankClock:
    """One rank's clock against rank 0's, measured at train start (None: not measured)."""

    rank: int
    host: str
    offset_us: float | None
    """This rank's clock minus rank 0's, in microseconds."""
    uncertainty_us: float | None
    """Half the shortest round trip of the measurement: the true offset lies within this of ``offset_us``."""

@dataclass
class WindowInfo:
    """One profiler window as the manifest has it."""

    first: int
    last: int
    reasons: list[str]
    detail: str
    ranks: list[int]
    cut_short_ranks: list[int] = field(default_factory=list)

@dataclass
class RunSummary:
    """What ``analyze`` reports from a run folder's manifest."""

    path: str
    """The manifest file read, or the parts' glob when it was assembled from them."""
    complete: bool
    world_size: int
    hosts: list[dict[str, Any]]
    clocks: list[RankClock]
    windows: list[WindowInfo]
    missing_files: list[str]
    """One sentence per file the manifest lists that the folder does not hold (a lost trace)."""
    unfinished_ranks: list[int] = field(default_factory=list)
    absent_ranks: list[int] = field(default_factory=list)
    profile_ranks: str | None = None
    """``--profile-ranks`` as the run was given it (None in older manifests, or without the flag: every rank)."""
    crashed_ranks: list[int] = field(default_factory=list)
    """Ranks whose crash file (``rank{R}_crash.txt``: a fatal signal's stack) is in the folder, not empty."""
    raised_ranks: list[int] = field(default_factory=list)
    """Ranks whose exception file (``rank{R}_exception.txt``: an uncaught exception ended them) is in the folder."""
    stopped_ranks: list[int] = field(default_factory=list)
    """Ranks whose stop file (``rank{R}_stopped.txt``: a signal's default action ended them) is in the folder."""
    job: dict[str, Any] | None = None
    """Rank 0's launcher, ids and restart counts (:func:`hf_distprof.core.job.job_record`); None in older manifests."""

    def clock_offsets_us(self) -> dict[int, float]:
        """Measured offsets by rank (ranks without a measurement left out)."""
        return {c.rank: c.offset_us for c in self.clocks if c.offset_us is not None}


@dataclass
class RunInput:
    """Everything ``analyze`` reads from disk but the traces' events, read once, first
    (:func:`hf_distprof.analysis.read.run.read_run`); the traces themselves are read in the workers, one per rank."""

    files: list[str]
    """The trace files, in the order found."""
    records: TimerRecords
    """The step timer's per-step records beside the traces (empty without any)."""
    summary: TimingSummary
    """The step timer's ``timing_summary.json`` beside the traces."""
    run: RunSummary | None
    """The run manifest's account; None without a manifest."""
    errors: list[FileError] = field(default_factory=list)
    """Manifests that could not be read."""
