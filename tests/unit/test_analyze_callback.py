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
    return ProfilingArguments(enable_profiling=True, profiler_analyze=True, enable_step_timing=False,
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
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["analysis/exposed_comm_pct", "analysis/imbalance_pct"]
    assert acc.Scalars("analysis/imbalance_pct")[0].step == 5
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
