"""Front end of the analysis: files -> parallel per-rank parse and analysis -> cross-rank view -> findings."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from concurrent.futures import ProcessPoolExecutor, as_completed

from hf_distprof.analysis import bandwidth, chain, comm, memory, whatif_timeline
from hf_distprof.analysis.cross_rank import clock_offsets, cross_rank, match_collectives
from hf_distprof.core import names
from hf_distprof.analysis.diagnosis import diagnose, undecided
from hf_distprof.analysis.manifest import run_summary_beside, why_no_trace
from hf_distprof.analysis.compact import load_trace
from hf_distprof.analysis.model import AnalysisResult, FileError, Finding, KernelStat, RankResult
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.rank import analyze_rank
from hf_distprof.analysis.whatif import apply_what_if
from hf_distprof.analysis.timer_records import TimerRecords, read_timer_records
from hf_distprof.analysis.trace_io import NoTraceError, TraceReadError, discover_trace_files
from hf_distprof.core.overhead import profiler_slowdown

PROGRESS_MIN_FILES = 8


def analyze_file(
    path: str, options: AnalysisOptions, read_compact: bool = True, write_compact: bool = False
) -> RankResult | FileError:
    """Parse and analyse one trace file; a bad file becomes a :class:`FileError` naming it.

    Runs in a worker process, so it returns the small result rather than the parsed events. The trace's
    compact file (:mod:`hf_distprof.analysis.compact`) stands in for its JSON when there is a usable one
    and ``read_compact``; ``write_compact`` writes one when there is none.
    """
    try:
        shapes = True if options.message_sizes == "shapes" else None  # None: parse_trace's default
        return analyze_rank(load_trace(path, shapes, read_compact, write_compact), options)
    except TraceReadError as exc:
        return FileError(path=exc.path, reason=exc.reason)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        # A JSON document shaped like a trace but with malformed events (an "X" event without "ts" ...).
        return FileError(path=str(path), reason=f"malformed trace event ({type(exc).__name__}: {exc})")


def _start_method() -> str:
    """``fork`` when this process has a single OS thread (the CLI), else ``spawn``.

    Forking a process with other threads (a training process: torch's thread pools, NCCL/gloo threads)
    can deadlock the child, so then the workers are spawned, which re-imports this light package in each.
    A single-threaded process forks safely and saves that start-up (~0.1-0.2 s per worker). The thread
    count is read from ``/proc/self/task``, which sees native threads that ``threading`` does not.
    """
    try:
        single_threaded = len(os.listdir("/proc/self/task")) == 1
    except OSError:  # not Linux
        single_threaded = False
    return "fork" if single_threaded else "spawn"


def _run_all(
    files: list[str], options: AnalysisOptions, read_compact: bool = True, write_compact: bool = False
) -> list[RankResult | FileError]:
    workers = options.workers or min(len(files), os.cpu_count() or 1)
    show = options.progress
    if show is None:
        show = len(files) >= PROGRESS_MIN_FILES and sys.stderr.isatty()
    bar = None
    if show:
        from tqdm import tqdm  # imported only when a bar is shown

        bar = tqdm(total=len(files), desc="analysing traces", unit="file", file=sys.stderr)
    results: list[RankResult | FileError] = []
    try:
        if workers <= 1 or len(files) == 1:
            for path in files:
                results.append(analyze_file(path, options, read_compact, write_compact))
                if bar is not None:
                    bar.update(1)
        else:
            ctx = multiprocessing.get_context(_start_method())
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = [pool.submit(analyze_file, path, options, read_compact, write_compact) for path in files]
                for future in as_completed(futures):
                    results.append(future.result())
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


def analyze_paths(
    paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    options: AnalysisOptions | None = None,
    *,
    read_compact: bool = True,
    write_compact: bool = False,
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

    Returns:
        The result; ``result.errors`` lists files that could not be analysed (the others still are).

    Raises:
        FileNotFoundError: A path does not exist, or a folder holds no trace.
    """
    options = options or AnalysisOptions()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        files = [str(p) for p in discover_trace_files(paths)]
    except NoTraceError as exc:
        why = why_no_trace(exc.folder) if exc.run_folder else None
        if why is None:
            raise
        raise FileNotFoundError(f"{exc}: {why}") from None  # the run's manifest says why no window was taken
    outcomes = _run_all(files, options, read_compact, write_compact)
    errors = [o for o in outcomes if isinstance(o, FileError)]
    ranks = _one_result_per_rank([o for o in outcomes if isinstance(o, RankResult)], errors)
    # The step timer's records of the same run: each traced step's wait for a CPU, the steps outside the window,
    # and its verdict over those, judged again here (timing_summary.json's when the records cannot say).
    records = read_timer_records(files)
    judged = records.verdict(options.imbalance_pct, {s.step for r in ranks for s in r.steps})
    timer = judged.to_json() if judged is not None else timer_verdict_beside(files)
    cross = (cross_rank(ranks, options, records.cpu_wait(), timer, records.own_work(), records.own_steps())
             if len(ranks) > 1 else None)
    if len(ranks) > 1:
        # Which exposed communication is a wait for a late peer: only the rest can be the network's.
        matched = match_collectives(ranks)
        comm.set_waits(ranks, clock_offsets(ranks, matched), matched)
        for r in ranks:
            r.comm_by_kind = comm.by_kind(r.steps, r.collectives, gpu=r.device == "gpu")
    slowdown = profiler_slowdown_beside(files, ranks, options, records)
    findings = diagnose(ranks, cross, options) + slowdown_findings(slowdown)
    # A window whose verdicts were weighed with the timer's (across_the_run) already answers for the whole run.
    weighed = cross is not None and any(
        v is not None and v.test.endswith("+ step timer") for v in (cross.imbalance_verdict, cross.straggler_verdict)
    )
    findings, withheld = withhold_in_a_distorted_window(findings, slowdown, None if weighed else timer)
    # The slow rank's finding as one chain (its slow phase -> late at the collectives -> its peers wait), first.
    findings = chain.explain(findings, ranks, cross, records)
    findings.sort(key=lambda f: (f.kind != chain.SLOW_RANK, -f.severity))
    run, manifest_errors = run_summary_beside(files)  # hosts, windows and why, files lost since
    errors += [FileError(path, reason) for path, reason in manifest_errors]
    errors.sort(key=lambda e: e.path)
    result = AnalysisResult(
        ranks=ranks,
        cross_rank=cross,
        findings=findings,
        errors=errors,
        options=options,
        comm_by_kind=comm.mean_by_kind(ranks),
        comm_by_module=comm.by_module(ranks),
        undecided=undecided(cross) + withheld,
        profiler_slowdown=slowdown,
        bandwidth=bandwidth.collective_bandwidth(ranks),
        unsized_collectives=bandwidth.unsized(ranks),
        run=run,
    )
    apply_what_if(result)  # the steps replayed across ranks: what one fix would save, and the critical path
    return result


def profiler_slowdown_beside(
    files: list[str], ranks: list[RankResult], options: AnalysisOptions, records: TimerRecords | None = None
) -> dict[str, Any] | None:
    """The profiler's own slowdown, from the step timer's files in the traces' folders; None without them.

    ``timing_summary.json`` holds it when training ended normally (with the profiler options in effect);
    otherwise it is computed from ``timing_rank{R}.jsonl`` (``records``, read when None): the steps the profiler
    ran over (the rows' marks; in older files the traces' steps) against the others, the timer's warm-up left
    out. A file that cannot be read is skipped.
    """
    folders = sorted({Path(f).parent for f in files})
    for folder in folders:
        try:
            summary = json.loads((folder / names.TIMING_SUMMARY_NAME).read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
            continue
        found_json = _slowdown_json(summary.get("profiler_slowdown") if isinstance(summary, dict) else None)
        if found_json is not None:
            return found_json
    records = records if records is not None else read_timer_records(files)
    traced = {s.step for r in ranks for s in r.steps} | records.traced
    found = profiler_slowdown(records.step_times(), traced, {}, threshold_ratio=options.profiler_slowdown_threshold)
    return found.to_json() if found is not None else None


def cpu_wait_beside(files: list[str]) -> dict[int, dict[int, float]]:
    """rank -> step -> seconds its training thread waited for a CPU in that step (the step timer's
    ``cpu_wait_s``, read from ``timing_rank{R}.jsonl`` in the traces' folders); empty without them.

    A file that cannot be read, or a row without the number, is skipped; the cross-rank view uses the
    figures only when it has one for every rank and step it judges.
    """
    return read_timer_records(files).cpu_wait()


def _slowdown_json(doc: Any) -> dict[str, Any] | None:
    """``timing_summary.json``'s ``profiler_slowdown`` when every field the analysis reads has its type, else None
    (a file edited by hand or from another tool is then ignored, as an unreadable one is)."""
    if not isinstance(doc, dict) or not doc:
        return None

    def number(key: str, optional: bool = True) -> bool:
        value = doc.get(key)
        if value is None:
            return optional
        return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)

    warning = doc.get("warning")
    if not (number("ratio") and number("threshold_ratio", optional=False) and number("confidence")):
        return None
    if not (warning is None or isinstance(warning, str)):
        return None
    if warning and not (number("ratio", optional=False) and doc["ratio"] > 0):  # the finding divides by it
        return None
    return dict(doc)


def timer_verdict_beside(files: list[str]) -> dict[str, Any] | None:
    """The step timer's slow-rank verdict over the untraced steps (``timing_summary.json``), if there is one."""
    for folder in sorted({Path(f).parent for f in files}):
        try:
            verdict = json.loads((folder / names.TIMING_SUMMARY_NAME).read_text()).get("imbalance_verdict")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(verdict, dict):
            return verdict
    return None


def withhold_in_a_distorted_window(
    findings: list[Finding], slowdown: dict[str, Any] | None, timer: dict[str, Any] | None
) -> tuple[list[Finding], list[str]]:
    """Rank findings of a window that was not like the rest of the run, against a quiet step timer, withheld.

    When the traced steps ran materially slower than the others (the profiler's doing, or another process
    on the host) and the step timer, judging the untraced steps, names no slow rank, a straggler or
    imbalance seen in the trace describes that window, not the run: it becomes "not enough evidence".

    Returns:
        The findings kept, and the sentences for the withheld ones.
    """
    if not slowdown or not slowdown.get("warning") or not timer or timer.get("status") == "raised":
        return findings, []
    kept, withheld = [], []
    for f in findings:
        if f.kind in ("straggler", "imbalance"):
            withheld.append(
                f"{f.kind}: {f.title} withheld: the traced steps ran {float(slowdown['ratio']):.2f}x slower than "
                f"the rest of the run, and over the untraced steps the step timer names no slow rank "
                f"({timer.get('reason', 'quiet')})"
            )
        else:
            kept.append(f)
    return kept, withheld


def slowdown_findings(slowdown: dict[str, Any] | None) -> list[Finding]:
    """A finding when the profiler made the traced steps materially slower than the rest of the run."""
    if not slowdown or not slowdown.get("warning"):
        return []
    ratio = float(slowdown["ratio"])
    return [
        Finding(
            kind="profiler_slowdown",
            severity=100.0 * (1.0 - 1.0 / ratio),
            title="The profiler slows the traced steps",
            ranks=[],
            evidence=slowdown["warning"],
            recommendation=(
                "Read the trace's absolute times with care and trust its shares more; profile with fewer "
                "options (--profiler-record-shapes false, no --profiler-with-stack / --profiler-profile-memory "
                "unless you need them) and see PROFILING_GUIDE.md for what each option costs."
            ),
            numbers={"ratio": ratio},
            confidence=slowdown.get("confidence"),
        )
    ]


def _one_result_per_rank(results: list[RankResult], errors: list[FileError]) -> list[RankResult]:
    """Combine several profiling windows of the same rank; reject files that repeat a rank's steps."""
    by_rank: dict[int, RankResult] = {}
    for res in sorted(results, key=lambda r: (r.rank, r.steps[0].start_us, r.path)):
        prev = by_rank.get(res.rank)
        if prev is None:
            by_rank[res.rank] = res
            continue
        clash = {s.step for s in prev.steps} & {s.step for s in res.steps}
        if clash:
            errors.append(
                FileError(
                    res.path,
                    f"rank {res.rank} with step(s) {sorted(clash)} was already read from {prev.path}; "
                    "pass the traces of one run only",
                )
            )
            continue
        by_rank[res.rank] = _combine(prev, res)
    return [by_rank[k] for k in sorted(by_rank)]


def _combine(a: RankResult, b: RankResult) -> RankResult:
    """One rank's two profiling windows as one result (HTA's aggregate is per window, so it is dropped)."""
    kernels: dict[str, KernelStat] = {}
    for k in a.top_kernels + b.top_kernels:
        prev = kernels.get(k.name)
        if prev is None:
            kernels[k.name] = KernelStat(k.name, k.category, k.kind, k.count, k.total_us, k.min_us, k.max_us)
        else:
            prev.count += k.count
            prev.total_us += k.total_us
            prev.min_us = min(prev.min_us, k.min_us)
            prev.max_us = max(prev.max_us, k.max_us)
    steps = sorted(a.steps + b.steps, key=lambda s: s.start_us)
    gpu = "gpu" in (a.device, b.device)
    return RankResult(
        rank=a.rank,
        path=f"{a.path}, {b.path}",
        device="gpu" if gpu else "cpu",
        backend=a.backend or b.backend,
        world_size=a.world_size or b.world_size,
        host=a.host or b.host,
        n_events=a.n_events + b.n_events,
        steps=steps,
        gpu_total=None,
        kernel_categories_us=_add(a.kernel_categories_us, b.kernel_categories_us),
        kernel_categories_count=_add(a.kernel_categories_count, b.kernel_categories_count),
        top_kernels=sorted(kernels.values(), key=lambda k: (k.category, -k.total_us)),
        collectives=a.collectives + b.collectives,
        base_time_ns=a.base_time_ns,
        comm_by_kind=comm.by_kind(steps, a.collectives + b.collectives, gpu=gpu),
        memory=memory.combine(a.memory, b.memory),
        timeline=whatif_timeline.combine(a.timeline, b.timeline),
    )


def _add(a: dict, b: dict) -> dict:  # type: ignore[type-arg]
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def analysis_document(folder: Path) -> dict[str, Any] | None:
    """The trace analysis of one run folder as ``analysis.json`` holds it (what ``--profiler-analyze`` would have
    written); None when no rank's trace could be read. ``hf-distprof compare`` calls it for folders without one."""
    result = analyze_paths([folder])
    return result.to_dict() if result.ranks else None
