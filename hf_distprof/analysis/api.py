"""The front of the analysis: ``analyze_paths`` runs the stages once each, in order, from the files on disk to words.

1. ``read``: the trace files, the step timer's records and summary, the run manifest (:func:`read_run`);
2. ``rank``: each trace read and analysed in a worker process (:mod:`hf_distprof.analysis.rank.workers`);
3. ``across``: one result per rank, the ranks aligned and compared, every cross-rank figure (:func:`compare`);
4. ``whatif``: the traced steps replayed across ranks, what one change would save (:func:`what_if`);
5. ``judge``: every decision, from those figures (:func:`judge`);
6. ``tell``: the findings' words (:func:`write_all`); the text, the box and the report render the result.

Every stage's output is plain data (:mod:`hf_distprof.analysis.results`); a stage imports only the stages before it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank.workers import analyze_file, collector_paused, run_all
from hf_distprof.analysis.read.run import read_run
from hf_distprof.analysis.results.rank import FileError, RankResult
from hf_distprof.analysis.results.run import RunInput
from hf_distprof.analysis.results.timer import TimerRecords, TimingSummary

if TYPE_CHECKING:
    from hf_distprof.analysis.results.across import Across, CrossRankResult, ReferencePoint
    from hf_distprof.analysis.results.facts import Judged
    from hf_distprof.analysis.results.result import AnalysisResult

__all__ = ["analysis_document", "analyze_file", "analyze_paths", "analyze_ranks"]


def analyze_paths(
    paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    options: AnalysisOptions | None = None,
    *,
    read_compact: bool = True,
    write_compact: bool = False,
    reference: Sequence[ReferencePoint] | None = None,
    reference_file: str | None = None,
) -> AnalysisResult:
    """Analyse the traces of a distributed run, one file per rank (any number of ranks).

    Args:
        paths: Folders (searched recursively for ``*.pt.trace.json[.gz]``, or for any ``*.json`` /
            ``*.json.gz`` when a folder holds none) and/or trace files, analysed as given.
        options: Thresholds and parallelism; defaults when None.
        read_compact: Read each trace's compact file (``<trace>.compact.msgpack``) instead of its JSON when
            it has a usable one; the result is the same, several times faster.
        write_compact: Write a compact file beside each trace that has no usable one (or beside every trace,
            with ``read_compact=False``).
        reference: Bandwidths measured by ``hf-distprof bench-collectives``
            (:func:`hf_distprof.collectives.bench.load_reference` reads its CSV): the bandwidth table is set
            against them, and the what-if model adds the scenario "transfers at the reference bandwidth".
        reference_file: Where ``reference`` was read from, for the output.

    Returns:
        The result; ``result.errors`` lists files that could not be analysed (the others still are).

    Raises:
        FileNotFoundError: A path does not exist, or a folder holds no trace.
        SeveralRunsError: The traces are not one run's (two folders hold the same rank, or two ranks of one host
            traced the same steps at times that cannot be the same steps).
    """
    options = options or AnalysisOptions()
    with collector_paused():
        run = read_run([paths] if isinstance(paths, (str, os.PathLike)) else paths)
        outcomes = run_all(run.files, options, read_compact, write_compact, meanwhile=_later_stages)
        from hf_distprof.analysis.across.combine import apart_in_time, not_one_world, one_result_per_rank
        from hf_distprof.analysis.read.run import SeveralRunsError

        errors = [o for o in outcomes if isinstance(o, FileError)]
        read = [o for o in outcomes if isinstance(o, RankResult)]
        mixed = not_one_world(read)
        if mixed is not None:
            raise SeveralRunsError(mixed)
        ranks = one_result_per_rank(read, errors)
        clocks = {c.rank: c.offset_us for c in run.run.clocks if c.offset_us is not None} if run.run else None
        apart = apart_in_time(ranks, clocks)
        if apart is not None:
            raise SeveralRunsError(apart)
        run.errors = errors + run.errors
        return _analyze(ranks, run, options, reference, reference_file)


def analyze_ranks(
    ranks: list[RankResult],
    options: AnalysisOptions | None = None,
    *,
    records: TimerRecords | None = None,
    summary: TimingSummary | None = None,
    reference: Sequence[ReferencePoint] | None = None,
) -> AnalysisResult:
    """The stages after ``rank`` over per-rank results already made (one per rank, sorted by rank): what
    ``analyze_paths`` does once the traces are read, for callers that build ranks themselves (tests, tools).

    Args:
        ranks: One result per rank; their collectives' waits and per-kind tables are set here.
        options: Thresholds; defaults when None.
        records: The step timer's records of the same run, if any.
        summary: The step timer's summary of the same run, if any.
        reference: Bandwidths measured by ``hf-distprof bench-collectives``.
    """
    run = RunInput(files=[r.path for r in ranks], records=records or TimerRecords(),
                   summary=summary or TimingSummary(), run=None)
    return _analyze(ranks, run, options or AnalysisOptions(), reference, None)


def _later_stages() -> None:
    """Import the stages after ``rank``. The worker processes are forked (or spawned) before, so that they start
    without them; this process imports them while the workers read the traces (about half the package's import)."""
    import hf_distprof.analysis.across.combine
    import hf_distprof.analysis.across.compare
    import hf_distprof.analysis.judge.findings
    import hf_distprof.analysis.results.result
    import hf_distprof.analysis.tell.findings
    import hf_distprof.analysis.whatif.model  # noqa: F401


def _analyze(ranks: list[RankResult], run: RunInput, options: AnalysisOptions,
             reference: Sequence[ReferencePoint] | None, reference_file: str | None) -> AnalysisResult:
    from hf_distprof.analysis.across.compare import compare
    from hf_distprof.analysis.judge.findings import judge
    from hf_distprof.analysis.judge.burst import burst_findings
    from hf_distprof.analysis.judge.verdicts import judge_ranks
    from hf_distprof.analysis.judge.whatif import replay_pace
    from hf_distprof.analysis.results.result import AnalysisResult
    from hf_distprof.analysis.tell.findings import write_all
    from hf_distprof.analysis.whatif.model import what_if

    across = compare(ranks, run, reference)
    verdicts = judge_ranks(across, run.summary, options, [r.rank for r in ranks])
    bursts = burst_findings(across, verdicts, options)
    replay = what_if(ranks, across.alignment, list(reference) if reference else None, across.evidence,
                     replay_pace(verdicts, across.pace, bursts)) if ranks else None
    judged = judge(ranks, across, replay, run.summary, options, _expected_ranks(run, ranks), _world(run, ranks),
                   run.run.windows if run.run is not None else (), _ended(run), verdicts, bursts)
    findings, undecided, notes, slowdown_line = write_all(judged)
    return AnalysisResult(
        ranks=ranks,
        cross_rank=_cross_rank(ranks, across, judged),
        findings=findings,
        errors=sorted(run.errors, key=lambda e: e.path),
        options=options,
        comm_by_kind=across.comm_by_kind,
        comm_by_module=across.comm_by_module,
        undecided=undecided,
        profiler_slowdown=judged.slowdown,
        bandwidth=across.bandwidth,
        unsized_collectives=across.unsized_collectives,
        bandwidth_reference=across.bandwidth_reference,
        bandwidth_reference_file=reference_file if reference else None,
        run=run.run,
        what_if=judged.what_if.scenarios if judged.what_if is not None else [],
        critical_path=judged.what_if.critical_path if judged.what_if is not None else [],
        what_if_model=judged.what_if.model if judged.what_if is not None else None,
        window_notes=notes,
        alignment=across.alignment,
        late_peers=across.late_peers,
        reference_totals=across.reference_totals,
        common_steps=across.common_steps,
        slowdown_line=slowdown_line,
        unread_ranks=judged.unread,
        unmeasured_waits=judged.unmeasured,
    )


def _expected_ranks(run: RunInput, ranks: list[RankResult]) -> list[int] | None:
    """The ranks whose traces the run's manifest lists: those that took a window (``--profile-ranks`` traces some),
    else every rank. Without a manifest, every rank of the world the traces read say they belong to
    (``distributedInfo.world_size``, when they agree: a loop that profiles rank 0 only, a rank's file left out); None
    when they say none."""
    if run.run is not None:
        traced = sorted({r for w in run.run.windows for r in w.ranks})
        if run.run.profile_ranks in (None, "all"):  # every rank was to take each window: one without died, or lost it
            return list(range(run.run.world_size)) or traced
        return traced or list(range(run.run.world_size))
    sizes = {r.world_size for r in ranks}
    size = sizes.pop() if len(sizes) == 1 else None
    return list(range(size)) if isinstance(size, int) and size > 0 else None


def _ended(run: RunInput) -> dict[int, str]:
    """Ranks that ended before the run did, as the run folder says: ``crashed`` (a crash file with a stack),
    ``raised`` (an exception file) or ``unfinished`` (its manifest part never reached train end: it died or was
    stopped)."""
    if run.run is None:
        return {}
    return {**{r: "unfinished" for r in run.run.unfinished_ranks}, **{r: "raised" for r in run.run.raised_ranks},
            **{r: "crashed" for r in run.run.crashed_ranks}}


def _world(run: RunInput, ranks: list[RankResult]) -> list[int] | None:
    """Every rank of the run: the manifest's world, else the one the traces say they belong to (when they agree);
    None when neither says."""
    if run.run is not None and run.run.world_size:
        return list(range(run.run.world_size))
    sizes = {r.world_size for r in ranks}
    size = sizes.pop() if len(sizes) == 1 else None
    return list(range(size)) if isinstance(size, int) and size > 0 else None


def _cross_rank(ranks: list[RankResult], across: Across, judged: Judged) -> CrossRankResult | None:
    """The cross-rank view ``--json`` shows: the skew's figures and the judge's verdicts."""
    from hf_distprof.analysis.results.across import CrossRankResult

    skew, verdicts = across.skew, judged.verdicts
    if skew is None:
        return None
    return CrossRankResult(
        ranks=[r.rank for r in ranks],
        per_rank=skew.per_rank,
        step_spread=skew.step_spread,
        imbalance_pct=skew.imbalance_pct,
        matched_collectives=skew.matched_collectives,
        stragglers=verdicts.stragglers,
        straggler_verdict=verdicts.straggler,
        imbalance_verdict=verdicts.imbalance,
        straggler_window=verdicts.straggler_window,
        imbalance_window=verdicts.imbalance_window,
        slowest_rank=judged.slowest[0],
        slowest_by=judged.slowest[1],
    )


def analysis_document(folder: Path) -> dict[str, Any] | None:
    """The trace analysis of one run folder as ``analysis.json`` holds it (what ``--profiler-analyze`` would have
    written); None when no rank's trace could be read. ``hf-distprof compare`` calls it for folders without one."""
    result = analyze_paths([folder])
    return result.to_dict() if result.ranks else None
