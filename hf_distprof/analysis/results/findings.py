"""What the judge stage yields (plain data): findings, and the questions the run could not decide.

The judge decides (:mod:`hf_distprof.analysis.judge`): a :class:`Judgement` holds what was found, about whom, how
sure, on what evidence, and the facts its words are written from (one ``*Facts`` dataclass per kind,
:mod:`hf_distprof.analysis.results.facts`). The tell stage writes the words once, last
(:mod:`hf_distprof.analysis.tell.findings`): a :class:`Finding` is a judgement with them. Every renderer (the text,
the box, the report, ``--json``) shows these fields as they are: none of them reads a finding's sentences to find its
verdict, its rank or its phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Basis(str, Enum):
    """The evidence a finding, or a slow-rank verdict, rests on. Its value is what ``--json`` shows."""

    TRACE = "trace"
    """The traced steps only (the profiler window)."""
    TRACE_AND_TIMER = "trace + step timer"
    """The traced steps weighed with the step timer's records of the run's other steps."""
    REPLAY = "replay"
    """The what-if model: the traced steps replayed across ranks."""
    STEP_TIMER = "step timer"
    """The step timer's records of the run's steps (the profiler's slowdown; a slow-rank verdict the timer decided
    over the run, the traced window one more sample)."""


TRACE, TRACE_AND_TIMER, REPLAY, STEP_TIMER = Basis.TRACE, Basis.TRACE_AND_TIMER, Basis.REPLAY, Basis.STEP_TIMER


@dataclass
class Judgement:
    """One finding as the judge decided it, before its words are written (:func:`hf_distprof.analysis.tell.findings.
    write`)."""

    kind: str
    """What was found: ``slow_rank``, ``straggler``, ``imbalance``, ``communication_bound``, ``data_loading_bound``,
    ``what_to_fix_first`` ... (PROFILING_GUIDE.md lists them)."""
    severity: float
    """Rough % of step time at stake; findings are ordered by it (:func:`hf_distprof.analysis.judge.findings.
    in_order`)."""
    ranks: list[int]
    facts: Any
    """The kind's facts (:mod:`hf_distprof.analysis.results.facts`): every figure its words state."""
    numbers: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None
    phase: str | None = None
    basis: Basis = TRACE
    steps: int | None = None
    cause: str | None = None
    """Why the rank it names holds the others back (:class:`hf_distprof.core.cause.Cause`'s value), when the step
    timer's records say; None otherwise."""
    more_work_too: bool = False
    """The rank also does more work than its peers, besides ``cause`` (a wait for a CPU, its data loading)."""


@dataclass
class Finding:
    """One diagnosis, with the measured numbers that triggered it and what to do."""

    kind: str
    """What was found: ``slow_rank``, ``straggler``, ``imbalance``, ``communication_bound``, ``data_loading_bound``,
    ``what_to_fix_first`` ... (PROFILING_GUIDE.md lists them)."""
    severity: float
    """Rough % of step time at stake; findings are ordered by it
    (:func:`hf_distprof.analysis.judge.findings.in_order`)."""
    title: str
    ranks: list[int]
    """The ranks it names (empty: the run as a whole)."""
    evidence: str
    """The full account: :attr:`why`, then every other number the verdict rests on."""
    recommendation: str
    """:attr:`action`, then the rest of what to try."""
    numbers: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None
    """How sure: 1 - p of the arrival-order test for rank findings, the share of steps above the threshold
    for per-step shares (:mod:`hf_distprof.core.verdicts`)."""
    phase: str | None = None
    """The part of the step it is about: ``data``, ``forward``, ``backward``, ``optimizer``, ``compute`` (on the
    device), ``communication``, ``memory``, ``profiler``; None when it is about the whole step."""
    why: str = ""
    """One sentence: the measurement that makes it a finding (what the box shows under "Why"; ``evidence`` starts
    with it)."""
    action: str = ""
    """One sentence: the first thing to try (what the box shows under "Try"; ``recommendation`` starts with it)."""
    basis: Basis = TRACE
    """The evidence it rests on (:class:`Basis`)."""
    steps: int | None = None
    """How many steps were judged (None where no per-step test decides it)."""
    cause: str | None = None
    """Why the rank it names holds the others back, as :class:`hf_distprof.core.cause.Cause` names it: ``cpu_wait``
    and ``slower_machine`` (its machine: not your code, unless :attr:`more_work_too`), ``input``, ``more_work``,
    ``compute``; None when the step timer's records do not say (or the finding names no slow rank)."""
    more_work_too: bool = False
    """Besides ``cause`` (``cpu_wait`` or ``input``), the rank also does more work than its peers (beyond the
    threshold): the title, ``why`` and ``action`` say both."""


@dataclass
class Undecided:
    """A question the run could not answer ("not enough evidence"), or a finding withheld: never a finding."""

    question: str
    """What was asked: ``straggler``, ``imbalance`` (the slow-rank verdicts) or the kind of a withheld finding."""
    reason: str
    """Why no verdict, with every number weighed."""
    why: str = ""
    """The same in one sentence (what the box shows under "Why")."""
    to_decide: str = ""
    """What would decide it (trace more steps, keep the step timer on ...); empty when nothing more would."""
    ranks: list[int] = field(default_factory=list)
    """The candidate rank, when there is one."""
    basis: Basis = TRACE
    """The evidence that was weighed (:class:`Basis`)."""
    steps: int | None = None
    """How many steps were judged."""


@dataclass
class WindowNote:
    """The traced window's own verdict where it disagrees with the run's: the answer follows the run (the step
    timer's records of its other steps), and this says what the window alone said and how its steps differed."""

    question: str
    """``straggler`` or ``imbalance``."""
    window_status: str
    window_rank: int | None
    run_status: str
    run_rank: int | None
    window_reason: str
    """The window's own verdict, in words."""
    traced_step_ms: list[float] = field(default_factory=list)
    """Each traced step's time (the step timer's), in order."""
    untraced_step_ms: float | None = None
    """The median untraced step the window is compared with."""
    text: str = ""
    """All of it in one sentence, as the text output shows it (:mod:`hf_distprof.analysis.tell.findings`)."""
