"""Flags: defaults, both spellings, every validation error, the docs' flag table."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys

import pytest
from transformers import HfArgumentParser

from hf_distprof import (
    ProfilingArguments,
    RunSummaryCallback,
    StepTimerCallback,
    add_profiling_args,
    build_callbacks,
)
from hf_distprof.callbacks.analyze import TraceAnalysisCallback
from hf_distprof.callbacks.memory.logger import MemoryLoggerCallback, SimpleGPUMemoryCallback
from hf_distprof.callbacks.profiler.callback import ProfilerCallback
from hf_distprof.config import flags_markdown, parse_rank_list

from ..conftest import REPO_ROOT

EXPECTED_DEFAULTS = {
    "enable_profiling": False,
    "enable_memory_logging": False,
    "profiler_output_dir": "./profiler_traces",
    "profiler_wait_steps": 5,
    "profiler_warmup_steps": 2,
    "profiler_active_steps": 3,
    "profiler_repeat": 1,
    "memory_log_steps": 10,
    "profile_ranks": "all",
    "profiler_skip_first": 0,
    "profiler_record_shapes": False,
    "profiler_profile_memory": False,
    "profiler_with_stack": False,
    "profiler_with_flops": False,
    "imbalance_threshold_pct": 10.0,
    "straggler_threshold_pct": 10.0,
    "memory_imbalance_threshold_pct": 20.0,
    "memory_growth_threshold_pct": 20.0,
    "profiler_slowdown_threshold": 1.25,
    "memory_snapshot": False,
    "memory_snapshot_max_entries": 100_000,
    "memory_tracker": False,
    "memory_tracker_depth": 2,
    "track_activation_memory": False,
}

BAD_VALUES = [
    ("--profiler-wait-steps", "-1", "must be an integer >= 0"),
    ("--profiler-warmup-steps", "-2", "must be an integer >= 0"),
    ("--profiler-skip-first", "-1", "must be an integer >= 0"),
    ("--profiler-repeat", "-1", "must be an integer >= 0"),
    ("--profiler-active-steps", "0", "must be an integer >= 1"),
    ("--memory-log-steps", "0", "must be an integer >= 1"),
    ("--memory-growth-threshold-pct", "-5", "must be a number >= 0"),
    ("--profiler-slowdown-threshold", "0", "must be a number > 0"),
    ("--memory-snapshot-max-entries", "0", "must be an integer >= 1"),
    ("--memory-tracker-depth", "0", "must be an integer >= 1"),
    ("--memory-tracker", "sometimes", "true/false"),
    ("--profiler-active-steps", "three", "must be an integer"),
    ("--profile-ranks", "0,x", "must be 'all', 'auto' or a comma-separated list of ranks >= 0"),
    ("--profile-ranks", "-1", "must be 'all', 'auto' or a comma-separated list of ranks >= 0"),
    ("--max-trace-mb", "0", "must be a number > 0"),
    ("--enable-profiling", "maybe", "true/false"),
]


def hf_parse(argv: list[str]) -> ProfilingArguments:
    (args,) = HfArgumentParser(ProfilingArguments).parse_args_into_dataclasses(argv)
    return args


def plain_parse(argv: list[str]) -> ProfilingArguments:
    parser = argparse.ArgumentParser()
    add_profiling_args(parser)
    return ProfilingArguments.from_namespace(parser.parse_args(argv))


@pytest.mark.parametrize("parse", [hf_parse, plain_parse], ids=["HfArgumentParser", "argparse"])
def test_defaults_are_exactly_the_documented_ones(parse):
    got = {k: v for k, v in dataclasses.asdict(parse([])).items() if k in EXPECTED_DEFAULTS}
    assert got == EXPECTED_DEFAULTS


@pytest.mark.parametrize("parse", [hf_parse, plain_parse], ids=["HfArgumentParser", "argparse"])
def test_both_spellings_parse_to_the_same_values(parse):
    dashes = parse(["--enable-profiling", "--profiler-wait-steps", "2", "--profile-ranks", "3,0,3",
                    "--profiler-with-stack", "true", "--memory-log-steps", "4"])
    underscores = parse(["--enable_profiling", "--profiler_wait_steps", "2", "--profile_ranks", "3,0,3",
                         "--profiler_with_stack", "true", "--memory_log_steps", "4"])
    assert dashes == underscores
    assert dashes.enable_profiling is True and dashes.profiler_with_stack is True
    assert dashes.profiler_wait_steps == 2 and dashes.memory_log_steps == 4
    assert dashes.profile_ranks == "0,3" and dashes.profile_rank_set == frozenset({0, 3})


@pytest.mark.parametrize("parse", [hf_parse, plain_parse], ids=["HfArgumentParser", "argparse"])
@pytest.mark.parametrize(("flag", "value", "message"), BAD_VALUES)
def test_bad_values_exit_2_naming_the_flag_and_range(parse, flag, value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse([flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert message in err


def test_direct_construction_validates_with_the_flag_name():
    with pytest.raises(ValueError, match=r"--profiler-active-steps: must be an integer >= 1, got 0"):
        ProfilingArguments(profiler_active_steps=0)
    with pytest.raises(ValueError, match=r"--profile-ranks: must be 'all'"):
        ProfilingArguments(profile_ranks="0,x")


def test_rank_list():
    assert parse_rank_list("all") is None
    assert parse_rank_list(" ALL ") is None
    assert parse_rank_list("5,1,1") == frozenset({1, 5})
    assert parse_rank_list(" Auto ") is None  # every rank builds a profiler; each window picks its ranks


def test_disabled_means_no_callbacks():
    assert build_callbacks(ProfilingArguments()) == []


def test_enabled_callbacks_are_built_in_order():
    callbacks = build_callbacks(ProfilingArguments(enable_profiling=True, enable_memory_logging=True))
    # The step timer comes with --enable-profiling (its default follows it).
    # The end-of-run analysis comes with profiling (it works at train end for --profiler-analyze or the trackers
    # report_to names); the end-of-run block comes last, with any of them.
    assert [type(cb) for cb in callbacks] == [ProfilerCallback, MemoryLoggerCallback, StepTimerCallback,
                                              TraceAnalysisCallback, RunSummaryCallback]
    only_memory = build_callbacks(ProfilingArguments(enable_memory_logging=True))
    assert [type(cb) for cb in only_memory] == [MemoryLoggerCallback, RunSummaryCallback]
    assert SimpleGPUMemoryCallback is MemoryLoggerCallback


def _guide_flag_table() -> str:
    text = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- flags:start -->\n(.*?)<!-- flags:end -->", text, re.S)
    assert match, "PROFILING_GUIDE.md has no <!-- flags:start --> ... <!-- flags:end --> table"
    return match.group(1)


# The schedule and memory cadence of the original profiling guide this project was specified from.
ORIGINAL_DEFAULTS = {
    "--profiler-wait-steps": "5",
    "--profiler-warmup-steps": "2",
    "--profiler-active-steps": "3",
    "--profiler-repeat": "1",
    "--memory-log-steps": "10",
    "--profiler-output-dir": "./profiler_traces",
}


def test_the_original_guides_defaults_hold_in_the_dataclass_help_flags_and_guide():
    args = ProfilingArguments()
    assert {flag: str(getattr(args, flag[2:].replace("-", "_"))) for flag in ORIGINAL_DEFAULTS} == ORIGINAL_DEFAULTS
    parser = argparse.ArgumentParser()
    add_profiling_args(parser)
    helped = {a.option_strings[0]: a.help % {"default": a.default} for a in parser._actions if a.option_strings}
    for table in (flags_markdown(), _guide_flag_table()):
        rows = dict(re.findall(r"^\| `(--[a-z-]+)` \| `([^`]*)` \|", table, re.M))
        assert {flag: rows[flag] for flag in ORIGINAL_DEFAULTS} == ORIGINAL_DEFAULTS
    for flag, default in ORIGINAL_DEFAULTS.items():
        assert helped[flag].endswith(f" (default: {default})"), helped[flag]
    guide = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    assert "With the defaults (`skip_first 0, wait 5, warmup 2, active 3, repeat 1`" in guide
    assert "and steps 8-10 are recorded into one trace per rank" in guide


def test_guide_flag_table_matches_the_parser():
    assert _guide_flag_table() == flags_markdown(), (
        "PROFILING_GUIDE.md's flag table is stale: regenerate it with `hf-distprof flags`"
    )


def test_flag_table_lists_every_parser_flag():
    parser = argparse.ArgumentParser()
    add_profiling_args(parser)
    dashed = {o for a in parser._actions for o in a.option_strings if "_" not in o and o != "--help" and o != "-h"}
    documented = set(re.findall(r"^\| `(--[a-z-]+)`", flags_markdown(), re.M))
    assert documented == dashed


def test_cli_flags_and_version():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "flags"], capture_output=True,
                         text=True, env=env, check=True).stdout
    assert out == flags_markdown()
    version = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "--version"], capture_output=True,
                             text=True, env=env, check=True).stdout
    assert version.strip() == "hf-distprof 0.1.0"


def test_training_script_rejects_a_bad_flag_before_any_work():
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_DISTPROF_PARSE_ONLY": "1"}
    script = REPO_ROOT / "python_scripts" / "train_modernBERT.py"
    bad = subprocess.run([sys.executable, str(script), "--profiler-active-steps", "0"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2
    assert "--profiler-active-steps: must be an integer >= 1, got '0'" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = subprocess.run([sys.executable, str(script), "--enable-profiling"], capture_output=True, text=True,
                          env=env)
    assert good.returncode == 0, good.stderr
