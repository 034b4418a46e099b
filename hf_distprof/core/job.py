"""Which launcher started this process, and which job and attempt of it this is (torchelastic, SLURM).

A job restarted by torchelastic (``torchrun --max-restarts N``: every worker restarts, with
``TORCHELASTIC_RESTART_COUNT`` one higher) or requeued by SLURM (``SLURM_RESTART_COUNT``) runs the same command
again, with the same ``--profiler-run-name``. Rank 0 then names the new run folder after the attempt
(:func:`attempt_suffix`), so the earlier attempt's files stay as they were; the run manifest records
:func:`job_record` on every rank.

Pure functions of the environment, no torch: the analysis layer reads the same record back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

TORCHELASTIC = "torchelastic"
SLURM = "slurm"
NO_LAUNCHER = "none"

# The job record's keys, each from one environment variable (ids as strings, counts as integers).
_IDS = {"torchelastic_run_id": "TORCHELASTIC_RUN_ID", "slurm_job_id": "SLURM_JOB_ID"}
_COUNTS = {
    "torchelastic_restart_count": "TORCHELASTIC_RESTART_COUNT",
    "slurm_restart_count": "SLURM_RESTART_COUNT",
    "slurm_node_id": "SLURM_NODEID",
    "slurm_proc_id": "SLURM_PROCID",
}
ID_KEYS = tuple(_IDS)
COUNT_KEYS = tuple(_COUNTS)


def job_record(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's job: its launcher and the ids and restart counts the launchers set (None where unset).

    ``launcher`` is the one that started the process: ``torchelastic`` when torchrun's (or ``accelerate
    launch``'s) elastic agent did, even inside a SLURM job (whose ids are kept too), else ``slurm`` inside a
    SLURM job, else ``none``.

    Args:
        environ: The environment to read; ``os.environ`` when None.
    """
    env = os.environ if environ is None else environ
    record: dict[str, Any] = {key: env.get(var) or None for key, var in _IDS.items()}
    for key, var in _COUNTS.items():
        value = env.get(var, "").strip()
        record[key] = int(value) if value.isdigit() else None
    if record["torchelastic_run_id"] is not None or record["torchelastic_restart_count"] is not None:
        launcher = TORCHELASTIC
    elif record["slurm_job_id"] is not None:
        launcher = SLURM
    else:
        launcher = NO_LAUNCHER
    return {"launcher": launcher, **record}


def attempt_suffix(job: Mapping[str, Any]) -> str:
    """What a restarted job's run folder name ends with: ``-requeue{S}`` and/or ``-attempt{T}``; "" for a first run.

    ``S`` is SLURM's restart count, ``T`` torchelastic's; a count of 0 (the first attempt) or none adds nothing.
    """
    suffix = ""
    if job.get("slurm_restart_count"):
        suffix += f"-requeue{job['slurm_restart_count']}"
    if job.get("torchelastic_restart_count"):
        suffix += f"-attempt{job['torchelastic_restart_count']}"
    return suffix


def describe_job(job: Mapping[str, Any]) -> str:
    """One line for a report: the SLURM job and requeue, the torchelastic run and attempt; "" when neither is known."""
    words = []
    if job.get("slurm_job_id") is not None:
        requeue = job.get("slurm_restart_count")
        words.append(f"SLURM job {job['slurm_job_id']}" + (f", requeue {requeue}" if requeue else ""))
    if job.get("torchelastic_run_id") is not None or job.get("torchelastic_restart_count") is not None:
        run_id = job.get("torchelastic_run_id")
        attempt = job.get("torchelastic_restart_count")
        if attempt is None:
            which = ""
        elif attempt == 0:
            which = ", attempt 0 (the first)"
        else:
            which = f", attempt {attempt} (restarted {attempt} time{'s' if attempt > 1 else ''})"
        # torchrun's default --rdzv-id is "none": no run id given.
        named = run_id is not None and str(run_id) != "none"
        words.append("torchelastic" + (f" run {run_id}" if named else "") + which)
    return "; ".join(words)
