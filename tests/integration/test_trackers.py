"""The answer where users look: a user's plain Trainer script on 2 CPU ranks with ``report_to`` naming TensorBoard,
W&B (offline), MLflow (a local store) and Trackio (its local store). Each tracker is read back with its own library or
store: the live ``timing/*`` and throughput figures are in its history at their logging steps, and the end-of-run
answer's figures are those of ``hf-distprof analyze`` on the same run folder."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..conftest import REPO_ROOT, require
from ..unit.test_trackers import _wandb_run
from .launch import free_port

pytestmark = pytest.mark.integration
PLAIN = Path(__file__).with_name("plain_trainer.py")
STEPS, EVERY = 12, 4
LIVE = ("timing/step_s", "timing/imbalance_pct", "throughput/tokens_per_s")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import importlib.util

    for module in ("wandb", "mlflow", "trackio"):
        require(importlib.util.find_spec(module) is not None,
                f"{module} is not installed (pip install -e \".[trackers]\")")
    tmp = tmp_path_factory.mktemp("trackers")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PLAIN_CALLBACKS": "1", "PLAIN_COLLATOR_SLEEP": "1:0.05",
           "PLAIN_REPORT_TO": "tensorboard,wandb,mlflow,trackio",
           "WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb_home"), "WANDB_SILENT": "true",
           "WANDB_CONSOLE": "off", "WANDB_PROJECT": "hfdp", "WANDB_CONFIG_DIR": str(tmp / "wandb_config"),
           "WANDB_CACHE_DIR": str(tmp / "wandb_cache"), "WANDB_DATA_DIR": str(tmp / "wandb_data"),
           "MLFLOW_TRACKING_URI": f"file:{tmp / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
           "MLFLOW_EXPERIMENT_NAME": "hfdp", "TRACKIO_DIR": str(tmp / "trackio"), "TRACKIO_STORAGE_MODE": "sqlite",
           "TENSORBOARD_LOGGING_DIR": str(tmp / "tb")}
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID"):
        env.pop(var, None)
    for sub in ("wandb_home", "wandb_config", "wandb_cache", "wandb_data"):
        (tmp / sub).mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), "--output_dir", str(tmp / "out"), "--use_cpu", "true", "--disable_tqdm", "true",
           "--save_strategy", "no", "--max_steps", str(STEPS), "--per_device_train_batch_size", "8",
           "--logging_steps", str(EVERY), "--run_name", "plain", "--project", "hfdp",
           "--enable-profiling", "--profiler-output-dir", str(tmp / "prof"), "--profiler-run-name", "r"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    folder = tmp / "prof" / "r"
    out = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(folder), "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    from hf_distprof.analysis import AnalysisOptions, analyze_paths
    from hf_distprof.analysis.tell.tracker import answer

    result = analyze_paths(sorted(folder.glob("*.pt.trace.json.gz")), AnalysisOptions(workers=1))
    return {"tmp": tmp, "proc": proc, "reference": json.loads(out.stdout), "answer": answer(result, folder, STEPS)}


def test_the_run_says_where_the_answer_went(run: dict[str, Any]) -> None:
    said = [line for line in run["proc"].stdout.splitlines() if "the analysis went to" in line]
    assert len(said) == 1 and all(t in said[0] for t in ("tensorboard", "wandb", "mlflow", "trackio")), said
    assert "could not send" not in run["proc"].stderr


def test_the_answer_is_analyze_json_s(run: dict[str, Any]) -> None:
    ref, scalars = run["reference"], run["answer"].scalars
    assert ref["schema_version"] == 2
    assert scalars["hf_distprof/exposed_comm_pct"] == pytest.approx(ref["exposed_comm_pct"], rel=1e-9)
    assert scalars["hf_distprof/imbalance_pct"] == pytest.approx(ref["imbalance_pct"], rel=1e-9)
    assert scalars["hf_distprof/findings"] == len(ref["findings"])


def test_tensorboard_has_the_box_the_figures_and_the_live_scalars(run: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run["tmp"] / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    text = acc.Tensors("hf_distprof/answer")[-1].tensor_proto.string_val[0].decode()
    assert text == run["answer"].text
    for tag, value in run["answer"].scalars.items():
        (event,) = acc.Scalars(tag)
        assert (event.step, event.value) == (STEPS, pytest.approx(value, rel=1e-6)), tag
    for tag in LIVE:
        assert [e.step for e in acc.Scalars(tag)] == [4, 8, 12], tag


def test_mlflow_has_the_live_figures_at_their_steps_and_the_answer(run: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 reads a file store only when told
    client = MlflowClient(tracking_uri=f"file:{run['tmp'] / 'mlruns'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "hfdp"]
    (mlrun,) = client.search_runs([experiment.experiment_id])
    for tag in LIVE:
        assert [m.step for m in client.get_metric_history(mlrun.info.run_id, tag)] == [4, 8, 12], tag
    for tag, value in run["answer"].scalars.items():
        (metric,) = client.get_metric_history(mlrun.info.run_id, tag.replace("+", "_"))
        assert (metric.step, metric.value) == (STEPS, pytest.approx(value, rel=1e-9)), tag
    assert mlrun.data.tags["hf_distprof/verdict"] == run["answer"].summary["verdict"]
    files = {a.path for a in client.list_artifacts(mlrun.info.run_id, "hf_distprof")}
    assert {"hf_distprof/answer.md", "hf_distprof/findings.json", "hf_distprof/analysis.json",
            "hf_distprof/timing_summary.json", "hf_distprof/report.html"} <= files


def test_wandb_has_the_live_figures_at_their_steps_and_the_answer(run: dict[str, Any]) -> None:
    (folder,) = (run["tmp"] / "wandb_home" / "wandb").glob("offline-run-*")
    got = _wandb_run(folder)
    live = {int(row["train/global_step"]): row for row in got["history"] if "timing/step_s" in row}
    assert sorted(live) == [4, 8, 12] and all(set(LIVE) <= set(row) for row in live.values())
    for key, value in run["answer"].summary.items():
        if isinstance(value, int | float):
            assert got["summary"][f"hf_distprof/{key}"] == pytest.approx(value, rel=1e-9), key
        elif value is not None:
            assert got["summary"][f"hf_distprof/{key}"] == value, key
    assert any(a["type"] == "hf-distprof-report" or a["type"] == "hf_distprof-report" for a in got["artifacts"])


def test_trackio_has_the_live_figures_at_their_steps_and_the_answer(run: dict[str, Any]) -> None:
    with sqlite3.connect(run["tmp"] / "trackio" / "hfdp.db") as db:
        rows = [json.loads(m) for (m,) in db.execute("SELECT metrics FROM metrics WHERE run_name = 'plain' "
                                                      "ORDER BY id")]
    live = sorted(int(r["train/global_step"]) for r in rows if "timing/step_s" in r)
    assert live == [4, 8, 12]
    (answer_row,) = [r for r in rows if "hf_distprof/exposed_comm_pct" in r]
    assert answer_row["hf_distprof/exposed_comm_pct"] == pytest.approx(run["reference"]["exposed_comm_pct"],
                                                                        rel=1e-9)
