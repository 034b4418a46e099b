"""Evaluations and checkpoints between traced steps: not part of the steps.

The Trainer evaluates and saves after a step's ``on_step_end``, where the profiler has already opened the next
``ProfilerStep#N``; while it records, the profiler callback puts a range (:data:`PAUSE_NAME`) around that work
(``hf_distprof.callbacks.profiler.callback``). Read here, the step starts where the range ends, and what ran inside it
(the evaluation's forwards, its metric gathers, the checkpoint's writes) belongs to no step: an evaluation once made a
traced step read 1.8 s against 25 ms, its 170 gathers a step's communication, and a clean run "what to fix first".

The step itself is then left out whole (:func:`after_pauses`), as the step timer leaves it out (``after_pause``): in
it, every rank waits in its first collective for the slowest to finish the evaluation or checkpoint. Kept, a 60 ms
checkpoint on rank 0 read as rank 1's 75 ms late-peer wait in one step of ten.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hf_distprof.analysis.results.rank import StepAfterPause

Span = tuple[float, float, str]  # (start, end, name), as the reader's

PAUSE_NAME = "hf_distprof/between_steps"
"""The range's name (``hf_distprof.callbacks.profiler.callback.PAUSE_NAME``, the same: the training ranks import no
analysis code)."""


MARK = f"{PAUSE_NAME}: "
"""The start of the empty ranges the callback puts inside a pause: ``<PAUSE_NAME>: evaluation``, ``: checkpoint``."""


def _pauses(main_ops: list[Span], cut: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The pause ranges among the main thread's spans and the ``cut`` ranges, sorted."""
    return sorted([(s, e) for s, e, name in main_ops if name == PAUSE_NAME] + list(cut))


def after_pauses(steps: list[Any], main_ops: list[Span], cut: list[tuple[float, float]]
                 ) -> tuple[list[Any], list[StepAfterPause], list[tuple[float, float]]]:
    """``steps`` less those with a pause (an evaluation or a checkpoint) inside, what each of those held, and ``cut``
    with their time added (the time of steps left out, that :func:`without_pauses` cuts). When every step held one,
    all of ``steps`` are kept (each then trimmed only) and said so (``kept``): a window of no step says nothing."""
    pauses = [(s, e) for s, e, name in main_ops if name == PAUSE_NAME]
    inside = [[(s, min(e, st.end)) for s, e in pauses if st.start <= s < st.end] for st in steps]
    kept = [st for st, held in zip(steps, inside) if not held]
    gone = [(st, held) for st, held in zip(steps, inside) if held]
    marks = [(s, name[len(MARK):]) for s, _, name in main_ops if name.startswith(MARK)] if gone else []

    def what(st: Any) -> str:  # what the callback marked inside the step's pause, in order, each once
        return " and ".join(dict.fromkeys(m for s, m in marks if st.start <= s < st.end))

    left = [StepAfterPause(st.number, sum(e - s for s, e in held), st.end - max(e for _, e in held), kept=not kept,
                           what=what(st)) for st, held in gone]
    if not kept:
        return steps, left, cut
    return kept, left, cut + [(st.start, st.end) for st, _ in gone]


def without_pauses(steps: list[Any], main_ops: list[Span], *others: list[Span],
                   cut: Sequence[tuple[float, float]] = ()) -> tuple[Any, ...]:
    """The steps starting where a pause inside them ends, and each list of spans (main-thread ops, collective spans
    ...) without those that start inside a pause (the pause's own range among them) or a ``cut`` range (the time of
    steps left out: :func:`~hf_distprof.analysis.read.trace_io.steps_named`)."""
    pauses = _pauses(main_ops, cut)
    if not pauses:
        return (steps, main_ops, *others)

    def outside(spans: list[Span]) -> list[Span]:
        return [x for x in spans if not any(s <= x[0] < e for s, e in pauses)]

    trimmed = [replace(st, start=min(st.end, max([e for s, e in pauses if st.start <= s < st.end], default=st.start)))
               for st in steps]
    return (trimmed, outside(main_ops), *(outside(spans) for spans in others))


def gpu_outside(gpu: Any, launches: dict[int, float], main_ops: list[Span],
                cut: Sequence[tuple[float, float]] = ()) -> Any:
    """The GPU activity columns (``events.GpuEvent``) without the kernels and copies launched inside a pause (the
    evaluation's forwards, its NCCL gathers) or a ``cut`` range: each is placed by its launch's CPU time (its own start
    without one)."""
    pauses = _pauses(main_ops, cut)
    keep = [i for i, (start, corr) in enumerate(zip(gpu.start, gpu.correlation))
            if not any(s <= launches.get(corr, start) < e for s, e in pauses)]
    if len(keep) == len(gpu.start):
        return gpu
    return replace(gpu, **{name: [getattr(gpu, name)[i] for i in keep]
                           for name in ("start", "end", "name", "stream", "correlation")})
