"""``--max-trace-mb``: how many steps a window may record so that its trace stays under the limit.

The first window is the measurement: each rank that traced it divides its trace file's size (gzipped, as on
disk) by the steps it recorded, and sends that with the note it gathers on the next agreement step. The largest
rank's figure counts, so every rank computes the same allowance from the same gathered notes and every window
stays the same steps on every rank. Windows that start after the measurement record at most
``floor(limit / bytes per step)`` active steps (never more than asked); warm-up steps are not written and are
left as they are. A window in which not even one step fits is skipped.

The guard shortens windows and never changes the profiler's options mid-run: traces of one run must be recorded
alike to be compared (rank with rank, window with window). Its message names the costliest option that is on,
for the user to turn off in the next run.

Nothing here reads a file or a process group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MB = 1_000_000  # --max-trace-mb counts decimal megabytes, like the file sizes `ls -lh --si` and browsers show

# The profiler's options by what they add to a trace, costliest first, as benchmarks/bench_profiler_options.py
# measured them on the tiny ModernBERT (CPU, 6 steps; the guide's table "The schedule"): stacks +71%, memory
# events +33%, shapes +28% (FLOPs record shapes too: +28%).
OPTION_COST_ORDER = (
    ("with_stack", "--profiler-with-stack", "about +70% trace size"),
    ("profile_memory", "--profiler-profile-memory", "about +33%"),
    ("record_shapes", "--profiler-record-shapes", "about +28%"),
    ("with_flops", "--profiler-with-flops", "about +28%, it records shapes too"),
)


def costliest_option(options: Mapping[str, bool]) -> str | None:
    """The costliest profiler option that is on, as ``--flag (why)``; None when none is."""
    for name, flag, cost in OPTION_COST_ORDER:
        if options.get(name):
            return f"{flag} ({cost})"
    return None


@dataclass
class TraceBudget:
    """The limit and, once measured, the largest bytes per recorded step of any rank's first window.

    Args:
        limit_mb: ``--max-trace-mb``.
        active_steps: ``--profiler-active-steps``: what a window records when it fits.
    """

    limit_mb: float
    active_steps: int
    bytes_per_step: float | None = None
    measured_by: int | None = None
    measured_at: int | None = None

    @property
    def limit_bytes(self) -> float:
        return self.limit_mb * MB

    def add(self, step: int, per_rank: Iterable[tuple[int, float | None]]) -> bool:
        """Take every rank's bytes per step gathered on agreement step ``step``; True when the figure changed.

        The largest figure so far counts (ties: the lowest rank); ranks that traced nothing send None.
        """
        changed = False
        for rank, value in sorted(per_rank):
            if value is not None and (self.bytes_per_step is None or value > self.bytes_per_step):
                self.bytes_per_step, self.measured_by, self.measured_at = float(value), rank, step
                changed = True
        return changed

    def allowed_steps(self) -> int:
        """Active steps a window may record: ``active_steps`` before the measurement; 0 when none fits."""
        if self.bytes_per_step is None or self.bytes_per_step <= 0:
            return self.active_steps
        return min(self.active_steps, math.floor(self.limit_bytes / self.bytes_per_step))

    def message(self, options: Mapping[str, bool]) -> str:
        """What the measurement means for the windows to come (empty when they fit as asked)."""
        allowed = self.allowed_steps()
        if self.bytes_per_step is None or allowed >= self.active_steps:
            return ""
        per_step = self.bytes_per_step / MB
        # (A rank's first trace: with --profile-ranks auto a rank may trace first in a later window.)
        measured = (f"--max-trace-mb {self.limit_mb:g}: the largest first trace (rank {self.measured_by}'s) "
                    f"holds {per_step:.3f} MB per recorded step")
        drop = costliest_option(options)
        hint = f"turn off {drop} or raise --max-trace-mb" if drop else "raise --max-trace-mb"
        if allowed == 0:
            return (f"{measured}, more than the limit: the windows that start after this step are skipped on every "
                    f"rank ({hint})")
        return (f"{measured}: the windows that start after this step record {allowed} of {self.active_steps} active "
                f"steps (about {allowed * per_step:.3f} MB), on every rank ({hint})")

    def first_window_message(self, size_bytes: int, steps: int) -> str:
        """A warning when the measuring window itself is over the limit (it is kept whole); empty otherwise."""
        if size_bytes <= self.limit_bytes:
            return ""
        return (f"--max-trace-mb {self.limit_mb:g}: the first window's trace is {size_bytes / MB:.3f} MB for {steps} "
                "steps, over the limit; it is kept whole (it is the measurement), and the windows that start after the "
                "ranks agree on it are shortened (a window already begun is not)")
