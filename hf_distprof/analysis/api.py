"""The front of the analysis: ``analyze_paths`` runs the stages in order, from the files on disk to the findings.

1. ``read``: find the trace files and the run's other files (manifest, step timer's records);
2. ``rank``: each trace parsed and analysed in a worker process (:mod:`hf_distprof.analysis.rank.workers`);
3. ``across``: one result per rank, the ranks aligned and compared, the per-kind tables, bandwidth;
4. ``whatif``: the traced steps replayed across ranks, what one fix would save;
5. ``judge``: the findings, the undecided questions, in one order;
6. ``tell`` renders the result (text, box, report); ``to_json`` serialises it.

Every stage's output is plain data (:mod:`hf_distprof.analysis.results`); a stage imports only the stages before it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hf_distprof.analysis.across import bandwidth, comm
from hf_distprof.analysis.across.align import align, set_waits
from hf_distprof.analysis.across.combine import one_result_per_rank
from hf_distprof.analysis.across.evidence import run_evidence
from hf_distprof.analysis.across.reference import compare_to_reference
from hf_distprof.analysis.across.skew import cross_rank
from hf_distprof.analysis.judge.findings import judge
from hf_distprof.analysis.judge.slowdown import slowdown_of
from hf_distprof.analysis.judge.window import window_notes
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank.workers import analyze_file, run_all
from hf_distprof.analysis.read.manifest import run_summary_beside, why_no_trace
from hf_distprof.analysis.read.timer_records import read_timer_records
from hf_distprof.analysis.read.timing_summary import read_timing_summary
from hf_distprof.analysis.read.trace_io import NoTraceError, discover_trace_files
from hf_distprof.analysis.results.across import ReferencePoint
from hf_distprof.analysis.results.rank import FileError, RankResult
from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.whatif.model import what_if

__all__ = ["analysis_document", "analyze_file", "analyze_paths"]


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
    """
    options = options or AnalysisOptions()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    # 1. read: the trace files, then (below) the run's other files beside them.
    try:
        files = [str(p) for p in discover_trace_files(paths)]
    except NoTraceError as exc:
        why = why_no_trace(exc.folder) if exc.run_folder else None
        if why is None:
            raise
        raise FileNotFoundError(f"{exc}: {why}") from None  # the run's manifest says why no window was taken
    # 2. rank: each trace parsed and analysed in a worker process.
    outcomes = run_all(files, options, read_compact, write_compact)
    errors = [o for o in outcomes if isinstance(o, FileError)]
    # 3. across: one result per rank, on one clock; the late-peer waits, then the per-kind tables.
    ranks = one_result_per_rank([o for o in outcomes if isinstance(o, RankResult)], errors)
    alignment = align(ranks)
    set_waits(ranks, alignment)
    for r in ranks:
        r.comm_by_kind = comm.by_kind(r.steps, r.collectives, gpu=r.device == "gpu")
        r.peer_waits = comm.waits_for_peers(r)
    # The step timer's records of the same run: each traced step's wait for a CPU, the steps outside the window,
    # and its verdict over those, judged again here (timing_summary.json's when the records cannot say).
    records = read_timer_records(files)
    summary = read_timing_summary(files)
    judged = records.verdict(options.imbalance_pct, {s.step for r in ranks for s in r.steps})
    timer = judged.to_json() if judged is not None else summary.imbalance_verdict
    cross = (cross_rank(ranks, options, records.cpu_wait(), timer, records.own_work(), records.own_steps(),
                        alignment=alignment) if len(ranks) > 1 else None)
    rows = bandwidth.collective_bandwidth(ranks)
    # 4. whatif: the traced steps replayed across ranks.
    evidence = run_evidence(records, {s.step for r in ranks for s in r.steps}) if len(ranks) > 1 else None
    window = (cross.straggler_verdict or cross.imbalance_verdict) if cross is not None else None
    answer = (what_if(ranks, alignment.offsets, list(reference) if reference else None, evidence, window)
              if ranks else None)
    # 5. judge: every finding, in one order.
    slowdown = slowdown_of(summary, records, ranks, options)
    findings, undecided = judge(ranks, cross, options, records, slowdown, timer, answer)
    notes = window_notes(cross, records, {s.step for r in ranks for s in r.steps}, slowdown)
    run, manifest_errors = run_summary_beside(files)  # hosts, windows and why, files lost since
    errors += [FileError(path, reason) for path, reason in manifest_errors]
    errors.sort(key=lambda e: e.path)
    return AnalysisResult(
        ranks=ranks,
        cross_rank=cross,
        findings=findings,
        errors=errors,
        options=options,
        comm_by_kind=comm.mean_by_kind(ranks),
        comm_by_module=comm.by_module(ranks),
        undecided=undecided,
        profiler_slowdown=slowdown,
        bandwidth=rows,
        unsized_collectives=bandwidth.unsized(ranks),
        bandwidth_reference=compare_to_reference(rows, list(reference)) if reference else [],
        bandwidth_reference_file=reference_file if reference else None,
        run=run,
        what_if=answer.scenarios if answer is not None else [],
        critical_path=answer.critical_path if answer is not None else [],
        what_if_model=answer.model if answer is not None else None,
        window_notes=notes,
        alignment=alignment,
    )


def analysis_document(folder: Path) -> dict[str, Any] | None:
    """The trace analysis of one run folder as ``analysis.json`` holds it (what ``--profiler-analyze`` would have
    written); None when no rank's trace could be read. ``hf-distprof compare`` calls it for folders without one."""
    result = analyze_paths([folder])
    return result.to_dict() if result.ranks else None
