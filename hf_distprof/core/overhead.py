"""Is the profiler distorting the run: the traced steps against the untraced steps after the window's start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from hf_distprof.core.stats import scaled_mad
from hf_distprof.core.text import apart


MIN_REFERENCE = 6
"""Fewest untraced steps the profiler's slowdown is judged against: a ratio to fewer (a run's four wait steps, which
are also its slowest warm-up) says more about those steps than about the profiler."""


NEAREST = 12
"""Untraced steps the slowdown is judged against at most, the nearest to the window: a shared host's load changes
over a run (a clean run's steps went from 0.7 s to 0.35 s when other work stopped after its window), so the steps
around the window are the ones that ran under its conditions."""


@dataclass
class ProfilerSlowdown:
    """Steps inside the profiler's windows against the untraced steps on both sides of them."""

    steps_inside: int
    steps_before: int
    steps_after: int
    median_step_s_inside: float | None
    median_step_s_before: float | None
    median_step_s_after: float | None
    ratio: float | None
    """Median step inside / median untraced step after the first window's start (the steps before it left out: a run's
    first steps run slower); None
    with fewer than ``min_outside`` untraced steps (see ``note``)."""
    threshold_ratio: float
    options: dict[str, bool]
    warning: str | None
    confidence: float | None = None
    """Share of the traced steps slower than ``threshold_ratio`` times the reference median."""
    median_step_s_reference: float | None = None
    """The median of the untraced steps after the first window starts: what ``ratio`` divides by (``steps_before``
    and ``median_step_s_before`` describe the steps before it, left out: a run's first steps run slower)."""
    noise_pct: float | None = None
    """The run's own noise for this ratio (:func:`slowdown_noise_pct`, % of the untraced median): a ratio within
    1 +- this is no slowdown the run can tell from its noise."""
    note: str | None = None
    """Why there is no ratio ("not enough untraced steps ..."); None when there is one."""
    cpu_wait_s_inside: float | None = None
    """The median over the traced steps of the wait for a CPU before the sync (the run queue) of the rank last to it;
    None without it (no host timing: a GPU's step timer times the device)."""
    cpu_wait_s_reference: float | None = None
    """The same over the reference steps."""
    steps_left_out: list[int] = field(default_factory=list)
    """Steps the profiler ran over that are not among ``steps_inside``: after a pause (an evaluation, a checkpoint, a
    window's export: they wait for the slowest rank's), said beside the count (a trial's window of 5 steps read as
    "the 4 steps under the profiler")."""
    cost: str | None = None
    """What the warning names as the cost: ``cpu_wait`` (measured: the wait for a CPU grew by most of the slowdown),
    ``options`` (the costly options that are on) or ``profiler`` (its own per-op bookkeeping); None without a
    warning."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


CPU_SHARE = 0.5
"""A slowdown is said as the host's CPUs taken when the last rank's wait for a CPU rose by at least this share of it."""

# What each profiler option costs (measured: docs/measurements.md), most costly first.
OPTION_COST = (
    ("with_stack", "--profiler-with-stack"),
    ("record_shapes", "--profiler-record-shapes"),
    ("profile_memory", "--profiler-profile-memory"),
    ("with_flops", "--profiler-with-flops"),
)


def beyond_noise(ratio: float, noise_pct: float) -> bool:
    """Whether a traced/untraced ratio lies further from 1 than the run's own noise (:func:`slowdown_noise_pct`): a
    ratio within it is no slowdown (nor speed-up) the run can tell from its noise."""
    return abs(100.0 * (ratio - 1.0)) > noise_pct


def slowdown_noise_pct(
    inside: Sequence[float], reference: Sequence[float], mid: float, before: Sequence[float] = ()
) -> float:
    """How far from 1.0 the traced/untraced ratio of a run the profiler does not slow can fall, in % of ``mid``: the
    largest of the untraced steps' step-to-step variation, the traced steps' own, the drift between the first and
    the second half of the untraced steps, and between them and the steps before the window (a shared host's load
    moves during a run; its steps before the window, the warm-up, are not compared but say how much)."""
    parts = [scaled_mad(reference) / mid]
    if len(inside) >= 2 and median(inside) > 0:
        parts.append(scaled_mad(inside) / median(inside))
    half = len(reference) // 2
    if half >= 2:
        parts.append(abs(median(reference[:half]) - median(reference[half:])) / mid)
    if before:
        parts.append(abs(median(before) - mid) / mid)
    return 100.0 * max(parts)


def profiler_slowdown(
    steps: Mapping[int, float],
    inside: set[int],
    options: Mapping[str, bool],
    threshold_ratio: float = 1.25,
    min_outside: int = MIN_REFERENCE,
    cpu_wait: Mapping[int, float] | None = None,
    left_out: Sequence[int] = (),
) -> ProfilerSlowdown | None:
    """Compare the median step time inside the profiler's windows with the untraced steps after the first one starts.

    The reference is the :data:`NEAREST` untraced steps after the first window starts (between windows and after
    the last), warm-up excluded: the untraced steps before the first window are the run's warm-up, its slowest
    steps (allocations, caches; what the schedule's wait covers), which made a clean run's window read 0.75x. A
    shared host's load drifts, so steps far from the window are left out too. The slowdown is a warning only
    when the ratio is above ``threshold_ratio`` and beyond the untraced steps' own step-to-step noise.

    Args:
        steps: step number -> step time (seconds), warm-up steps already left out.
        inside: The step numbers the profiler traced (warmup and active phases).
        options: The profiler's options (``record_shapes`` ...), to name the likely cost.
        threshold_ratio: Warn above this ratio.
        min_outside: Fewest untraced steps for a ratio (:data:`MIN_REFERENCE`).
        cpu_wait: step number -> the wait for a CPU before the sync of the rank last to it in that step (seconds),
            when the step timer measured it: a slowdown that is mostly a rise of it is said as the host's CPUs taken
            (the profiler's threads, or other work, beside training on a host with no core to spare), as measured.
        left_out: Steps the profiler ran over that ``steps`` leaves out (after a pause), said beside the count.

    Returns:
        None when no step was profiled.
    """
    ins = [t for s, t in steps.items() if s in inside]
    if not ins:
        return None
    first = min(inside)
    before = [steps[s] for s in sorted(s for s in steps if s not in inside and s < first)]
    later = sorted(s for s in steps if s not in inside and s > first)[:NEAREST]
    after = [steps[s] for s in later]
    waits = _medians(cpu_wait, [s for s in steps if s in inside], later)
    ref = after  # the steps before the first window are the run's warm-up (the schedule's wait covers it)
    med = median(ins)
    mid = median(ref) if ref else None
    ratio = noise = note = confidence = warning = kind = None
    if len(ref) < min_outside:
        warm = "the one before it is" if len(before) == 1 else f"the {len(before)} before it are"
        # (Not "the run's warm-up": the verdicts judge those steps; only this comparison leaves them out. Trial U.)
        note = (f"not enough untraced steps to compare the profiler's window with: {len(after)} after its start "
                f"({warm} left out of this comparison: a run's first steps are its slowest), at least {min_outside} "
                "are needed (run more steps after the window)")
    elif mid is not None and mid > 0:
        ratio = med / mid
        noise = slowdown_noise_pct(ins, ref, mid, before)
        confidence = sum(t > threshold_ratio * mid for t in ins) / len(ins)
    if ratio is not None and noise is not None and ratio > threshold_ratio and beyond_noise(ratio, noise):
        on = [flag for name, flag in OPTION_COST if options.get(name)]
        kind = "options" if on else "profiler"
        cost = (
            f"the likely cost: {', '.join(on)} (turn off what you do not need)"
            if on
            else "no costly option is on: the profiler's own per-op bookkeeping is the cost; trace fewer steps"
        )
        if waits is not None and waits[0] - waits[1] >= CPU_SHARE * (med - mid):
            # Measured, not guessed: the last rank's wait for a CPU grew by most of the slowdown.
            kind = "cpu_wait"
            rise = 1e3 * (waits[0] - waits[1])
            cost = (f"measured: inside its window the rank last to the sync waited {rise:.1f} ms "
                    f"more per step for a CPU before it (the run queue; median {1e3 * waits[0]:.1f} vs "
                    f"{1e3 * waits[1]:.1f} ms): the profiler's threads, or other work on the host, took cores that "
                    "training needed; leave a core free per traced rank, or trace fewer steps"
                    + (f" (also on: {', '.join(on)})" if on else ""))
        warning = (
            f"the profiler slows the steps it traces by {apart(ratio, threshold_ratio)}x (median {med:.4f}s inside its "
            f"window vs {mid:.4f}s over the {len(ref)} untraced steps after its start{left_out_words(left_out)}; the "
            f"run's own noise {noise:.1f}%; threshold {threshold_ratio:g}x): times and findings from the trace "
            f"describe a slower run than yours; {cost}."
        )
    return ProfilerSlowdown(
        steps_inside=len(ins),
        steps_before=len(before),
        steps_after=len(after),
        median_step_s_inside=med,
        median_step_s_before=median(before) if before else None,
        median_step_s_after=median(after) if after else None,
        ratio=ratio,
        threshold_ratio=threshold_ratio,
        options=dict(options),
        warning=warning,
        confidence=confidence,
        median_step_s_reference=mid,
        noise_pct=noise,
        note=note,
        cpu_wait_s_inside=waits[0] if waits is not None else None,
        cpu_wait_s_reference=waits[1] if waits is not None else None,
        cost=kind if warning is not None else None,
        steps_left_out=sorted(left_out),
    )


def left_out_words(left_out: Sequence[int]) -> str:
    """"; step 10 left out: it waited for an evaluation, a checkpoint or a trace's export" or "" without any."""
    if not left_out:
        return ""
    steps = ", ".join(map(str, sorted(left_out)))
    return (f"; step{'s' if len(left_out) > 1 else ''} {steps} left out: "
            f"{'it' if len(left_out) == 1 else 'they'} waited for an evaluation, a checkpoint or a trace's export")


def _medians(values: Mapping[int, float] | None, inside: list[int], reference: list[int]) -> tuple[float, float] | None:
    """The medians of ``values`` over the steps ``inside`` and over the ``reference`` steps; None unless every one of
    them has a value."""
    if not values or not inside or not reference or any(s not in values for s in (*inside, *reference)):
        return None
    return median(values[s] for s in inside), median(values[s] for s in reference)
