"""A user's own Trainer script on 2 CPU ranks (gloo), as users write it (``plain_trainer.py``): the two-line
``build_callbacks`` route under three logging set-ups, and ``hf-distprof run`` on a script that never imports us."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof import dist

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
PLAIN = Path(__file__).with_name("plain_trainer.py")
# Asked for FSDP on a machine without GPUs: accelerate trains DDP, and our parallelism report warns (rank 0).
FSDP = ("--fsdp", "full_shard", "--fsdp_config", json.dumps({"fsdp_version": 2}))
MISMATCH = "FSDP was asked for ("
PROFILING = ("--enable-profiling", "--profiler-output-dir", "P", "--profiler-run-name", "run",
             "--profiler-wait-steps", "1", "--profiler-warmup-steps", "1", "--profiler-active-steps", "2")
BANNER = "hf_distprof: training finished"


def trainer_flags() -> list[str]:
    return ["--output_dir", "out", "--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true",
            "--save_strategy", "no", "--max_steps", "6", "--per_device_train_batch_size", "4"]


def torchrun_cmd() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), str(PLAIN)]


def launch(tmp_path: Path, cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def callbacks_route(tmp_path: Path, logging_style: str) -> subprocess.CompletedProcess[str]:
    return launch(tmp_path, [*torchrun_cmd(), *trainer_flags(), *FSDP, *PROFILING],
                  PLAIN_CALLBACKS="1", PLAIN_LOGGING=logging_style)


def our_lines(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


@pytest.mark.parametrize("logging_style", ["none", "basicconfig", "tf-error"])
def test_warnings_reach_the_console_once_and_info_reaches_the_rank_logs(tmp_path, logging_style):
    proc = callbacks_route(tmp_path, logging_style)
    # The mismatch warning: on the console exactly once (rank 0 says it; printed by the script's handler where it
    # has one, by ours where it has none), with the rank in it.
    (line,) = our_lines(proc.stderr, MISMATCH)
    assert "[RANK 0] FSDP was asked for" in line and "but the model is trained with DDP" in line
    run_dir = tmp_path / "P" / "run"
    # Every rank's log holds our INFO records, whatever level the script left on the root logger.
    for rank in (0, 1):
        log = (run_dir / f"rank{rank}.log").read_text()
        assert f"rank {rank} {HOST} INFO hf_distprof.callbacks.profiler.callback: [RANK {rank}] profiler wrote: " in log
    rank0 = (run_dir / "rank0.log").read_text()
    assert f"rank 0 {HOST} INFO hf_distprof.callbacks.parallelism: [RANK 0] parallelism: " in rank0
    assert rank0.count(MISMATCH) == 1
    # The end-of-run block, once (rank 0), naming this run's traces.
    assert proc.stdout.count(BANNER) == 1
    block = proc.stdout[proc.stdout.index(BANNER):]
    assert f"run folder: {run_dir}  (2 trace(s))" in block
    for rank in (0, 1):
        assert f"    rank{rank}_{HOST}_step3-4.pt.trace.json.gz" in block
    assert f"hf-distprof analyze {run_dir}" in block


def test_hf_distprof_run_profiles_a_script_that_never_imports_it(tmp_path):
    cmd = [sys.executable, "-m", "hf_distprof.cli.main", "run", *PROFILING, "--", *torchrun_cmd(), *trainer_flags()]
    proc = launch(tmp_path, cmd)
    (line,) = our_lines(proc.stderr, "hf-distprof run: attached")
    assert line.startswith("hf_distprof: [RANK 0] hf-distprof run: attached ProfilerCallback, StepTimerCallback, "
                           "TraceAnalysisCallback, RunSummaryCallback to Trainer built at ")
    assert line.endswith(f"{PLAIN}:{line.rsplit(':', 1)[1]}")
    run_dir = tmp_path / "P" / "run"
    # Said on the console by rank 0; every rank's log records what it attached, once, as its first line.
    attached = line.split("[RANK 0] ", 1)[1]
    for rank in (0, 1):
        log = (run_dir / f"rank{rank}.log").read_text().splitlines()
        assert log[0].endswith(f"rank {rank} {HOST} INFO hf_distprof.autorun: [RANK {rank}] {attached}"), log[:2]
        assert sum(attached in entry for entry in log) == 1
    assert sorted(p.name for p in run_dir.glob("*.pt.trace.json.gz")) == [
        f"rank{r}_{HOST}_step3-4.pt.trace.json.gz" for r in (0, 1)]
    summary = json.loads((run_dir / "timing_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps_in_means"] >= 1
    assert proc.stdout.count(BANNER) == 1


def test_hf_distprof_run_adds_nothing_to_a_script_that_passes_our_callbacks(tmp_path):
    # Through accelerate launch this time (on CPU, --multi_gpu gives 2 gloo ranks). The script's own flags ask for a
    # 2-step window; hf-distprof run's would ask for a 1-step window at step 2.
    run_flags = ["--enable-profiling", "--profiler-output-dir", "Q", "--profiler-wait-steps", "0",
                 "--profiler-warmup-steps", "1", "--profiler-active-steps", "1"]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--main_process_port", str(free_port()), str(PLAIN)]
    cmd = [sys.executable, "-m", "hf_distprof.cli.main", "run", *run_flags, "--", *accelerate, *trainer_flags(),
           *PROFILING]
    proc = launch(tmp_path, cmd, PLAIN_CALLBACKS="1")
    (line,) = our_lines(proc.stderr, "hf-distprof run:")
    assert ("already has ProfilerCallback, StepTimerCallback, TraceAnalysisCallback, RunSummaryCallback; it gets no "
            "callbacks from hf-distprof run (no duplicates)") in line
    assert not (tmp_path / "Q").exists()
    assert sorted(p.name for p in (tmp_path / "P" / "run").glob("*.pt.trace.json.gz")) == [
        f"rank{r}_{HOST}_step3-4.pt.trace.json.gz" for r in (0, 1)]
    assert proc.stdout.count(BANNER) == 1


def test_an_iterable_dataset_s_batches_are_loaded_by_rank_0_alone(tmp_path):
    # accelerate dispatches an IterableDataset's batches from rank 0 (dispatch_batches): rank 0 loads both ranks'
    # batches, rank 1 waits for the broadcast. Rank 1's loading is none of its own (a trial's rank 1 "held the others
    # back: its data loading", 8.8 ms more per step, its wait for rank 0 counted as its loading).
    launch(tmp_path, [*torchrun_cmd(), *trainer_flags(), "--enable-step-timing", "--profiler-output-dir", "P",
                      "--profiler-run-name", "run"], PLAIN_CALLBACKS="1", PLAIN_ITERABLE="1")
    folder = tmp_path / "P" / "run"
    rows = {r: [json.loads(line) for line in (folder / f"timing_rank{r}.jsonl").read_text().splitlines()]
            for r in (0, 1)}
    assert [row["step"] for row in rows[0]] == [row["step"] for row in rows[1]] == [1, 2, 3, 4, 5, 6]
    assert all(row["data_load_s"] > 0 for row in rows[0])  # rank 0 loads for both
    assert all(row["data_load_s"] == 0.0 for row in rows[1]) and all(row["data_s"] > 0 for row in rows[1])
