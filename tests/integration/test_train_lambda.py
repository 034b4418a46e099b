"""The main job end to end: 2 CPU ranks through train_lambda.sh write one trace per rank and memory scalars."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hf_distprof import dist

from ..conftest import REPO_ROOT
from . import output_schema
from .launch import DEMO, train_lambda

pytestmark = pytest.mark.integration

HOST = dist.get_hostname()
SHORT_SCHEDULE = ("--max-steps", "12", "--profiler-wait-steps", "2", "--profiler-warmup-steps", "1",
                  "--profiler-active-steps", "2", "--memory-log-steps", "4", "--logging-steps", "4")
ARGS = ("--enable-profiling", "--enable-memory-logging", "--memory-tracker", "--track-activation-memory",
        "--profiler-output-dir", "OUT", *SHORT_SCHEDULE)
EXPECTED_RUN_FILES = sorted(
    [f"rank{r}_{HOST}_step4-5.pt.trace.json.gz" for r in (0, 1)]
    + [f"rank{r}_{HOST}_step4-5.pt.trace.json.gz.compact.msgpack" for r in (0, 1)]
    + [f"rank{r}_{HOST}_step4-5_summary.txt" for r in (0, 1)]
    + [f"memory_rank{r}.jsonl" for r in (0, 1)]
    + ["memory_summary.json"]
    # --enable-profiling switches step timing on by default
    + [f"timing_rank{r}.jsonl" for r in (0, 1)]
    + ["timing_summary.json"]
    # what was built: DDP over 2 gloo ranks
    + ["parallelism.json"]
    # every rank's log records
    + ["rank0.log", "rank1.log"]
    # the run manifest: each rank's part, and rank 0's combined file
    + [f"manifest_rank{r}_{HOST}.json" for r in (0, 1)] + ["manifest.json"]
    # the demo reports to TensorBoard: the analysis, its answer there, and the report sent with it
    + ["analysis.json", "report"]
)
# An earlier run in the demo's default --profiler-output-dir, ./profiler_traces, when the demo runs into OUT.
OLDER_RUN = "older-run"
# The first run adds --memory-tracker and --track-activation-memory.
MEMORY_VIEW_FILES = sorted(
    [f"rank{r}_memory_stats.yaml" for r in (0, 1)]
    + [f"rank{r}_memory_modules.{ext}" for r in (0, 1) for ext in ("txt", "json")]
)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two runs with the same schedule into the same folders, the tree snapshotted between them: the first
    through train_lambda.sh, the second through the demo script with its schedule shortened and
    ``--profiler-output-dir OUT`` as an extra argument, while its default folder (./profiler_traces) holds an
    older run (a copy of the first) that is the newest folder there."""
    work = tmp_path_factory.mktemp("job")
    first = train_lambda(work, *ARGS)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    snapshot = digest(work / "OUT")
    run_dirs_first = sorted(p.name for p in (work / "OUT").iterdir())
    shutil.copytree(work / "OUT" / run_dirs_first[0], work / "profiler_traces" / OLDER_RUN)
    second = train_lambda(work, *SHORT_SCHEDULE, "--profiler-output-dir", "OUT", env={"SKIP_PREFLIGHT": "1"},
                          script=DEMO)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    return work, first, run_dirs_first, snapshot, second


def test_one_trace_per_rank_with_the_expected_names(two_runs):
    work, _, run_dirs_first, _, _ = two_runs
    assert len(run_dirs_first) == 1
    run_dir = work / "OUT" / run_dirs_first[0]
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(EXPECTED_RUN_FILES + MEMORY_VIEW_FILES)


@pytest.mark.parametrize("rank", [0, 1])
def test_trace_is_gzip_json_with_active_steps_and_collectives(two_runs, rank):
    work, _, run_dirs_first, _, _ = two_runs
    trace = work / "OUT" / run_dirs_first[0] / f"rank{rank}_{HOST}_step4-5.pt.trace.json.gz"
    with gzip.open(trace, "rt") as fh:
        data = json.load(fh)
    assert data["distributedInfo"]["rank"] == rank and data["distributedInfo"]["world_size"] == 2
    events = data["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#4", "ProfilerStep#5"]
    # DDP's gradient all-reduce: gloo spans on worker threads and the c10d op that enqueued them.
    assert sum(e.get("name") == "gloo:all_reduce" for e in events) >= 2
    assert sum(e.get("name") == "c10d::allreduce_" for e in events) >= 2


def test_memory_jsonl_per_rank(two_runs):
    work, _, run_dirs_first, _, _ = two_runs
    for rank in (0, 1):
        lines = (work / "OUT" / run_dirs_first[0] / f"memory_rank{rank}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert [(r["step"], r["rank"]) for r in rows] == [(4, rank), (8, rank), (12, rank)]


def test_ddp_is_reported_and_every_rank_holds_the_whole_model_state(two_runs):
    work, first, run_dirs_first, _, _ = two_runs
    run_dir = work / "OUT" / run_dirs_first[0]
    seen = json.loads((run_dir / "parallelism.json").read_text())
    assert (seen["built"], seen["asked"], seen["world_size"], seen["backend"], seen["distributed_type"]) == (
        "ddp", None, 2, "gloo", "MULTI_CPU"
    )
    assert seen["local_numel_per_rank"] == [seen["numel"]] * 2 and seen["dtensor_params"] == 0
    assert seen["warning"] is None
    assert "[RANK 0] parallelism: DDP, 2 rank(s) on gloo/cpu" in first.stderr + first.stdout
    for rank in (0, 1):
        rows = [json.loads(line) for line in (run_dir / f"memory_rank{rank}.jsonl").read_text().splitlines()]
        for row in rows:
            # float32 parameters and gradients, AdamW's two moments (plus a step counter per tensor)
            assert row["params_mb"] == row["grads_mb"] == seen["numel"] * 4 / 2**20
            assert 2 * row["params_mb"] <= row["optimizer_state_mb"] <= 2 * row["params_mb"] + 0.01


def test_memory_views_per_rank_with_parameters_activations_and_optimizer_state(two_runs):
    work, first, run_dirs_first, _, _ = two_runs
    run_dir = work / "OUT" / run_dirs_first[0]
    numel = json.loads((run_dir / "parallelism.json").read_text())["numel"]
    activations = []
    for rank in (0, 1):
        stats = yaml.safe_load((run_dir / f"rank{rank}_memory_stats.yaml").read_text())
        assert (stats["rank"], stats["device"]) == (rank, "cpu")
        assert sorted(stats["steps"]) == [4, 5]  # the profiler's active steps
        for entry in stats["steps"].values():
            (forward,) = entry["forward"]
            assert forward["activation_bytes"] > 0 and entry["start"]["rss_mb"] > 0
            activations.append(forward["activation_bytes"])
        modules = json.loads((run_dir / f"rank{rank}_memory_modules.json").read_text())
        assert (modules["rank"], modules["step"], modules["tracker"]) == (rank, 6, "MemTracker")
        root = modules["modules"][0]
        assert root["name"] == "ModernBertForMaskedLM" and root["params"] == root["grads"] == numel * 4
        assert 2 * root["params"] <= root["optimizer_state"] <= 2 * root["params"] + 10_000  # AdamW's moments
        assert root["activations"] > 0 and modules["peak"]["Activation"] > 0
        assert [r["name"] for r in modules["modules"][1:]] == [
            "ModernBertForMaskedLM.model", "ModernBertForMaskedLM.head", "ModernBertForMaskedLM.decoder"
        ]
        # The tracker's activations and the saved-tensor count agree within 1%.
        assert modules["peak"]["Activation"] == pytest.approx(activations[-1], rel=0.01)
    # Same shapes on every rank and step: the same bytes saved for backward.
    assert len(set(activations)) == 1
    assert "hf_distprof memory at the end of training" in first.stdout
    summary = json.loads((run_dir / "memory_summary.json").read_text())
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1] and summary["memory_growth"] == []


def test_tensorboard_holds_memory_scalars_of_both_ranks(two_runs):
    work, first, _, _, _ = two_runs
    tb_dir = re.search(r"TensorBoard events: (\S+)", first.stdout)
    assert tb_dir, first.stdout[-2000:]
    acc = EventAccumulator(str(work / tb_dir.group(1)))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"memory/rss_mb/rank0", "memory/rss_mb/rank1", "memory/rss_mb/max"} <= tags
    assert "train/loss" in tags  # the Trainer's own scalars share the run
    assert [e.step for e in acc.Scalars("memory/rss_mb/rank1")] == [4, 8, 12]


def test_rank0_tells_the_user_where_to_look(two_runs):
    work, first, run_dirs_first, _, _ = two_runs
    assert first.stdout.count("hf_distprof: training finished") == 1
    assert f"run folder: {work / 'OUT' / run_dirs_first[0]}  (2 trace(s))" in first.stdout
    assert "tensorboard --logdir" in first.stdout and "ui.perfetto.dev" in first.stdout


def test_second_run_adds_files_and_overwrites_none(two_runs):
    work, _, run_dirs_first, snapshot, _ = two_runs
    runs = sorted(p.name for p in (work / "OUT").iterdir())
    assert len(runs) == 2 and run_dirs_first[0] in runs
    after = digest(work / "OUT")
    assert {k: after[k] for k in snapshot} == snapshot  # every earlier file is still there, byte for byte
    new_run = work / "OUT" / next(r for r in runs if r not in run_dirs_first)
    assert sorted(p.name for p in new_run.iterdir()) == EXPECTED_RUN_FILES


def test_demo_script_ends_by_saying_where_everything_is(two_runs):
    work, _, run_dirs_first, _, second = two_runs
    new_run = next(p.name for p in (work / "OUT").iterdir() if p.name not in run_dirs_first)
    # Said once, by the training script's rank 0 (the block every script using build_callbacks ends with) ...
    assert second.stdout.count("hf_distprof: training finished") == 1
    tail = second.stdout[second.stdout.index("hf_distprof: training finished"):]
    assert f"run folder: {work / 'OUT' / new_run}  (2 trace(s))" in tail
    assert f"tensorboard --logdir {work / 'outputs' / 'modernbert' / 'runs'}" in tail
    assert f"hf-distprof analyze {work / 'OUT' / new_run}" in tail
    # ... and ends with the findings of this run's folder (not the newest one in ./profiler_traces, the demo's
    # default, which the extra --profiler-output-dir OUT overrode), not only file paths.
    findings = tail[tail.index(f"Findings (hf-distprof analyze {work / 'OUT' / new_run} --findings):"):]
    assert "Headline: exposed communication" in findings and "(2 rank(s))" in findings
    assert OLDER_RUN not in second.stdout + second.stderr
    assert sorted(p.name for p in (work / "profiler_traces").iterdir()) == [OLDER_RUN]


def test_bad_flag_through_the_launcher_exits_2_before_launching(tmp_path):
    proc = train_lambda(tmp_path, "--memory-log-steps", "0")
    assert proc.returncode == 2
    assert "--memory-log-steps: must be an integer >= 1, got '0'" in proc.stderr
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


def test_the_demo_tells_what_it_told_before_the_always_on_path_was_brought_to_the_floor(two_runs):
    # The demo's short run against the shape the same run had before issue 41 (tests/data/demo_outputs_schema.json,
    # written by tests/integration/output_schema.py from the code before it): every jsonl field and which are null,
    # the batch and model-state figures line by line, the summaries' keys, every TensorBoard tag of ours at its
    # steps, the end-of-run tables' columns.
    work, _, run_dirs_first, _, second = two_runs
    new_run = next(p for p in (work / "OUT").iterdir() if p.name not in run_dirs_first)
    tb_root = re.search(r"tensorboard --logdir (\S+)", second.stdout)
    assert tb_root, second.stdout[-2000:]
    tb_dirs = sorted(Path(tb_root.group(1)).iterdir(), key=lambda p: p.stat().st_mtime)
    found = output_schema.shape(new_run, tb_dirs[-1], second.stdout)
    reference = json.loads((REPO_ROOT / "tests" / "data" / "demo_outputs_schema.json").read_text())
    assert found.keys() == reference.keys()
    for key in reference:
        assert found[key] == reference[key], key
