"""--profiler-analyze: the run's own traces analysed at train end, never failing the job."""

from __future__ import annotations

import json
import logging

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hf_distprof import ProfilingArguments, RunSummaryCallback, build_callbacks, tensorboard
from hf_distprof.callbacks.analyze import TraceAnalysisCallback
from hf_distprof.callbacks.profiler.callback import ProfilerCallback

from . import fake_trainer


def args_for(tmp_path, **kw) -> ProfilingArguments:
    kw.setdefault("profiler_analyze", True)
    return ProfilingArguments(enable_profiling=True, enable_step_timing=False,
                              profiler_output_dir=str(tmp_path / "prof"), profiler_wait_steps=1,
                              profiler_warmup_steps=1, profiler_active_steps=2, **kw)


def test_needs_enable_profiling():
    with pytest.raises(ValueError, match="--profiler-analyze .* needs --enable-profiling"):
        ProfilingArguments(profiler_analyze=True)


def test_is_built_last():
    callbacks = build_callbacks(ProfilingArguments(enable_profiling=True, enable_memory_logging=True,
                                                   profiler_analyze=True))
    assert isinstance(callbacks[0], ProfilerCallback)
    # After every callback that writes files; only the end-of-run block comes after it.
    assert [type(cb) for cb in callbacks[-2:]] == [TraceAnalysisCallback, RunSummaryCallback]


def test_analyses_the_run_and_logs_headline_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    callbacks = build_callbacks(args_for(tmp_path))
    fake_trainer.run(callbacks, 5, tmp_path)
    tensorboard.close_writers()
    analysis = callbacks[-2]
    assert analysis.run_dir is not None
    saved = json.loads((analysis.run_dir / "analysis.json").read_text())
    assert [r["rank"] for r in saved["ranks"]] == [0]
    assert [s["step"] for s in saved["ranks"][0]["steps"]] == [3, 4]
    out = capsys.readouterr().out
    assert f"hf_distprof trace analysis of {analysis.run_dir} (1 trace(s))" in out and "Headline:" in out
    run = analysis.run_dir
    assert f"Full per-step tables and plots: hf-distprof analyze {run} --report {run / 'report'}\n" in out
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    # One rank: no load imbalance to state (no peer), so no scalar for it.
    assert sorted(acc.Tags()["scalars"]) == ["analysis/exposed_comm_pct"] and analysis.result.imbalance_pct is None
    assert acc.Scalars("analysis/exposed_comm_pct")[0].step == 5
    assert acc.Scalars("analysis/exposed_comm_pct")[0].value == pytest.approx(analysis.result.exposed_comm_pct)


def test_a_failing_analysis_is_one_warning(tmp_path, monkeypatch, caplog):
    import hf_distprof.analysis as analysis_pkg

    def boom(*a, **k):
        raise RuntimeError("analyzer exploded")

    monkeypatch.setattr(analysis_pkg, "analyze_paths", boom)
    callbacks = build_callbacks(args_for(tmp_path))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run(callbacks, 5, tmp_path)  # must not raise
    hits = [r.getMessage() for r in caplog.records if "--profiler-analyze" in r.getMessage()]
    assert len(hits) == 1 and "analyzer exploded" in hits[0]
    assert not (callbacks[-2].run_dir / "analysis.json").exists()


def test_the_training_flags_set_the_analysis_thresholds():
    from hf_distprof.callbacks.analyze import analysis_options

    options = analysis_options(ProfilingArguments(
        enable_profiling=True, imbalance_threshold_pct=15, memory_imbalance_threshold_pct=30,
        profiler_slowdown_threshold=1.5, straggler_threshold_pct=25,
    ))
    assert (options.imbalance_pct, options.memory_imbalance_pct, options.profiler_slowdown_threshold) == (15, 30, 1.5)
    assert options.straggler_pct == 25
    # In the training process: no process pool (spawned workers would re-import the training script).
    assert options.workers == 1


def _reporting(monkeypatch, tmp_path, report_to):
    from transformers import TrainingArguments

    monkeypatch.setattr(fake_trainer, "training_args", lambda path: TrainingArguments(
        output_dir=str(path / "trainer_out"), use_cpu=True, report_to=report_to))


def test_without_the_flag_the_trackers_get_the_answer_and_the_console_stays_quiet(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    _reporting(monkeypatch, tmp_path, ["tensorboard"])
    callbacks = build_callbacks(args_for(tmp_path, profiler_analyze=False))
    fake_trainer.run(callbacks, 5, tmp_path)
    tensorboard.close_writers()
    analysis = callbacks[-2]
    assert isinstance(analysis, TraceAnalysisCallback) and analysis.sent == {"tensorboard": "sent"}
    out = capsys.readouterr().out
    assert "hf_distprof trace analysis of" not in out  # the findings print with --profiler-analyze only
    assert "hf_distprof: the analysis went to tensorboard" in out
    # Its verdict, on the console too (trial V: a finding the console never hinted at).
    from hf_distprof.analysis.tell.box import verdict

    (line,) = [x for x in out.splitlines() if "the analysis went to" in x]
    assert line.endswith(f"s); verdict: {verdict(analysis.result)} (hf-distprof analyze {analysis.run_dir} "
                         "--findings)") and verdict(analysis.result)
    assert (analysis.run_dir / "analysis.json").exists() and (analysis.run_dir / "report" / "report.html").exists()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    assert "hf_distprof/answer" in acc.Tags()["tensors"]


def test_with_a_tracker_the_printed_analysis_points_at_the_report_already_written(tmp_path, monkeypatch, capsys):
    # A trial: "Full per-step tables and plots: hf-distprof analyze RUN --report RUN/report" above the closing block's
    # "report: RUN/report/report.html   # open it in a browser: the report, with plots (already written)".
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    _reporting(monkeypatch, tmp_path, ["tensorboard"])
    callbacks = build_callbacks(args_for(tmp_path))
    fake_trainer.run(callbacks, 5, tmp_path)
    tensorboard.close_writers()
    run = callbacks[-2].run_dir
    out = capsys.readouterr().out
    assert (f"Full per-step tables and plots: {run / 'report' / 'report.html'} (written: open it in a browser), or "
            f"hf-distprof analyze {run}\n") in out


def test_nothing_to_report_to_means_no_analysis_and_no_barrier(tmp_path, monkeypatch):
    from hf_distprof import dist

    barriers = []
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(1))
    callbacks = build_callbacks(args_for(tmp_path, profiler_analyze=False))
    fake_trainer.run(callbacks, 5, tmp_path)
    assert barriers == [] and not (callbacks[-2].run_dir / "analysis.json").exists()


def test_an_analysis_over_the_budget_is_left_to_the_command_with_one_warning(tmp_path, monkeypatch, caplog):
    import threading

    import hf_distprof.analysis as analysis_pkg
    from hf_distprof.callbacks import analyze as analyze_module

    release = threading.Event()
    monkeypatch.setattr(analysis_pkg, "analyze_paths", lambda *a, **k: release.wait(10))
    monkeypatch.setattr(analyze_module, "TRACKER_BUDGET_S", 0.2)
    _reporting(monkeypatch, tmp_path, ["tensorboard"])
    callbacks = build_callbacks(args_for(tmp_path, profiler_analyze=False))
    with caplog.at_level(logging.WARNING):
        fake_trainer.run(callbacks, 5, tmp_path)  # returns after the budget, not after the analysis
    release.set()
    hits = [r.getMessage() for r in caplog.records if "took over 0.2 s" in r.getMessage()]
    assert len(hits) == 1 and "--log-to TRACKER" in hits[0] and callbacks[-2].sent == {}


def test_a_tracker_that_is_not_installed_costs_one_warning_and_the_run_ends(tmp_path, monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails
    from hf_distprof import trackers

    trackers.forget_warnings()
    _reporting(monkeypatch, tmp_path, ["tensorboard"])  # the Trainer's own W&B callback needs wandb: we send alone
    callbacks = build_callbacks(args_for(tmp_path, profiler_analyze=False))
    analysis = callbacks[-2]
    real_end = analysis.on_train_end

    def end(args, state, control, **kw):
        args.report_to = ["tensorboard", "wandb"]
        real_end(args, state, control, **kw)

    analysis.on_train_end = end
    with caplog.at_level(logging.WARNING):
        fake_trainer.run(callbacks, 5, tmp_path)
    tensorboard.close_writers()
    assert analysis.sent["tensorboard"] == "sent"
    assert analysis.sent["wandb"].startswith("skipped: wandb is not installed")
    assert len([r for r in caplog.records if "wandb" in r.getMessage().lower()]) == 1
