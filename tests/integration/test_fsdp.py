"""FSDP for real on 2 CPU ranks: train_lambda.sh --strategy fsdp shards with FSDP2, every rank's trace holds
all-gathers and reduce-scatters, analyze splits them by kind and FSDP unit, and the memory logger shows
each rank holding half the model state. And the trap: FSDP asked through accelerate's config on CPU
silently becomes DDP, which the parallelism report names."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from hf_distprof import dist

from ..conftest import REPO_ROOT
from .launch import free_port, train_lambda

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
MB = 2**20
# The FSDP units of the demo's tiny ModernBERT on the CPU route: the root (embeddings, final norm, head)
# and one per encoder layer.
UNITS = ["", "model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"]
ARGS = ("--strategy", "fsdp", "--enable-profiling", "--enable-memory-logging", "--profiler-analyze", "--memory-tracker",
        "--max-steps", "10", "--profiler-wait-steps", "2", "--profiler-warmup-steps", "1",
        "--profiler-active-steps", "2", "--memory-log-steps", "5", "--logging-steps", "5",
        "--profiler-output-dir", "OUT", "--profiler-run-name", "fsdp")


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("fsdp")
    proc = train_lambda(work, *ARGS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc, work / "OUT" / "fsdp"


def test_run_folder_has_the_expected_files(fsdp_run):
    _, run_dir = fsdp_run
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"rank{r}_{HOST}_step4-5.pt.trace.json.gz" for r in (0, 1)]
        + [f"rank{r}_{HOST}_step4-5.pt.trace.json.gz.compact.msgpack" for r in (0, 1)]
        + [f"rank{r}_{HOST}_step4-5_summary.txt" for r in (0, 1)]
        + [f"memory_rank{r}.jsonl" for r in (0, 1)] + ["memory_summary.json"]
        + [f"rank{r}_memory_stats.yaml" for r in (0, 1)]
        + [f"rank{r}_memory_modules.{ext}" for r in (0, 1) for ext in ("txt", "json")]
        + [f"timing_rank{r}.jsonl" for r in (0, 1)]
        + ["timing_summary.json", "parallelism.json", "analysis.json", "rank0.log", "rank1.log"]
        + ["report"]  # the demo reports to TensorBoard: the answer and its report go there (issue 42)
        + [f"manifest_rank{r}_{HOST}.json" for r in (0, 1)] + ["manifest.json"]
    )


def test_parameters_are_sharded_dtensors(fsdp_run):
    proc, run_dir = fsdp_run
    seen = json.loads((run_dir / "parallelism.json").read_text())
    assert (seen["built"], seen["asked"], seen["sharded_by"]) == ("fsdp2", "fsdp2", "transformers DistributedConfig")
    assert seen["asked_by"] == ["transformers DistributedConfig(fsdp_size=2)"]
    assert (seen["world_size"], seen["backend"], seen["device_type"], seen["warning"]) == (2, "gloo", "cpu", None)
    assert seen["dtensor_params"] == seen["param_tensors"] > 0
    assert seen["fsdp_units"] == UNITS
    assert seen["reshard_after_forward"] == dict.fromkeys(UNITS[1:], True)
    per_rank = seen["local_numel_per_rank"]
    assert len(per_rank) == 2 and all(abs(n - seen["numel"] / 2) <= 0.01 * seen["numel"] for n in per_rank)
    assert "[RANK 0] parallelism: FSDP2 (sharded by transformers DistributedConfig), 2 rank(s) on gloo/cpu" in (
        proc.stderr + proc.stdout
    )
    assert "FSDP was asked for" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("rank", [0, 1])
def test_each_trace_holds_all_gathers_and_reduce_scatters(fsdp_run, rank):
    _, run_dir = fsdp_run
    with gzip.open(run_dir / f"rank{rank}_{HOST}_step4-5.pt.trace.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    names = Counter(e.get("name") for e in events if e.get("ph") == "X")
    # 2 steps x (5 units before forward + the 4 layers again before backward: the root keeps its parameters
    # after forward); 2 steps x 5 units of gradients.
    assert names["c10d::_allgather_base_"] == 18 and names["c10d::_reduce_scatter_base_"] == 10
    assert names["gloo:all_gather"] >= 20 and names["gloo:all_reduce"] >= 10  # gloo reduce-scatters as all_reduce
    assert names["FSDP::all_gather (model.layers.0)"] == 4 and names["FSDP::post_backward_reduce (model.layers.0)"] == 2


def test_analysis_reports_both_kinds_with_exposed_time(fsdp_run):
    _, run_dir = fsdp_run
    analysis = json.loads((run_dir / "analysis.json").read_text())
    for rank in analysis["ranks"]:
        rows = {r["kind"]: r for r in rank["comm_by_kind"]}
        # FSDP's 9 all-gathers per step, and the Trainer's all-gather of the batch's token count.
        assert (rows["all_gather"]["count_per_step"], rows["reduce_scatter"]["count_per_step"]) == (10, 5)
        for kind in ("all_gather", "reduce_scatter"):
            assert 0 < rows[kind]["exposed_us"] <= rows[kind]["time_us"]
            assert rows[kind]["exposed_pct"] > 0
    units = {(u["module"], u["kind"], u["phase"]) for u in analysis["comm_by_module"]}
    assert {(u, "all_gather", "forward") for u in UNITS} <= units
    assert {(u, "reduce_scatter", "backward") for u in UNITS} <= units


def test_analyze_cli_names_the_kinds_in_the_terminal_and_json(fsdp_run):
    _, run_dir = fsdp_run
    cli = [sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    text = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert "Communication by collective kind" in text and "FSDP collectives per unit" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("mean ")]
    assert [r[1] for r in rows] == ["all_gather", "reduce_scatter", "all_reduce"]
    data = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env, timeout=120,
                                     check=True).stdout)
    assert [r["kind"] for r in data["comm_by_kind"]][:2] == ["all_gather", "reduce_scatter"]


def test_each_rank_holds_half_the_model_state(fsdp_run):
    _, run_dir = fsdp_run
    seen = json.loads((run_dir / "parallelism.json").read_text())
    for rank in (0, 1):
        rows = [json.loads(line) for line in (run_dir / f"memory_rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [5, 10]
        for row in rows:
            local = seen["local_numel_per_rank"][rank]
            assert row["params_mb"] == pytest.approx(local * 4 / MB)  # float32 shards
            assert row["grads_mb"] == pytest.approx(local * 4 / MB)
            # AdamW: two moments per parameter shard, plus one step counter per tensor.
            assert 2 * row["params_mb"] <= row["optimizer_state_mb"] <= 2 * row["params_mb"] + 0.01
            assert row["params_mb"] < 0.51 * seen["numel"] * 4 / MB  # DDP would hold all of it


def test_the_memory_tracker_follows_every_fsdp_unit_and_counts_this_ranks_shard(fsdp_run):
    _, run_dir = fsdp_run
    seen = json.loads((run_dir / "parallelism.json").read_text())
    for rank in (0, 1):
        modules = json.loads((run_dir / f"rank{rank}_memory_modules.json").read_text())
        assert (modules["step"], modules["tracker"]) == (6, "FSDPMemTracker")
        names = [r["name"].split(".", 1)[1] if "." in r["name"] else "" for r in modules["modules"]]
        assert names == UNITS
        root = modules["modules"][0]
        # This rank's shard: half of what DDP holds (test_train_lambda: numel * 4 bytes on every rank).
        assert root["params"] == root["grads"] == seen["local_numel_per_rank"][rank] * 4
        assert root["params"] < 0.51 * seen["numel"] * 4
        assert {"Sharded Param", "Unsharded Param", "All Gather"} <= set(modules["peak"])


def test_fsdp_asked_through_accelerate_on_cpu_is_ddp_and_says_so(tmp_path):
    """The trap: accelerate's FSDP config on a machine without GPUs trains DDP without a word from accelerate
    or transformers; the parallelism report warns, naming FSDP, DDP and the cause."""
    cmd = ["accelerate", "launch", "--config_file", str(REPO_ROOT / "local_scripts" / "accelerate" / "fsdp2.yaml"),
           "--num_processes", "2", "--main_process_port", str(free_port()),
           str(REPO_ROOT / "python_scripts" / "train_modernBERT.py"),
           "--enable-step-timing", "--max-steps", "2", "--logging-steps", "2", "--profiler-output-dir", "OUT",
           "--profiler-run-name", "fallback"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TENSORBOARD_LOGGING_DIR", None)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    warning = (
        "FSDP was asked for (the accelerate config (ACCELERATE_USE_FSDP=true, FSDP_VERSION=2)) but the model is "
        "trained with DDP: accelerate runs DistributedType.MULTI_CPU on a machine without GPUs and ignores its "
        "FSDP plugin there"
    )
    assert (proc.stdout + proc.stderr).count(warning) == 1  # rank 0, once
    seen = json.loads((tmp_path / "OUT" / "fallback" / "parallelism.json").read_text())
    assert (seen["built"], seen["asked"], seen["distributed_type"]) == ("ddp", "fsdp2", "MULTI_CPU")
    assert seen["local_numel_per_rank"] == [seen["numel"], seen["numel"]] and seen["warning"].startswith(warning)
