"""The judge stage's front (pure): every decision of the run, from the figures, in order.

1. which rank holds the others back (:mod:`~hf_distprof.analysis.judge.verdicts`);
2. which what-if savings count, and their order (:mod:`~hf_distprof.analysis.judge.whatif`);
3. the profiler's slowdown (:mod:`~hf_distprof.analysis.judge.slowdown`);
4. the findings (:mod:`~hf_distprof.analysis.judge.diagnosis`), those of a distorted window withheld, the slow rank's
   as one causal chain (:mod:`~hf_distprof.analysis.judge.chain`), what to fix first;
5. where the traced window disagrees with the run (:mod:`~hf_distprof.analysis.judge.window`).

:func:`in_order` is the only place findings are put in order. The words are the tell stage's.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Mapping, Sequence

from hf_distprof.analysis.judge import chain
from hf_distprof.analysis.judge.burst import burst_findings
from hf_distprof.analysis.judge.coverage import unmeasured
from hf_distprof.analysis.judge.diagnosis import diagnose, is_fsdp, undecided
from hf_distprof.analysis.judge.slowdown import (
    quiet_slowdown,
    slowdown_findings,
    slowdown_of,
    withhold_in_a_distorted_window,
    withhold_without_every_rank,
)
from hf_distprof.analysis.judge.verdicts import judge_ranks
from hf_distprof.analysis.judge.whatif import WHAT_TO_FIX_FIRST, judge_scenarios, what_to_fix_first
from hf_distprof.analysis.judge.window import window_notes
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import Across, RankVerdicts
from hf_distprof.analysis.results.facts import Judged
from hf_distprof.analysis.results.findings import TRACE, Judgement
from hf_distprof.analysis.results.rank import RankResult
from hf_distprof.analysis.results.run import WindowInfo
from hf_distprof.analysis.results.timer import TimingSummary
from hf_distprof.analysis.results.whatif import WhatIf

_FIRST = (chain.SLOW_RANK, WHAT_TO_FIX_FIRST)
"""Kinds that open the list, in this order, whatever their severity: the slow rank's chain (the cause and its phase),
then the largest saving the replay predicts. The box shows the first finding of the list, as every output orders it."""


SLOW_RANK_FINDINGS = ("slow_rank", "straggler", "imbalance")
"""The findings whose ranks are the slow ones (a finding on communication, data loading or the waiting ranks names
other ranks: those it is about)."""


def slowest_rank(findings: list[Judgement], verdicts: RankVerdicts, pace: tuple[int | None, int | None],
                 from_run: bool, replayed: int | None) -> tuple[int | None, str | None]:
    """The rank the answer calls slowest, and what names it (``cross_rank.slowest_by``).

    The rank the first slow-rank finding names (``finding:<its kind>``), else a burst's beside no slow rank
    (``finding:burst``, the rank the step timer's table marks); else the rank the what-if replays at its
    peers' pace: ``pace`` (the most own work over the run's judged steps with the step timer's records, ``from_run``;
    else the latest at the traced steps' collectives), or where that names none the replay's own pick (``replayed``:
    the most local work per traced step); else the imbalance verdict's candidate. Without a finding it is named by the
    verdict whose candidate it is (``imbalance``, else ``straggler``: the box states that verdict's figure), else by
    where it came from (``run``, ``lateness``, ``replay``). None with one rank.

    Args:
        findings: The findings, in order.
        verdicts: The slow-rank verdicts.
        pace: The slowest and fastest rank the what-if was given (``Across.pace``).
        from_run: Whether ``pace`` is the step timer's (its records of the run).
        replayed: The slowest rank the what-if replayed (None without a replay).
    """
    named = next((f for f in findings if f.kind in SLOW_RANK_FINDINGS and f.ranks), None)
    # (A burst beside no slow rank: the rank its peers waited for, as the step timer's table marks it.)
    named = named or next((f for f in findings if f.kind == "burst" and f.facts.burst.beside is None), None)
    if named is not None:
        return named.ranks[0], f"finding:{named.kind}"
    rank, source = pace[0], "run" if from_run else "lateness"
    if rank is None:
        rank, source = replayed, "replay"
    if rank is None and verdicts.imbalance is not None:
        rank, source = verdicts.imbalance.rank, "imbalance"
    if rank is None:
        return None, None
    for name, v in (("imbalance", verdicts.imbalance), ("straggler", verdicts.straggler)):
        if v is not None and v.rank == rank:
            return rank, name
    return rank, source


_LAST = ("profiler_slowdown",)
"""Kinds that close the list whatever their severity: the profiler's own slowdown is a caveat about the traced steps
(its severity a share of those, not of the run), never the box's verdict over a finding about the run (a trial's box
led with it over stalls that cost 18% of the run)."""


def in_order(findings: list[Judgement]) -> list[Judgement]:
    """The findings as every output shows them: :data:`_FIRST`'s kinds first, :data:`_LAST`'s last, the rest by
    decreasing severity (ties keep the order they were found in)."""
    return sorted(findings, key=lambda f: (_FIRST.index(f.kind) if f.kind in _FIRST else
                                           len(_FIRST) + (f.kind in _LAST), -f.severity))


def judge(ranks: list[RankResult], across: Across, replay: WhatIf | None, summary: TimingSummary,
          options: AnalysisOptions, expected: list[int] | None = None, world: list[int] | None = None,
          windows: Sequence[WindowInfo] = (), ended: Mapping[int, str] | None = None,
          verdicts: RankVerdicts | None = None, bursts: list[Judgement] | None = None) -> Judged:
    """Every decision of the run.

    Args:
        ranks: Per-rank results, aligned and with their per-kind tables.
        across: The across stage's figures.
        replay: The what-if replay (None without one).
        summary: The step timer's ``timing_summary.json`` (its verdict and the profiler's slowdown, as the run wrote
            them).
        options: The thresholds.
        expected: The ranks whose traces the run has (its manifest's: those that took a window, else every rank;
            without a manifest, the world the traces say they belong to; None when unknown): those not read
            withhold the findings that weigh the ranks' traces against each other, and the replay.
        world: Every rank of the run (None when unknown), and ``windows`` the manifest's windows with the ranks each
            traced: ranks that took no window withhold the same, unless the step timer's verdict over the run says
            the waits for them do not matter (:func:`hf_distprof.analysis.judge.coverage.unmeasured`).
        ended: Ranks that ended before the run did (``crashed``, ``unfinished``): why a missing trace is missing.
        verdicts: The slow-rank verdicts (:func:`hf_distprof.analysis.judge.verdicts.judge_ranks`), when already
            reached (the what-if replays the rank they name: :func:`hf_distprof.analysis.judge.whatif.replay_pace`),
            and ``bursts`` the burst finding (:func:`hf_distprof.analysis.judge.burst.burst_findings`) likewise.

    Returns:
        The verdicts, the findings in :func:`in_order`'s order, the questions left undecided (with the findings
        withheld), the window's disagreements, the profiler's slowdown and the judged what-if.
    """
    read = {r.rank for r in ranks}
    missing = [r for r in expected or [] if r not in read] if read else []
    verdicts = verdicts if verdicts is not None else judge_ranks(across, summary, options, sorted(read))
    coverage = unmeasured(world, read, missing, verdicts.run, windows)
    # Without every rank's trace the replay across ranks is not the run's: the ranks read wait for the others inside
    # their collectives, which it would take for transfers.
    answer = judge_scenarios(replay, verdicts, across.evidence) \
        if replay is not None and not missing and coverage is None else None
    slowdown = slowdown_of(summary, across.timer, across.traced, options, not any(r.device == "gpu" for r in ranks))
    findings = diagnose(ranks, across, verdicts, options) + slowdown_findings(slowdown) + \
        (bursts if bursts is not None else burst_findings(across, verdicts, options))
    # A window whose verdicts were weighed with the timer's already answers for the whole run.
    weighed = verdicts.imbalance_basis != TRACE or verdicts.straggler_basis != TRACE
    findings, withheld = withhold_in_a_distorted_window(findings, slowdown, None if weighed else verdicts.run_json)
    # A rank that ended early is said so when it left no trace; one that took a window has a trace, lost or unread.
    traced = {r for w in windows for r in w.ranks}
    findings, unread = withhold_without_every_rank(
        findings, missing, replay is not None, coverage,
        {r: how for r, how in (ended or {}).items() if r in missing and r not in traced})
    gpu = any(r.device == "gpu" for r in ranks)
    # The slow rank's finding as one chain (its slow phase -> late at the collectives -> its peers wait).
    findings = chain.explain(findings, across, verdicts, gpu)
    # A burst of the rank a slow-rank finding names is that finding's wait said again, as "not the slow rank" (a
    # trial's run stopped after 4 judged steps, its window naming the rank); stalls beside it stay.
    named = {r for f in findings if f.kind in ("slow_rank", "straggler", "imbalance") for r in f.ranks}
    findings = [f for f in findings if not (f.kind == "burst" and f.facts.burst.beside is None and f.ranks[0] in named)]
    backend = next((r.backend for r in ranks if r.backend), None)
    fsdp = any(is_fsdp(r) for r in ranks)
    first = what_to_fix_first(answer, options.what_if_pct, gpu, backend, fsdp) if answer is not None else None
    findings = in_order(findings + ([first] if first is not None else []))
    if summary.loader is not None:  # the data advice leaves out what the run's DataLoader sets already
        findings = [replace(f, facts=replace(f.facts, loader=summary.loader))
                    if "loader" in getattr(f.facts, "__dataclass_fields__", {}) else f for f in findings]
    return Judged(
        verdicts=verdicts,
        findings=findings,
        questions=undecided(verdicts) + withheld + unread,
        windows=window_notes(verdicts, across.timer, set(across.common_steps), slowdown),  # the steps it judged
        slowdown=slowdown,
        what_if=answer,
        quiet_slowdown=quiet_slowdown(slowdown),
        slowest=slowest_rank(findings, verdicts, across.pace, across.evidence is not None,
                             answer.model.slowest_rank if answer is not None else None),
        unread=missing,
        # (One rank's trace alone measures no wait for a peer, whatever the verdict: no figure, not a 0.00 (trial S).)
        unmeasured=sorted({*missing, *(coverage.untraced if coverage is not None else []),
                           *([coverage.slow] if coverage is not None and coverage.slow is not None else []),
                           *([r for r in world or [] if r not in read] if len(read) == 1 else [])}),
    )
