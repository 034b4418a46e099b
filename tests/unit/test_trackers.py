"""hf_distprof.trackers against the real tracker libraries, each in its offline / local mode, reading back what was
recorded from the tracker's own files: TensorBoard event files, the W&B offline run (its ``.wandb`` log), the MLflow
file store, and Trackio's SQLite store.

A missing tracker library skips its tests, except under ``CI=true``, where it fails them: a skip there would hide
tests that stopped running, so CI must install the ``trackers`` extra (``pip install -e ".[dev,trackers]"``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import struct
import subprocess
import sys
import time
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hf_distprof import trackers
from hf_distprof.trackers import Answer, summary_name
from hf_distprof.trackers._base import attachable
from hf_distprof.trackers._mlflow import mlflow_name
from tests.conftest import require

LOGGER = "hf_distprof.trackers"


def _need(module: str) -> Any:
    """Import a tracker library, or skip (fail under CI=true) when it is not installed."""
    try:
        return __import__(module)
    except ImportError as err:
        require(False, f"{module} is not installed ({err}); pip install -e .[trackers]")


@pytest.fixture(autouse=True)
def _each_test_warns_afresh() -> None:
    trackers.forget_warnings()


def _answer(folder: Path) -> Answer:
    """An answer like the analysis makes: figures, headline values (one None), a findings table with mixed
    column types, two files, and one that does not exist (skipped)."""
    (folder / "report.html").write_text("<html><body>report</body></html>")
    (folder / "analysis.json").write_text('{"verdict": "comm-bound"}')
    return Answer(
        text="## hf_distprof\n\n**Verdict: comm-bound** (rank 3 is the slowest)\n\n| finding | value |\n|---|---|\n",
        scalars={
            "hf_distprof/exposed_comm_pct": 21.5,
            "hf_distprof/findings": 2.0,
            "hf_distprof/whatif/overlap+prefetch_s": 3.25,
            "hf_distprof/not_a_number": float("nan"),
        },
        summary={"verdict": "comm-bound", "slowest_rank": 3, "exposed_comm_pct": 21.5, "predicted_saving_pct": None},
        table=(["finding", "value", "rank"], [["exposed communication", 21.5, None], ["slowest rank", "rank 3", 3]]),
        artifacts=[folder / "report.html", folder / "analysis.json", folder / "timing_summary.json"],
        step=10,
    )


def _trace(folder: Path) -> Path:
    trace = folder / "rank0.trace.json"
    trace.write_text('{"traceEvents": []}')
    return trace


def _warnings_by_tracker(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in caplog.records:
        if record.name != LOGGER or record.levelno != logging.WARNING:
            continue
        for label, tracker in (
            ("TensorBoard", "tensorboard"),
            ("W&B", "wandb"),
            ("MLflow", "mlflow"),
            ("Trackio", "trackio"),
        ):
            if f" to {label}" in record.getMessage():
                counts[tracker] = counts.get(tracker, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------------------------
# TensorBoard


def test_tensorboard_answer_text_scalars_and_hparams(tmp_path: Path) -> None:
    _need("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    answer = _answer(tmp_path)
    log_dir = tmp_path / "tb"
    assert trackers.send_answer(["tensorboard"], answer, tensorboard_dir=log_dir) == {"tensorboard": "sent"}

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    (text,) = events.Tensors("hf_distprof/answer")
    assert text.step == 10
    assert text.tensor_proto.string_val[0].decode() == answer.text
    assert events.SummaryMetadata("hf_distprof/answer").plugin_data.plugin_name == "text"

    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars["hf_distprof/exposed_comm_pct"] == [(10, 21.5)]
    assert scalars["hf_distprof/whatif/overlap+prefetch_s"] == [(10, 3.25)]
    assert scalars["hf_distprof/slowest_rank"] == [(10, 3.0)]  # a numeric headline value is a figure too
    assert "hf_distprof/not_a_number" not in scalars  # not finite: left out

    hparams = {
        tag: HParamsPluginData.FromString(content) for tag, content in events.PluginTagToContent("hparams").items()
    }
    start = hparams["_hparams_/session_start_info"].session_start_info.hparams
    assert start["hf_distprof/verdict"].string_value == "comm-bound"
    assert start["hf_distprof/schema_version"].number_value == trackers.SCHEMA_VERSION
    metrics = {m.name.tag for m in hparams["_hparams_/experiment"].experiment.metric_infos}
    assert metrics == {"hf_distprof/slowest_rank", "hf_distprof/exposed_comm_pct"}  # the numeric summary values


def test_tensorboard_live_is_left_to_the_step_timer_and_a_missing_folder_is_a_skip(tmp_path: Path) -> None:
    trackers.send_live(["tensorboard"], {"timing/step_s": 1.0}, 5, tensorboard_dir=tmp_path / "tb")
    trackers.send_text(["tensorboard"], "hf_distprof/warnings", "slow", 5)  # the step timer writes its own
    assert not (tmp_path / "tb").exists()
    # A sender without a TensorBoard writer of its own (the capture triggers) names the folder: one text event.
    _need("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hf_distprof import tensorboard

    trackers.send_text(["tensorboard"], "hf_distprof/captures", "window", 5, tensorboard_dir=tmp_path / "tb")
    tensorboard.close_writers()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (event,) = events.Tensors("hf_distprof/captures/text_summary")
    assert event.step == 5 and event.tensor_proto.string_val[0] == b"window"
    assert trackers.send_answer("tensorboard", _answer(tmp_path)) == {
        "tensorboard": "skipped: no TensorBoard folder given"
    }


def test_tensorboard_after_the_fact_writes_into_the_run_folder(tmp_path: Path) -> None:
    _need("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run-7"
    line = trackers.send_after_the_fact("tensorboard", _answer(tmp_path), run_dir)
    assert str(run_dir / "tensorboard") in line
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert "hf_distprof/answer" in events.Tags()["tensors"]


# ---------------------------------------------------------------------------------------------------------------
# W&B: an offline run, read back from its .wandb file (a LevelDB-format log of protobuf Records)


def _wandb_records(path: Path) -> list[Any]:
    """Every ``Record`` of a ``.wandb`` file.

    wandb 0.31 ships no reader (the old ``wandb.sdk.internal.datastore`` is gone with the Go core), but the format
    is documented: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB log blocks of 32 KiB whose
    chunks are ``crc32 (u32) | length (u16) | type (u8) | data``, type FULL=1, FIRST=2, MIDDLE=3, LAST=4; a
    block's last < 7 bytes are padding. The checksums are verified so a misread fails loudly; a chunk not yet
    written out in full ends the read.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    block = 32768
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        if pos + 7 + length > len(data):  # the writer is still at it: what is complete so far
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum
        pos += 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    out = []
    for raw in records:
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated protobuf class
        record.ParseFromString(raw)
        out.append(record)
    return out


def _wandb_items(items: Any) -> dict[str, Any]:
    """History or summary items as a dict: ``key`` or the nested-key path (one level kept: ``{top: {sub: v}}``)."""
    out: dict[str, Any] = {}
    for item in items:
        path = [item.key] if item.key else list(item.nested_key)
        value = json.loads(item.value_json)
        if len(path) == 1:
            out[path[0]] = value
        else:
            out.setdefault(path[0], {})[path[1]] = value
    return out


def _wandb_run(sync_dir: Path, timeout_s: float = 15.0) -> dict[str, Any]:
    """History rows, final summary and artifacts of an offline run folder.

    ``wandb.finish()`` returns before the wandb-core process has written the ``.wandb`` file out (it is often
    still the bare 7-byte header then), so this waits for the run's closing ``exit`` record."""
    (log,) = sync_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout_s
    while True:
        records = _wandb_records(log)
        if records and records[-1].WhichOneof("record_type") == "exit":
            break
        assert time.monotonic() < deadline, f"{log} has no exit record {timeout_s} s after wandb.finish()"
        time.sleep(0.05)
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    artifacts: list[dict[str, Any]] = []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(_wandb_items(record.history.item))
        elif kind == "summary":
            for key, value in _wandb_items(record.summary.update).items():
                summary[key] = value
            for item in record.summary.remove:
                summary.pop(item.key or item.nested_key[0], None)
        elif kind == "artifact":
            art = record.artifact
            artifacts.append(
                {"name": art.name, "type": art.type, "files": sorted(e.path for e in art.manifest.contents)}
            )
    return {"history": history, "summary": summary, "artifacts": artifacts}


@pytest.fixture(scope="module")
def wandb_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """wandb in offline mode, every folder it writes (runs, staging, cache, settings) in one temporary folder.

    One per module: wandb reads its environment once, when its process-wide setup is made (the first init), so
    the setup is torn down before (in case an earlier module made one) and after, and the tests find their
    offline run folders by run id."""
    home = tmp_path_factory.mktemp("wandb_home")
    patch = pytest.MonkeyPatch()
    for var, sub in (("WANDB_DIR", ""), ("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache")):
        (home / sub).mkdir(exist_ok=True)
        patch.setenv(var, str(home / sub))
    (home / "config").mkdir()
    patch.setenv("WANDB_CONFIG_DIR", str(home / "config"))
    patch.setenv("WANDB_MODE", "offline")
    patch.setenv("WANDB_SILENT", "true")
    patch.setenv("WANDB_CONSOLE", "off")
    patch.delenv("WANDB_PROJECT", raising=False)
    wandb = _need("wandb")
    wandb.teardown()
    yield wandb, home
    wandb.teardown()
    patch.undo()


@pytest.fixture
def wandb_offline(wandb_home: tuple[Any, Path]) -> Iterator[Any]:
    """The module's offline wandb; a run a failed test left open is finished, not handed to the next test."""
    wandb, _ = wandb_home
    yield wandb
    if wandb.run is not None:
        wandb.finish(exit_code=1)


def _wandb_offline_dir(home: Path, run_id: str) -> Path:
    (folder,) = (home / "wandb").glob(f"offline-run-*-{run_id}")
    return folder


def test_wandb_live_figures_events_and_answer_land_in_the_open_run(tmp_path: Path, wandb_offline: Any) -> None:
    wandb = wandb_offline
    answer = _answer(tmp_path)
    run = wandb.init(project="hf-distprof-test", name="trainer-run")
    try:
        # what the Trainer's WandbCallback declares: every metric plotted against train/global_step
        run.define_metric("train/global_step")
        run.define_metric("*", step_metric="train/global_step", step_sync=True)
        trackers.send_live("wandb", {"timing/step_s": 1.5, "timing/imbalance_pct": 4.0}, 5)
        trackers.send_live(["wandb"], {"timing/step_s": 1.75, "throughput/tokens_per_s": 1200.0}, 10)
        trackers.send_text("wandb", "hf_distprof/warnings", "rank 3 waits 40% of the step", 10)
        outcome = trackers.send_answer(["wandb"], answer, include_traces=[_trace(tmp_path)])
        sync_dir, run_id = Path(run.sync_dir), run.id
    finally:
        wandb.finish()
    assert outcome == {"wandb": "sent"}

    recorded = _wandb_run(sync_dir)
    by_step: dict[int, dict[str, Any]] = {}
    for row in recorded["history"]:
        if "train/global_step" in row:
            by_step.setdefault(row["train/global_step"], {}).update(row)
    assert by_step[5]["timing/step_s"] == 1.5 and by_step[5]["timing/imbalance_pct"] == 4.0
    assert by_step[10]["timing/step_s"] == 1.75 and by_step[10]["throughput/tokens_per_s"] == 1200.0
    assert by_step[10]["hf_distprof/exposed_comm_pct"] == 21.5
    assert by_step[10]["hf_distprof/whatif/overlap+prefetch_s"] == 3.25
    assert "hf_distprof/not_a_number" not in by_step[10]

    events = by_step[10]["hf_distprof/warnings"]
    table = json.loads((sync_dir / "files" / events["path"]).read_text())
    assert table["columns"] == ["step", "text"] and table["data"] == [[10, "rank 3 waits 40% of the step"]]
    assert by_step[10]["hf_distprof/findings"] == 2.0  # the count: the table has a key of its own (it hid the count)
    findings = by_step[10]["hf_distprof/findings_table"]
    table = json.loads((sync_dir / "files" / findings["path"]).read_text())
    assert table["columns"] == ["finding", "value", "rank"]
    assert table["data"] == [["exposed communication", 21.5, None], ["slowest rank", "rank 3", 3]]

    summary = recorded["summary"]
    for key, value in answer.summary.items():
        assert summary[summary_name(key)] == value
    assert summary["hf_distprof/schema_version"] == trackers.SCHEMA_VERSION

    (artifact,) = [a for a in recorded["artifacts"] if a["type"] == trackers.ARTIFACT_TYPE]
    assert artifact["name"] == f"hf_distprof-{run_id}"
    assert artifact["files"] == ["analysis.json", "answer.md", "report.html", "traces/rank0.trace.json"]


def test_wandb_after_the_fact_starts_a_run_named_after_the_folder(
    tmp_path: Path, wandb_home: tuple[Any, Path], wandb_offline: Any
) -> None:
    wandb, home = wandb_home
    run_dir = tmp_path / "run-20240101-abc"
    line = trackers.send_after_the_fact("wandb", _answer(tmp_path), run_dir, project="after")
    assert line.startswith("W&B run ") and "(run-20240101-abc) in project after: offline in " in line
    assert wandb.run is None  # finished, and never made the process's current run
    run_id = line.split()[2]
    recorded = _wandb_run(_wandb_offline_dir(home, run_id))
    assert recorded["summary"]["hf_distprof/verdict"] == "comm-bound"
    assert any(a["type"] == trackers.ARTIFACT_TYPE for a in recorded["artifacts"])


# ---------------------------------------------------------------------------------------------------------------
# MLflow: a file store under tmp_path, read back with MlflowClient


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    mlflow = _need("mlflow")
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses the file store without it
    for var in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    yield mlflow, uri
    while mlflow.active_run() is not None:
        mlflow.end_run()


def test_mlflow_live_figures_events_and_answer_land_in_the_active_run(tmp_path: Path, mlflow_store: Any) -> None:
    mlflow, uri = mlflow_store
    answer = _answer(tmp_path)
    with mlflow.start_run(run_name="trainer-run") as run:
        run_id = run.info.run_id
        trackers.send_live("mlflow", {"timing/step_s": 1.5}, 5)
        trackers.send_live("mlflow", {"timing/step_s": 1.75}, 10)
        trackers.send_text("mlflow", "hf_distprof/warnings", "rank 3 waits", 10)
        trackers.send_text("mlflow", "hf_distprof/hints", "enable overlap", 10)
        outcome = trackers.send_answer("mlflow", answer, include_traces=[_trace(tmp_path)])
    assert outcome == {"mlflow": "sent"}

    client = mlflow.MlflowClient(uri)
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "timing/step_s")]
    assert sorted(history) == [(5, 1.5), (10, 1.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "hf_distprof/exposed_comm_pct")] == [
        (10, 21.5)
    ]
    # '+' is not allowed in MLflow names: the figure is renamed, not lost with its whole batch
    assert mlflow_name("hf_distprof/whatif/overlap+prefetch_s") == "hf_distprof/whatif/overlap_prefetch_s"
    assert client.get_metric_history(run_id, "hf_distprof/whatif/overlap_prefetch_s")[0].value == 3.25
    stored = client.get_run(run_id)
    assert "hf_distprof/not_a_number" not in stored.data.metrics
    tags = stored.data.tags
    assert tags["hf_distprof/verdict"] == "comm-bound"
    assert tags["hf_distprof/slowest_rank"] == "3"
    assert tags["hf_distprof/schema_version"] == str(trackers.SCHEMA_VERSION)
    assert "hf_distprof/predicted_saving_pct" not in tags  # None: no tag

    listed = {a.path for a in client.list_artifacts(run_id, "hf_distprof")}
    assert {
        "hf_distprof/answer.md",
        "hf_distprof/findings.json",
        "hf_distprof/report.html",
        "hf_distprof/analysis.json",
        "hf_distprof/traces",
        "hf_distprof/events",
    } <= listed
    assert "hf_distprof/timing_summary.json" not in listed  # the missing file is skipped
    fetched = Path(client.download_artifacts(run_id, "hf_distprof", str(tmp_path / "fetched")))
    assert (fetched / "answer.md").read_text() == answer.text
    assert json.loads((fetched / "findings.json").read_text()) == {
        "columns": ["finding", "value", "rank"],
        "data": [["exposed communication", 21.5, None], ["slowest rank", "rank 3", 3]],
    }
    assert (fetched / "events" / "step10.txt").read_text().splitlines() == [
        "[hf_distprof/warnings] rank 3 waits",
        "[hf_distprof/hints] enable overlap",
    ]
    assert (fetched / "traces" / "rank0.trace.json").exists()


def test_mlflow_after_the_fact_new_run_and_given_run(tmp_path: Path, mlflow_store: Any) -> None:
    mlflow, uri = mlflow_store
    client = mlflow.MlflowClient(uri)
    answer = _answer(tmp_path)

    line = trackers.send_after_the_fact("mlflow", answer, tmp_path / "run-abc", project="hf-distprof-after")
    assert line.startswith("MLflow run ") and "(run-abc)" in line
    experiment = client.get_experiment_by_name("hf-distprof-after")
    (new_run,) = client.search_runs([experiment.experiment_id])
    assert new_run.info.run_name == "run-abc" and new_run.info.status == "FINISHED"
    assert new_run.data.tags["hf_distprof/verdict"] == "comm-bound"
    assert mlflow.active_run() is None

    existing = client.create_run(experiment.experiment_id, run_name="the-training")
    line = trackers.send_after_the_fact("mlflow", answer, tmp_path / "run-abc", run_id=existing.info.run_id)
    assert existing.info.run_id in line
    stored = client.get_run(existing.info.run_id)
    assert stored.data.metrics["hf_distprof/exposed_comm_pct"] == 21.5
    assert stored.info.status == "RUNNING"  # the given run's status is left alone
    assert len(client.search_runs([experiment.experiment_id])) == 2


# ---------------------------------------------------------------------------------------------------------------
# Trackio: its local SQLite store, pointed at a temporary folder


@pytest.fixture(scope="module")
def trackio_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """trackio with its store (``TRACKIO_DIR``, read once at import by trackio.utils) in a temporary folder.

    The variable is set before the first import; when trackio was imported earlier in this process, the paths
    its modules computed from the old folder are re-pointed instead."""
    store = tmp_path_factory.mktemp("trackio")
    patch = pytest.MonkeyPatch()
    patch.setenv("TRACKIO_DIR", str(store))
    patch.setenv("TRACKIO_STORAGE_MODE", "sqlite")
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID"):
        patch.delenv(var, raising=False)
    imported_before = "trackio" in sys.modules and sys.modules["trackio"] is not None
    trackio = _need("trackio")
    if imported_before:
        old = Path(trackio.utils.TRACKIO_DIR)
        for name, module in list(sys.modules.items()):
            if not name.startswith("trackio") or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if isinstance(value, Path) and value.is_relative_to(old):
                    patch.setattr(module, attr, store / value.relative_to(old))
    yield trackio, store
    patch.undo()


def _trackio_rows(store: Path, project: str, run: str) -> list[dict[str, Any]]:
    with sqlite3.connect(store / f"{project}.db") as db:
        rows = db.execute("SELECT metrics FROM metrics WHERE run_name = ? ORDER BY id", (run,)).fetchall()
    return [json.loads(metrics) for (metrics,) in rows]


def test_trackio_live_figures_events_and_answer_land_in_the_current_run(tmp_path: Path, trackio_store: Any) -> None:
    trackio, store = trackio_store
    answer = _answer(tmp_path)
    trackio.init(project="hf-distprof-test", name="trainer-run", auto_log_cpu=False, auto_log_gpu=False, embed=False)
    try:
        trackers.send_live("trackio", {"timing/step_s": 1.5}, 5)
        trackers.send_live("trackio", {"timing/step_s": 1.75}, 10)
        trackers.send_text("trackio", "hf_distprof/warnings", "rank 3 waits", 10)
        outcome = trackers.send_answer("trackio", answer, include_traces=[_trace(tmp_path)])
    finally:
        trackio.finish()
    assert outcome == {"trackio": "sent"}

    rows = _trackio_rows(store, "hf-distprof-test", "trainer-run")
    live = [(r["train/global_step"], r["timing/step_s"]) for r in rows if "timing/step_s" in r]
    assert live == [(5, 1.5), (10, 1.75)]
    (event,) = [r["hf_distprof/warnings"] for r in rows if "hf_distprof/warnings" in r]
    assert event == {"_type": "trackio.markdown", "_value": "**Step 10:** rank 3 waits"}

    (last,) = [r for r in rows if "hf_distprof/answer" in r]
    assert last["train/global_step"] == 10
    assert last["hf_distprof/answer"] == {"_type": "trackio.markdown", "_value": answer.text}
    assert last["hf_distprof/exposed_comm_pct"] == 21.5 and last["hf_distprof/slowest_rank"] == 3
    assert last["hf_distprof/verdict"] == "comm-bound"
    assert "hf_distprof/not_a_number" not in last
    assert last["hf_distprof/findings"] == 2.0  # the count: the table has a key of its own (it hid the count)
    assert last["hf_distprof/findings_table"]["_type"] == "trackio.table"
    assert last["hf_distprof/findings_table"]["_value"] == [
        {"finding": "exposed communication", "value": 21.5, "rank": None},
        {"finding": "slowest rank", "value": "rank 3", "rank": 3},
    ]

    with sqlite3.connect(store / "hf-distprof-test.db") as db:
        (name, kind, manifest, metadata) = db.execute(
            "SELECT a.name, a.type, v.manifest, v.metadata FROM artifacts a "
            "JOIN artifact_versions v ON v.artifact_id = a.id WHERE v.producer_run_name = ?",
            ("trainer-run",),
        ).fetchone()
    assert (name, kind) == ("hf_distprof-trainer-run", trackers.ARTIFACT_TYPE)
    assert sorted(e["path"] for e in json.loads(manifest)) == [
        "analysis.json",
        "answer.md",
        "report.html",
        "traces/rank0.trace.json",
    ]
    assert json.loads(metadata)["hf_distprof/verdict"] == "comm-bound"


def test_trackio_after_the_fact_leaves_the_current_run_alone(tmp_path: Path, trackio_store: Any) -> None:
    trackio, store = trackio_store
    from trackio import context_vars

    mine = trackio.init(project="hf-distprof-other", name="users-run", auto_log_cpu=False, auto_log_gpu=False)
    try:
        line = trackers.send_after_the_fact(
            "trackio", _answer(tmp_path), tmp_path / "run-xyz", project="hf-distprof-after"
        )
        assert line.startswith("Trackio run run-xyz in project hf-distprof-after")
        assert trackio.config is mine.config
        assert context_vars.current_run.get() is mine  # neither finished nor replaced
    finally:
        trackio.finish()
    (row,) = _trackio_rows(store, "hf-distprof-after", "run-xyz")
    assert row["hf_distprof/verdict"] == "comm-bound"


# ---------------------------------------------------------------------------------------------------------------
# No run open: nothing is started


def test_no_open_run_means_nothing_is_sent_and_no_run_is_started(
    tmp_path: Path,
    wandb_home: tuple[Any, Path],
    wandb_offline: Any,
    mlflow_store: Any,
    trackio_store: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (wandb, home), (mlflow, uri), (_, store) = wandb_home, mlflow_store, trackio_store
    from trackio import context_vars

    assert wandb.run is None and mlflow.active_run() is None and context_vars.current_run.get() is None
    wandb_runs_before = sorted((home / "wandb").glob("offline-run-*"))
    dbs_before = sorted(store.glob("*.db"))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        trackers.send_live(["wandb", "mlflow", "trackio"], {"timing/step_s": 1.0}, 5)
        trackers.send_text(["wandb", "mlflow", "trackio"], "hf_distprof/warnings", "slow", 5)
        outcome = trackers.send_answer(["wandb", "mlflow", "trackio"], _answer(tmp_path))
    assert outcome == {
        "wandb": "skipped: no run open",
        "mlflow": "skipped: no run open",
        "trackio": "skipped: no run open",
    }
    assert wandb.run is None and mlflow.active_run() is None and context_vars.current_run.get() is None
    assert sorted((home / "wandb").glob("offline-run-*")) == wandb_runs_before
    assert not (tmp_path / "mlruns").exists() or not mlflow.MlflowClient(uri).search_runs(["0"])
    assert sorted(store.glob("*.db")) == dbs_before
    # live sends without a run are normal (other ranks, before the callback opens it): DEBUG; the answer warns
    assert _warnings_by_tracker(caplog) == {"wandb": 1, "mlflow": 1, "trackio": 1}


# ---------------------------------------------------------------------------------------------------------------
# Failures: one warning per tracker, never an exception (no tracker library needed)


def test_a_library_that_cannot_be_imported_costs_one_warning_and_no_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for module in ("wandb", "mlflow", "trackio", "tensorboard"):
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    every = ["tensorboard", "wandb", "mlflow", "trackio"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for step in (5, 10):
            trackers.send_live(every, {"timing/step_s": 1.0}, step)
            trackers.send_text(every, "hf_distprof/warnings", "slow", step)
        outcome = trackers.send_answer(every, _answer(tmp_path), tensorboard_dir=tmp_path / "tb")
        line = trackers.send_after_the_fact("mlflow", _answer(tmp_path), tmp_path / "run")
    assert outcome == {
        "tensorboard": "skipped: tensorboard is not installed (pip install tensorboard)",
        "wandb": "skipped: wandb is not installed (pip install wandb)",
        "mlflow": "skipped: mlflow is not installed (pip install mlflow-skinny)",
        "trackio": "skipped: trackio is not installed (pip install trackio)",
    }
    assert line == "mlflow: skipped: mlflow is not installed (pip install mlflow-skinny)"
    assert _warnings_by_tracker(caplog) == {"tensorboard": 1, "wandb": 1, "mlflow": 1, "trackio": 1}
    assert not (tmp_path / "tb").exists()


class _Broken:
    """A tracker run whose every call raises, as a run whose backend went away would."""

    id = name = "broken"

    def log(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("backend unreachable")


def test_a_tracker_that_raises_costs_one_warning_and_reports_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # stand-in libraries whose open run raises: what is tested is our handling, not the libraries
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.run = _Broken()  # type: ignore[attr-defined]
    fake_mlflow = types.ModuleType("mlflow")

    def active_run() -> None:
        raise RuntimeError("tracking server unreachable")

    fake_mlflow.active_run = active_run  # type: ignore[attr-defined]
    fake_trackio = types.ModuleType("trackio")
    fake_trackio.context_vars = types.SimpleNamespace(  # type: ignore[attr-defined]
        current_run=types.SimpleNamespace(get=lambda: _Broken())
    )
    for name, module in (("wandb", fake_wandb), ("mlflow", fake_mlflow), ("trackio", fake_trackio)):
        monkeypatch.setitem(sys.modules, name, module)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the TensorBoard folder should be")

    every = ["tensorboard", "wandb", "mlflow", "trackio"]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        trackers.send_live(every, {"timing/step_s": 1.0}, 5)
        trackers.send_live(every, {"timing/step_s": 1.0}, 10)
        outcome = trackers.send_answer(every, _answer(tmp_path), tensorboard_dir=blocked)
    assert all(status.startswith("failed: ") for status in outcome.values()), outcome
    assert outcome["mlflow"] == "failed: RuntimeError: tracking server unreachable"
    assert _warnings_by_tracker(caplog) == {"tensorboard": 1, "wandb": 1, "mlflow": 1, "trackio": 1}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("RuntimeError: backend unreachable" in message for message in warned) == 2  # W&B and Trackio, live

    trackers.forget_warnings()  # a new training in the same process warns again
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        caplog.clear()
        trackers.send_live(["wandb"], {"timing/step_s": 1.0}, 15)
    assert _warnings_by_tracker(caplog) == {"wandb": 1}


# ---------------------------------------------------------------------------------------------------------------
# Names, report_to, and a cheap import


def test_resolve_follows_the_trainers_report_to(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trackers.resolve(None) == [] and trackers.resolve("none") == [] and trackers.resolve(["none"]) == []
    assert trackers.resolve("wandb") == ["wandb"]
    assert trackers.resolve(["MLflow", "comet_ml", "wandb", "mlflow"]) == ["mlflow", "wandb"]
    assert trackers.resolve("wandb, trackio") == ["wandb", "trackio"]
    for module in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "TRUE")  # transformers leaves MLflow out of "all" then
    assert trackers.resolve("all") == trackers.resolve(["all"]) == ["tensorboard"]
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION")
    expected = ["tensorboard", "mlflow"] if trackers._installed("mlflow") else ["tensorboard"]
    assert trackers.resolve("all") == expected
    with pytest.raises(ValueError, match="comet_ml"):
        trackers.send_after_the_fact("comet_ml", _answer_stub(), Path("run"))


def _answer_stub() -> Answer:
    return Answer(text="", scalars={}, summary={}, table=([], []), artifacts=[], step=0)


def test_attached_files_keep_their_names_and_missing_ones_are_skipped(tmp_path: Path) -> None:
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "timing_summary.json").write_text("{}")
    paths = [tmp_path / f / "timing_summary.json" for f in ("a", "b", "c")] + [tmp_path / "missing.html"]
    names = [name for _, name in attachable(paths)]
    assert names == ["timing_summary.json", "b/timing_summary.json", "c/timing_summary.json"]
    same_parent = [tmp_path / "a" / "timing_summary.json"] * 3
    assert [name for _, name in attachable(same_parent)] == [
        "timing_summary.json",
        "a/timing_summary.json",
        "2/timing_summary.json",
    ]


def test_importing_the_package_imports_no_tracker_library() -> None:
    code = (
        "import sys, hf_distprof.trackers\n"
        "loaded = [m for m in ('torch', 'wandb', 'mlflow', 'trackio', 'tensorboard') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
