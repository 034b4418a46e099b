"""The step-timing flags: defaults, how --enable-step-timing resolves, validation, build_callbacks."""

from __future__ import annotations

import argparse

import pytest

from hf_distprof import (
    ProfilingArguments,
    RunSummaryCallback,
    StepTimerCallback,
    add_profiling_args,
    build_callbacks,
)
from hf_distprof.config import flags_markdown

from .test_config import hf_parse, plain_parse


PARSERS = pytest.mark.parametrize("parse", [hf_parse, plain_parse], ids=["HfArgumentParser", "argparse"])


@PARSERS
def test_defaults(parse):
    args = parse([])
    assert args.enable_step_timing is False
    assert args.imbalance_threshold_pct == 10.0 and args.memory_imbalance_threshold_pct == 20.0
    assert args.measure_comm_overhead == 0 and args.peak_tflops is None


@PARSERS
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--enable-profiling"], True),  # on by default with profiling
        (["--enable-profiling", "--enable-step-timing", "false"], False),
        (["--enable-step-timing"], True),  # a bare flag means true
        (["--enable_step_timing", "true"], True),
        (["--measure-comm-overhead", "3"], True),  # asking for the measurement turns the timer on
        (["--enable-memory-logging"], False),
    ],
)
def test_enable_step_timing_resolution(parse, argv, expected):
    assert parse(argv).enable_step_timing is expected


@PARSERS
def test_values_parse(parse):
    args = parse(
        [
            "--imbalance-threshold-pct",
            "5.5",
            "--memory_imbalance_threshold_pct",
            "0",
            "--measure-comm-overhead",
            "2",
            "--peak-tflops",
            "312",
        ]
    )
    assert (args.imbalance_threshold_pct, args.memory_imbalance_threshold_pct) == (5.5, 0.0)
    assert args.measure_comm_overhead == 2 and args.peak_tflops == 312.0


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--imbalance-threshold-pct", "-1", "must be a number >= 0"),
        ("--memory-imbalance-threshold-pct", "lots", "must be a number >= 0, got 'lots'"),
        ("--imbalance-threshold-pct", "nan", "must be a finite number >= 0, got 'nan'"),
        ("--measure-comm-overhead", "-3", "must be an integer >= 0"),
        ("--peak-tflops", "0", "must be a number > 0"),
        ("--enable-step-timing", "sometimes", "true/false"),
    ],
)
def test_bad_values_fail_at_parse_time_with_the_flag_name(flag, value, message, capsys):
    parser = argparse.ArgumentParser()
    add_profiling_args(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and message in err


def test_direct_construction_validates_and_rejects_contradictions():
    with pytest.raises(ValueError, match="--peak-tflops: must be a number > 0"):
        ProfilingArguments(peak_tflops=-1)
    with pytest.raises(ValueError, match="--measure-comm-overhead 3 needs step timing"):
        ProfilingArguments(enable_step_timing=False, measure_comm_overhead=3)


def test_build_callbacks_adds_the_timer_only_when_enabled():
    def kinds(args: ProfilingArguments) -> list[type]:
        return [type(cb) for cb in build_callbacks(args)]

    assert kinds(ProfilingArguments(enable_profiling=True)).count(StepTimerCallback) == 1
    assert StepTimerCallback not in kinds(ProfilingArguments(enable_profiling=True, enable_step_timing=False))
    assert kinds(ProfilingArguments(enable_step_timing=True)) == [StepTimerCallback, RunSummaryCallback]
    assert kinds(ProfilingArguments()) == []
    assert ProfilingArguments(enable_step_timing=True).any_enabled


@pytest.mark.parametrize("flags", [{"hang_timeout": 60.0}, {"nsys_window": True}, {"nvtx": True},
                                   {"measure_comm_overhead": 2}])
def test_any_enabled_counts_every_switch_and_step_timing_follows_the_flags_that_need_it(flags):
    args = ProfilingArguments(**flags)
    assert args.any_enabled
    assert args.enable_step_timing is ("hang_timeout" not in flags and "nsys_window" not in flags)


def test_flag_table_rows():
    rows = {line.split("|")[1].strip(): line for line in flags_markdown().splitlines()[2:]}
    assert "`(on with --enable-profiling, --nvtx or --measure-comm-overhead)`" in rows["`--enable-step-timing`"]
    assert "| `10.0` | number >= 0 |" in rows["`--imbalance-threshold-pct`"]
    assert "| `20.0` | number >= 0 |" in rows["`--memory-imbalance-threshold-pct`"]
    assert "| `0` | integer >= 0 |" in rows["`--measure-comm-overhead`"]
    assert "| `(GPU table)` | number > 0 |" in rows["`--peak-tflops`"]
