"""Which optimizer steps the profiler runs over: the one place every callback asks.

The regular schedule comes from the flags (``--profiler-skip-first``, ``--profiler-wait-steps``,
``--profiler-warmup-steps``, ``--profiler-active-steps``, ``--profiler-repeat``). The windows opened on demand or on
anomaly are decided while training runs (:class:`~hf_distprof.callbacks.profiler.capture.CapturePlan`, the same on
every rank); the profiler callback registers its plan here for the length of ``train()``. :func:`traced_steps` and
:func:`recorded_steps` answer for both, at the time they are asked: the step timer (which leaves traced steps out of
its verdicts), the memory logger and views, and ``--nsys-window`` all count an extra window as traced. A window is
decided at least its warm-up before its first recorded step, so a step is known to be traced before it starts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

from torch.profiler import ProfilerAction, schedule

from hf_distprof.config import ProfilingArguments


class ExtraWindows(Protocol):
    """What the schedule needs of a capture plan: the phase of its windows at a step (None outside them)."""

    def phase(self, step: int) -> str | None: ...


_plans: list[ExtraWindows] = []  # the plans of this process's running profiler callbacks
# Plans unregistered since the last register, each with the count of unregistrations at its own: the predicates made
# before it still count its windows (the step timer and the memory logger end after the profiler callback).
_retired: list[tuple[ExtraWindows, int]] = []
_unregistered = 0
_RECORDING = ("record", "record_and_save")


def register(plan: ExtraWindows) -> None:
    """Count ``plan``'s windows as traced (the profiler callback, at train begin: the last run's callbacks are done)."""
    _retired.clear()
    if not any(p is plan for p in _plans):
        _plans.append(plan)


def unregister(plan: ExtraWindows) -> None:
    """Stop counting ``plan``'s windows in predicates made from now on (train end, or a train() that ended without
    it); those made before keep counting them."""
    global _unregistered
    if any(p is plan for p in _plans):
        _unregistered += 1
        _retired.append((plan, _unregistered))
    _plans[:] = [p for p in _plans if p is not plan]


def extra_phase(step: int) -> str | None:
    """The phase of the extra windows at ``step``: ``warmup``, ``record``, ``record_and_save`` or None."""
    for plan in _plans:
        phase = plan.phase(step)
        if phase is not None:
            return phase
    return None


def _extra_phases() -> Callable[[int], str | None]:
    """:func:`extra_phase`, also over the plans unregistered after this call: the step timer and the memory logger
    finish their train end after the profiler callback's, which unregisters its plan (their last figures then left the
    windows opened on demand or on anomaly out of the traced steps)."""
    made = _unregistered

    def phase(step: int) -> str | None:
        found = extra_phase(step)
        if found is None:
            for plan, when in _retired:
                if when > made and (found := plan.phase(step)) is not None:
                    break
        return found

    return phase


def _cut_steps() -> Callable[[int], bool]:
    """Whether a registered plan kept the profiler from a step its schedule gave it (``cut(step)``: ``--max-trace-mb``
    shortened or skipped that window, on every rank alike), also over the plans unregistered after this call."""
    made = _unregistered

    def cut(step: int) -> bool:  # (asked once a step: no list built)
        for plan in _plans:
            if getattr(plan, "cut", None) is not None and plan.cut(step):  # type: ignore[attr-defined]
                return True
        for plan, when in _retired:
            if when > made and getattr(plan, "cut", None) is not None and plan.cut(step):  # type: ignore[attr-defined]
                return True
        return False

    return cut


def first_active_step(args: ProfilingArguments) -> int:
    """The 1-based optimizer step at which the first active (recorded) step happens."""
    return args.profiler_skip_first + args.profiler_wait_steps + args.profiler_warmup_steps + 1


def schedule_warning(args: ProfilingArguments, max_steps: int, offset: int = 0) -> str | None:
    """Why the schedule will not record a full window within ``max_steps``; None when it will.

    Args:
        args: The profiling flags.
        max_steps: Optimizer steps the Trainer will run (``state.max_steps``).
        offset: ``global_step`` when training started (resumed from a checkpoint): the schedule counts from there.

    Returns:
        A message for the user, or None.
    """
    first = offset + first_active_step(args)
    last = first + args.profiler_active_steps - 1
    cycle = (
        f"--profiler-skip-first {args.profiler_skip_first} + --profiler-wait-steps {args.profiler_wait_steps} "
        f"+ --profiler-warmup-steps {args.profiler_warmup_steps}"
    )
    if offset:
        cycle = f"{offset}, where training resumed, + {cycle}"
    if max_steps < first:
        ends = f"stops at step {max_steps}" if offset else f"runs {max_steps} optimizer steps"
        return (
            f"the profiler will record nothing: training {ends} but the first active "
            f"step is step {first} ({cycle} + 1). Lower those flags or raise --max-steps; the schedule is left "
            "as given."
        )
    # With --profiler-repeat N > 1, the later windows too (one every wait + warm-up + active steps).
    cycle_len = args.profiler_wait_steps + args.profiler_warmup_steps + args.profiler_active_steps
    windows = [(first + k * cycle_len, last + k * cycle_len) for k in range(args.profiler_repeat)]
    short = [(k, a, b) for k, (a, b) in enumerate(windows) if b > max_steps]
    if max_steps < last and len(windows) <= 1:
        return (
            f"the profiler window is cut short: it records steps {first}-{last} but training stops at step "
            f"{max_steps}; the trace will hold steps {first}-{max_steps} only."
        )
    if short:
        said = []
        k, a, b = short[0]
        if a <= max_steps:
            held = f"step {a}" if a == max_steps else f"steps {a}-{max_steps}"
            said.append(f"window {k + 1} is cut short (it records steps {a}-{b}; the trace will hold {held})")
            short = short[1:]
        if short:
            first_k, last_k = short[0][0] + 1, short[-1][0] + 1
            said.append(f"window {first_k} records nothing" if first_k == last_k else
                        f"windows {first_k}-{last_k} record nothing")
        return (
            f"--profiler-repeat {args.profiler_repeat}: training stops at step {max_steps}, so {' and '.join(said)}; "
            f"the {args.profiler_repeat} windows need {windows[-1][1]} steps. Raise --max-steps or lower "
            "--profiler-repeat."
        )
    return None


def base_schedule(args: ProfilingArguments) -> Callable[[int], ProfilerAction]:
    """torch.profiler's schedule for the flags, counting from 0 (the callback shifts it to global_step)."""
    return schedule(
        skip_first=args.profiler_skip_first,
        wait=args.profiler_wait_steps,
        warmup=args.profiler_warmup_steps,
        active=args.profiler_active_steps,
        repeat=args.profiler_repeat,
    )


def scheduled_steps(args: ProfilingArguments, offset: int = 0) -> Callable[[int], bool]:
    """Which optimizer steps the regular schedule runs the profiler over (warmup and active phases), as a predicate.

    The same schedule as :class:`ProfilerCallback`'s, shifted by ``offset`` (``global_step`` when training
    started). The step timer leaves these steps out of its imbalance verdict and compares their time with
    the others' (the profiler's own slowdown). False for every step when profiling is off.
    """
    if not args.enable_profiling:
        return lambda step: False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "won't be using warmup": the callback says it once
        base = base_schedule(args)
    on = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    return lambda step: step > offset and base(step - offset - 1) in on


def scheduled_recorded_steps(args: ProfilingArguments, offset: int = 0) -> Callable[[int], bool]:
    """The optimizer steps of the regular schedule's active phases, as a predicate.

    Shifted by ``offset`` like :func:`scheduled_steps`, but defined whether the profiler runs or not: the
    memory views use these steps as their window, so that a trace and the memory views cover the same
    steps.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        base = base_schedule(args)
    on = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    return lambda step: step > offset and base(step - offset - 1) in on


def records_nothing(args: ProfilingArguments, offset: int, max_steps: int) -> bool:
    """Whether training (from ``global_step`` ``offset`` to ``max_steps``) ends before the schedule's first active
    step: then no profiler runs on the schedule (its warm-up steps would only cost time)."""
    return max_steps - offset < first_active_step(args)


def traced_steps(args: ProfilingArguments, offset: int = 0, max_steps: int | None = None,
                 world_size: int | None = None) -> Callable[[int], bool]:
    """Which optimizer steps the profiler runs over, as a predicate: the regular schedule's warmup and active steps
    (:func:`scheduled_steps`; none when training ends before its first active step, ``max_steps`` given) and every
    extra window's, on demand or on anomaly, as decided so far, less the steps ``--max-trace-mb`` kept from the profiler
    (a shortened or skipped window: a trial's steps after its one recorded step were left out of the verdicts as
    traced); none at all when ``--profile-ranks`` names no rank of the ``world_size`` (no rank traces: a trial's run
    was said to be slowed 2x by a profiler that never ran).

    The step timer leaves these steps out of its verdicts and compares their time with the others' (the profiler's
    own slowdown); the memory logger leaves them out of its CPU growth check.
    """
    ranks = args.profile_rank_set if world_size is not None and isinstance(args.profile_ranks, str) else None
    if world_size is not None and ranks is not None and not any(r < world_size for r in ranks):
        return lambda step: False
    extra, cut = _extra_phases(), _cut_steps()
    if max_steps is not None and records_nothing(args, offset, max_steps):
        return lambda step: extra(step) is not None and not cut(step)
    regular = scheduled_steps(args, offset)
    return lambda step: (regular(step) or extra(step) is not None) and not cut(step)


def after_window(traced: Callable[[int], bool], step: int) -> bool:
    """Whether ``step`` follows a profiler window's last step (``traced`` is :func:`traced_steps`' predicate): its trace
    was written between the two, and every rank's ``step`` waits in its first collective for the slowest rank's export,
    also a rank that traces nothing (``--profile-ranks``). A pause, like a checkpoint: that step is not judged."""
    return step > 1 and traced(step - 1) and not traced(step)


def recorded_steps(args: ProfilingArguments, offset: int = 0) -> Callable[[int], bool]:
    """The optimizer steps a trace holds, as a predicate: the regular schedule's active steps (defined whether the
    profiler runs or not) and every extra window's recorded steps.

    The memory views collect over these steps and ``--nsys-window`` captures them, so that a trace, the memory
    views and an Nsight capture cover the same steps.
    """
    regular = scheduled_recorded_steps(args, offset)
    extra, cut = _extra_phases(), _cut_steps()
    return lambda step: (regular(step) or extra(step) in _RECORDING) and not cut(step)
