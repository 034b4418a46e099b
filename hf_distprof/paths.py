"""Collision-free output names and atomic writes.

Layout of one run (all ranks of a run share ``<output_dir>/<run_name>/``)::

    <output_dir>/<run_name>/rank{R}_{host}_step{first}-{last}.pt.trace.json.gz
    <output_dir>/<run_name>/rank{R}_{host}_step{first}-{last}_summary.txt
    <output_dir>/<run_name>/memory_rank{R}.jsonl
    <output_dir>/<run_name>/parallelism.json        (rank 0: DDP/FSDP built, shard sizes)

``run_name`` defaults to the start time (``YYYYmmdd-HHMMSS``); rank 0 picks it, appending ``-1``, ``-2``
... when the folder already exists, and broadcasts it, so a new run never writes into an earlier run's
folder and every rank of one run writes into the same one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path

from hf_distprof import crash, dist, logs
from hf_distprof.core.files import (  # noqa: F401 (re-exported: callbacks write through paths)
    DEAD_WRITER_AGE_S,
    STALE_TEMP_AGE_S,
    TEMP_MARK,
    atomic_path,
    atomic_write_text,
    is_temp_file,
    remove_stale_temp_files,
)
from hf_distprof.core import job

logger = dist.get_logger(__name__)

# The names themselves live in hf_distprof.core.names; re-exported here for the callbacks.
from hf_distprof.core.names import (  # noqa: E402, F401
    ANALYSIS_NAME,
    FLIGHT_RECORDER_NAME,
    HANG_BACKSTOP_NAME,
    HANG_DUMP_NAME,
    MEMORY_LOG_NAME,
    MEMORY_MODULES_NAME,
    MEMORY_SNAPSHOT_NAME,
    MEMORY_STATS_NAME,
    MEMORY_SUMMARY_NAME,
    OOM_SNAPSHOT_NAME,
    PARALLELISM_NAME,
    RANK_LOG_NAME,
    SUMMARY_NAME,
    TIMING_LOG_NAME,
    TIMING_SUMMARY_NAME,
    TRACE_NAME,
    TRACE_SUFFIX,
)


# A file that each node's first process (LOCAL_RANK 0) writes this run's folder into, its absolute path and a newline,
# once the folder exists: how a launcher script learns which folder its training wrote, wherever
# --profiler-output-dir pointed and whatever else is beside it (local_scripts/train_lambda_with_profiling.sh).
RUN_DIR_FILE_ENV = "HF_DISTPROF_RUN_DIR_FILE"

# (output_dir, run_name, id(owner)) -> (owner, run folder): every callback of one train() call agrees on the
# folder and the broadcast happens once. The owner (the Trainer's per-train() TrainerState) is kept alive in
# the value so its id is never reused by a later train() call in the same process.
_RUN_DIRS: dict[tuple[str, str | None, int], tuple[object, Path | None]] = {}


def _claim_new_run_dir(output_dir: Path, run_name: str, refused: Collection[str] = ()) -> Path:
    """Create ``output_dir/run_name`` (or ``run_name-N``) that did not exist before, and is none of ``refused``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(10_000):
        candidate = output_dir / (run_name if attempt == 0 else f"{run_name}-{attempt}")
        if candidate.name in refused:
            continue
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"no free run folder for {run_name!r} in {output_dir} after 10000 tries")


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty (another rank's on a shared disk), or gone
        pass


def resolve_run_dir(
    output_dir: str | os.PathLike[str], run_name: str | None = None, owner: object = None
) -> Path | None:
    """Return this run's output folder, creating it; identical on every rank of the run.

    Must be called by every rank at the same point (a broadcast from rank 0, then a gather), at train start.
    A folder that cannot be created (read-only or full file system, a file in the way) on any rank is one
    warning and ``None`` on every rank: profiling then writes no files, and training goes on.

    Args:
        output_dir: The ``--profiler-output-dir`` folder.
        run_name: A fixed run name; the start time when None. A job restarted by torchelastic or requeued by
            SLURM adds its attempt (``-attempt1``, ``-requeue1``: :func:`hf_distprof.core.job.attempt_suffix`).
        owner: What one run is (callbacks pass the Trainer's ``state``, new for every ``train()`` call);
            calls with the same owner get the same folder.

    Returns:
        The run folder, which exists on return, or None when it could not be created.
    """
    key = (os.fspath(output_dir), run_name, id(owner))
    if key in _RUN_DIRS:
        return _RUN_DIRS[key][1]
    root = Path(output_dir).expanduser().absolute()
    chosen: str | None = None
    error: str | None = None
    rank = dist.get_rank()
    name = ""
    if rank == 0:
        try:
            # A job restarted by torchelastic or requeued by SLURM runs again under the same name: its folder says
            # the attempt (run-attempt1), and the earlier attempt's folder stays as it was.
            name = (run_name or time.strftime("%Y%m%d-%H%M%S")) + job.attempt_suffix(job.job_record())
            chosen = _claim_new_run_dir(root, name).name
        except OSError as err:
            error = f"cannot create a run folder in --profiler-output-dir {root}: {err}"
        else:
            stale = remove_stale_temp_files(root)
            if stale:
                logger.info(f"removed {len(stale)} temporary file(s) left in {root} by an earlier killed run")
    # Rank 0's outcome, failure included, so that every rank takes the same path afterwards.
    chosen, error = dist.broadcast_object((chosen, error))
    run_dir: Path | None = None
    refused: list[str] = []
    while error is None:  # the same on every rank: rank 0's outcome
        run_dir = root / str(chosen)
        local: str | None = None
        taken = made = False
        try:
            # Other ranks may be on other hosts with a node-local output folder: create it there too. There it may
            # hold an earlier run of the same name (rank 0's disk did not have it): never written into. Until every
            # rank has answered, nothing is written into the run folder, so on a shared disk rank 0's is empty.
            if rank != 0 and run_dir.is_dir() and any(run_dir.iterdir()):
                taken = True
            else:
                made = not run_dir.exists()
                run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            local = f"rank {rank}: cannot create the run folder {run_dir}: {err}"
        # Every rank must take the same path afterwards (the callbacks build their collectives on having a
        # folder), so a folder one rank cannot create (on its node) means no folder on any rank.
        answers = dist.all_gather_object((local, taken, dist.get_hostname()))
        failed = [e for e, _, _ in answers if e is not None]
        if failed:
            error, run_dir = local or failed[0], None
            break
        holders = [(r, host) for r, (_, t, host) in enumerate(answers) if t]
        if not holders:
            break
        # Every rank takes the next name free on rank 0's disk and not refused; the empty folders made for this one
        # go.
        refused.append(str(chosen))
        if made or rank == 0:
            _remove_if_empty(run_dir)
        if rank == 0:
            where = ", ".join(f"rank {r} on {host}" for r, host in holders)
            try:
                chosen = _claim_new_run_dir(root, name, refused).name
            except OSError as err:
                error = f"cannot create a run folder in --profiler-output-dir {root}: {err}"
            else:
                logger.warning(f"the run folder {run_dir.name} already holds an earlier run's files on the disk of "
                               f"{where} (a node-local --profiler-output-dir): this run writes into {chosen} on "
                               "every rank")
        chosen, error = dist.broadcast_object((chosen, error))
        run_dir = None
    if error is not None:
        logger.warning(f"{error}; profiling files are not written, training goes on")
    _RUN_DIRS[key] = (owner, run_dir)
    if run_dir is not None:
        log_to_run_dir(run_dir)
        crash.record_crashes(run_dir, dist.get_rank())  # a rank that dies leaves its stack there
        announce_run_dir(run_dir)
    return run_dir


def announce_run_dir(run_dir: Path) -> None:
    """Write ``run_dir`` into the file named by ``$HF_DISTPROF_RUN_DIR_FILE``, if set, from the first process of each
    node (``LOCAL_RANK`` 0, which torchrun and accelerate set; the global rank without it): one writer per machine,
    so that a file on a node-local disk names the folder on that node too. Atomic; a later ``train()`` in the same
    process names its own folder. A file that cannot be written is one warning."""
    target = os.environ.get(RUN_DIR_FILE_ENV)
    local_rank = os.environ.get("LOCAL_RANK", "").strip()
    if not target or (int(local_rank) if local_rank.isdigit() else dist.get_rank()) != 0:
        return
    try:
        atomic_write_text(Path(target).expanduser(), f"{run_dir}\n")
    except OSError as err:
        logger.warning(f"cannot write the run folder's path into ${RUN_DIR_FILE_ENV} ({target}): {err}")


def run_dirs_of(owner: object) -> list[Path]:
    """The run folders resolved for ``owner`` (the Trainer's ``state`` of one ``train()`` call), sorted."""
    return sorted({d for (o, d) in _RUN_DIRS.values() if o is owner and d is not None})


def log_to_run_dir(run_dir: Path) -> Path | None:
    """Copy this process's log records into ``<run_dir>/rank{R}.log`` (one file per rank, the rank on every line).

    hf_distprof's own records go there at INFO whatever level the script left on the root logger, and its
    warnings reach the console even when the script configured none (:mod:`hf_distprof.logs`). A file that
    cannot be opened is one warning.

    Returns:
        The log file, or None when it could not be opened.
    """
    rank = dist.get_rank()
    path = run_dir / RANK_LOG_NAME.format(rank=rank)
    try:
        return logs.open_rank_log(path, rank, dist.get_hostname())
    except OSError as err:
        logger.warning(f"cannot write {path}: {err!r}; this rank's log stays on the console only")
        return None


def trace_file_name(rank: int, host: str, first_step: int, last_step: int) -> str:
    """File name of one rank's trace for one profiled window of optimizer steps (inclusive)."""
    return TRACE_NAME.format(rank=rank, host=host, first=first_step, last=last_step)


def summary_file_name(rank: int, host: str, first_step: int, last_step: int) -> str:
    """File name of the text summary written next to a trace."""
    return SUMMARY_NAME.format(rank=rank, host=host, first=first_step, last=last_step)


