"""Every output file name of a run, in one place (no torch import: the trace analysis reads them too).

Layout of one run (all ranks of a run share ``<output_dir>/<run_name>/``; :mod:`hf_distprof.paths` picks
the folder)::

    rank{R}_{host}_step{first}-{last}.pt.trace.json.gz   the profiler's trace, per rank and window
    rank{R}_{host}_step{first}-{last}_summary.txt        its operator tables
    rank{R}_{host}_step{first}-{last}.pt.trace.json.gz.compact.msgpack   its compact summary for analyze
    memory_rank{R}.jsonl, memory_summary.json            the memory logger (summary: rank 0)
    rank{R}_memory_stats.yaml                            the memory views (--memory-tracker, ...)
    rank{R}_memory_modules.txt / .json                   --memory-tracker's per-module table
    rank{R}_{host}_step{first}-{last}_memory_snapshot.pickle   --memory-snapshot (GPU), per window
    rank{R}_{host}_oom_step{N}_memory_snapshot.pickle     --memory-snapshot (GPU), on out-of-memory
    timing_rank{R}.jsonl, timing_summary.json            the step timer (summary: rank 0)
    parallelism.json                                     rank 0: DDP/FSDP built, shard sizes
    analysis.json                                        rank 0, --profiler-analyze
    hang_rank{R}_{host}.txt                              --hang-timeout: every thread's stack when steps stop
    flight_recorder_rank{R}_{host}.pkl                   --hang-timeout on NCCL with the flight recorder on
    rank{R}.log                                          every rank's log records
    manifest_rank{R}_{host}.json                         every rank's part of the run manifest (start, each window)
    manifest.json                                        rank 0, train end: the run manifest (hosts, windows, files)
    PROFILE_NOW                                          touched by you: one profiler window (consumed)
    profile_ranks.json                                   rank 0, --profile-ranks auto: ranks chosen per window

``hf-distprof bench-collectives`` writes into its ``--output-dir`` (rank 0)::

    collectives_bench.csv, collectives_bench_busbw.png   one row per op and size; busbw against size

``hf-distprof compare A B --report DIR`` writes ``compare.md``, ``compare.json``, ``compare_phases.png``;
``hf-distprof scaling --output-dir DIR`` writes ``nproc{N}/`` (one run each), ``scaling.csv``,
``scaling.json``, ``scaling.png``.
"""

from __future__ import annotations

import re

TRACE_SUFFIX = ".pt.trace.json.gz"
TRACE_NAME = "rank{rank}_{host}_step{first}-{last}" + TRACE_SUFFIX
# Beside each trace, its name plus this: the events the analyzer reads, as columns (hf_distprof.analysis.read.compact).
COMPACT_SUFFIX = ".compact.msgpack"
SUMMARY_NAME = "rank{rank}_{host}_step{first}-{last}_summary.txt"
MEMORY_LOG_NAME = "memory_rank{rank}.jsonl"
MEMORY_SUMMARY_NAME = "memory_summary.json"
MEMORY_STATS_NAME = "rank{rank}_memory_stats.yaml"
MEMORY_MODULES_NAME = "rank{rank}_memory_modules"
MEMORY_SNAPSHOT_NAME = "rank{rank}_{host}_step{first}-{last}_memory_snapshot.pickle"
OOM_SNAPSHOT_NAME = "rank{rank}_{host}_oom_step{step}_memory_snapshot.pickle"
PARALLELISM_NAME = "parallelism.json"
TIMING_LOG_NAME = "timing_rank{rank}.jsonl"
TIMING_RE = re.compile(re.escape(TIMING_LOG_NAME).replace(r"\{rank\}", r"(\d+)") + "$")
"""Matches a step-timer log's file name; its group is the rank."""
TIMING_SUMMARY_NAME = "timing_summary.json"
ANALYSIS_NAME = "analysis.json"
HANG_DUMP_NAME = "hang_rank{rank}_{host}.txt"
CRASH_NAME = "rank{rank}_crash.txt"
"""Every thread's Python stack when the rank died of a fatal signal (:mod:`hf_distprof.crash`); removed when empty."""
EXCEPTION_NAME = "rank{rank}_exception.txt"
"""The traceback of an uncaught Python exception that ended the rank (:mod:`hf_distprof.crash`); only when one did."""
STOPPED_NAME = "rank{rank}_stopped.txt"
"""When and by which signal the rank was stopped (SIGTERM's default action, through :mod:`hf_distprof.core.signals`),
with every thread's stack then (:mod:`hf_distprof.crash`); only when one was."""
HANG_BACKSTOP_NAME = "hang_rank{rank}_{host}.faulthandler.txt"
FLIGHT_RECORDER_NAME = "flight_recorder_rank{rank}_{host}.pkl"
RANK_LOG_NAME = "rank{rank}.log"
# The run manifest: one part per rank, rewritten as its windows are written; rank 0 combines them at train end.
MANIFEST_NAME = "manifest.json"
MANIFEST_PART_NAME = "manifest_rank{rank}_{host}.json"
# Read, not written: --profile-on-demand opens one profiler window when this file appears in the run folder.
PROFILE_NOW_NAME = "PROFILE_NOW"
# --profile-ranks auto (rank 0): one record per window, the ranks chosen and the per-rank evidence.
PROFILE_RANKS_NAME = "profile_ranks.json"
BENCH_CSV_NAME = "collectives_bench.csv"
BENCH_PNG_NAME = "collectives_bench_busbw.png"
# hf-distprof compare --report DIR
COMPARE_MD = "compare.md"
COMPARE_JSON = "compare.json"
COMPARE_PNG = "compare_phases.png"
# hf-distprof scaling --output-dir DIR: one run folder per process count, then the table and the curve
SCALING_RUN_DIR = "nproc{nproc}"
SCALING_CSV = "scaling.csv"
SCALING_JSON = "scaling.json"
SCALING_PNG = "scaling.png"

# What opened an extra profiler window (a window's "reasons" in the run manifest, beside the schedule's).
ON_DEMAND = "on_demand"
ANOMALY = "anomaly"

# The version of the names and fields of the answer: analysis.json's "schema_version", and what the trackers get
# (hf_distprof.trackers: hf_distprof/schema_version). A renamed or removed figure raises it.
SCHEMA_VERSION = 2
