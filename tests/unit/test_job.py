"""The job record (launcher, job id, attempt): read from the environment, in the run folder's name, in the manifest."""

from __future__ import annotations

import json

import pytest

from hf_distprof import ProfilingArguments, paths
from hf_distprof.analysis.read.manifest import ManifestError, assemble, load_manifest, summarize
from hf_distprof.analysis.tell.run import format_run
from hf_distprof.core.job import attempt_suffix, describe_job, job_record
from hf_distprof.callbacks.profiler.manifest import RunManifest

from .test_manifest import two_host_parts

# What torchrun sets in a worker of a job's second attempt, inside srun on the second node of a requeued SLURM job.
SLURM_TORCHRUN = {"TORCHELASTIC_RUN_ID": "4242", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "2",
                  "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
                  "PATH": "/usr/bin"}


def test_the_job_record_takes_every_launcher_variable_present():
    assert job_record(SLURM_TORCHRUN) == {
        "launcher": "torchelastic", "torchelastic_run_id": "4242", "slurm_job_id": "4242",
        "torchelastic_restart_count": 1, "slurm_restart_count": 2, "slurm_node_id": 1, "slurm_proc_id": 1}
    plain_srun = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "0", "SLURM_PROCID": "3"}
    assert job_record(plain_srun) == {
        "launcher": "slurm", "torchelastic_run_id": None, "slurm_job_id": "77", "torchelastic_restart_count": None,
        "slurm_restart_count": None, "slurm_node_id": 0, "slurm_proc_id": 3}
    assert job_record({"PATH": "/usr/bin"}) == {
        "launcher": "none", "torchelastic_run_id": None, "slurm_job_id": None, "torchelastic_restart_count": None,
        "slurm_restart_count": None, "slurm_node_id": None, "slurm_proc_id": None}
    # A count that is not a number is not guessed at; an empty id is no id.
    assert job_record({"TORCHELASTIC_RESTART_COUNT": "x", "SLURM_JOB_ID": ""})["launcher"] == "none"


def test_a_restart_names_its_attempt_and_a_first_run_names_nothing():
    assert attempt_suffix(job_record(SLURM_TORCHRUN)) == "-requeue2-attempt1"
    assert attempt_suffix(job_record({"TORCHELASTIC_RESTART_COUNT": "3"})) == "-attempt3"
    assert attempt_suffix(job_record({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"})) == "-requeue1"
    assert attempt_suffix(job_record({"TORCHELASTIC_RESTART_COUNT": "0", "SLURM_RESTART_COUNT": "0"})) == ""
    assert attempt_suffix(job_record({})) == ""


def test_a_restarted_job_writes_into_a_run_folder_named_after_its_attempt(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = paths.resolve_run_dir(tmp_path, "exp", owner=object())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = paths.resolve_run_dir(tmp_path, "exp", owner=object())
    # The same attempt run again (a job resubmitted by hand) still gets a folder of its own.
    again = paths.resolve_run_dir(tmp_path, "exp", owner=object())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    requeued = paths.resolve_run_dir(tmp_path, None, owner=object())
    assert first is not None and second is not None and again is not None and requeued is not None
    assert (first.name, second.name, again.name) == ("exp", "exp-attempt1", "exp-attempt1-1")
    assert requeued.name.endswith("-requeue1-attempt1") and requeued.name[:8].isdigit()


def test_every_part_records_the_job_and_the_manifest_takes_rank_0s(tmp_path, monkeypatch):
    for var, value in SLURM_TORCHRUN.items():
        monkeypatch.setenv(var, value)
    manifest = RunManifest(tmp_path, ProfilingArguments(), ["h"], [{"offset_us": 0.0}], {})
    manifest.write_part()
    part = json.loads((tmp_path / "manifest_rank0_h.json").read_text())
    assert part["job"] == job_record(SLURM_TORCHRUN)
    m = load_manifest(tmp_path)
    assert m is not None and m["job"] == job_record(SLURM_TORCHRUN)
    assert (m["ranks"][0]["slurm_node_id"], m["ranks"][0]["slurm_proc_id"]) == (1, 1)


def test_the_run_section_says_the_job_and_attempt_and_old_manifests_still_read(tmp_path):
    parts = two_host_parts()  # written before the job record existed: no "job"
    for p in parts:
        p["job"] = job_record({**SLURM_TORCHRUN, "SLURM_NODEID": str(p["rank"] // 2)})
    run = summarize(assemble(parts, combined=True), tmp_path)
    assert run.job is not None and run.job["slurm_job_id"] == "4242"
    assert format_run(run)[1] == "  job: SLURM job 4242, requeue 2; torchelastic run 4242, attempt 1 (restarted 1 time)"

    old = summarize(assemble(two_host_parts(), combined=True), tmp_path)
    assert old.job is None and not any("job:" in line for line in format_run(old))
    assert describe_job(job_record({"TORCHELASTIC_RESTART_COUNT": "0"})) == "torchelastic, attempt 0 (the first)"
    assert describe_job(job_record({})) == ""
    # torchrun's default --rdzv-id, "none": no run id to name.
    assert describe_job(job_record({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"})) == (
        "torchelastic, attempt 0 (the first)")

    edited = assemble(two_host_parts(), combined=True) | {"job": {"launcher": "slurm", "slurm_job_id": 4242}}
    with pytest.raises(ManifestError, match="expected a string, got 4242"):
        summarize(edited, tmp_path)
