"""Every flag's invalid values, table-driven from the flag dataclasses: exit 2, the flag's name, its valid range.

The table is derived from each field's type, so a new flag is covered the day it is added; a field whose type
has no invalid value (free text) must be listed in FREE_TEXT, or the coverage test fails.
"""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_distprof import ProfilingArguments
from hf_distprof.core.argtypes import (
    AboveOneFloat,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    RankList,
    RunName,
)
from hf_distprof.recipe.debug_env import DebugArguments
from hf_distprof.recipe.strategy import StrategyArguments

from . import training_script

# type -> (invalid values, words the error must hold)
INVALID: dict[object, tuple[tuple[str, ...], str]] = {
    NonNegativeInt: (("-1", "1.5", "many", ""), "must be an integer >= 0"),
    PositiveInt: (("0", "-3", "2.5", "x"), "must be an integer >= 1"),
    NonNegativeFloat: (("-0.5", "nan", "inf", "abc"), "number >= 0"),  # ("a finite number" for nan and inf)
    PositiveFloat: (("0", "-1", "nan", "fast"), "number > 0"),
    AboveOneFloat: (("1", "0.5", "-inf", "x"), "number > 1"),
    RankList: (("x", "-1", "0,,1", "1;2"), "must be 'all', 'auto' or a comma-separated list"),
    # (A path made the run folder somewhere else, or none: profiling silently lost.)
    RunName: (("a/b", "../escape", "/tmp/abs", ".."), "must be a folder name without '/'"),
    bool: (("maybe", "2", "yes please"), "true/false"),
}
# Fields whose values are free text (any string is valid) or a Literal's choices.
FREE_TEXT = {"profiler_output_dir", "nccl_debug_subsys"}


def flag(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def base_type(tp: object) -> object:
    """``X | None`` -> ``X``."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if len(args) == 1 else tp


def cases(cls: type) -> list[tuple[type, str, str, str]]:
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        kind = base_type(hints[field.name])
        if typing.get_origin(kind) is typing.Literal:
            out.append((cls, flag(field), "NOT-A-CHOICE", "invalid choice"))
            continue
        if kind in INVALID:
            values, words = INVALID[kind]
            out += [(cls, flag(field), value, words) for value in values]
    return out


CLASSES = (ProfilingArguments, DebugArguments, StrategyArguments)
CASES = [c for cls in CLASSES for c in cases(cls)]


def test_every_flag_has_invalid_values_or_is_free_text():
    covered = {c[1] for c in CASES}
    for cls in CLASSES:
        for field in dataclasses.fields(cls):
            assert flag(field) in covered or field.name in FREE_TEXT, f"{cls.__name__}.{field.name}: no invalid value"
    assert len(CASES) > 100


@pytest.mark.parametrize(("cls", "name", "value", "words"), CASES,
                         ids=[f"{c[1]}={c[2] or 'EMPTY'}" for c in CASES])
def test_an_invalid_value_exits_2_naming_the_flag_and_the_valid_range(cls, name, value, words, capsys):
    parser = HfArgumentParser(cls)
    with pytest.raises(SystemExit) as info:
        parser.parse_args_into_dataclasses([f"{name}={value}"] if value.startswith("-") else [name, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert name in err and words in err, err
    assert "Traceback" not in err


# The training script's own flags (python_scripts/train_modernBERT.py), through its real parse path: the same
# type-derived values, plus the cross-value checks of its __post_init__.
SCRIPT_FREE_TEXT = {"model_name_or_path", "dataset_name", "dataset_config_name", "train_file", "text_column"}
SCRIPT_EXTRA = [
    *[("--mlm-probability", v, f"--mlm-probability: must be a number in (0, 1), got '{v}'")
      for v in ("0", "1", "-0.1", "nan", "half")],
    ("--tiny-hidden-size", "12", "--tiny-hidden-size: must be a multiple of 8 (4 attention heads of an even width"),
]


def script_cases() -> list[tuple[str, str, str]]:
    cls = training_script.load().ModelDataArguments
    return [(name, value, words) for _, name, value, words in cases(cls)] + SCRIPT_EXTRA


def test_every_flag_of_the_training_script_has_invalid_values_or_is_free_text():
    script = training_script.load()
    covered = {c[0] for c in script_cases()}
    for field in dataclasses.fields(script.ModelDataArguments):
        assert flag(field) in covered or field.name in SCRIPT_FREE_TEXT, f"ModelDataArguments.{field.name}"
    # Every other dataclass the script parses is covered above, or is the Trainer's own (TrainingArguments).
    parsed = set(script.build_parser().dataclass_types)
    assert parsed - {script.ModelDataArguments, *CLASSES} == {TrainingArguments}


@pytest.mark.parametrize(("name", "value", "words"), script_cases(), ids=[f"{c[0]}={c[1]}" for c in script_cases()])
def test_the_training_script_refuses_an_invalid_value_with_status_2_naming_the_flag(name, value, words):
    status, err = training_script.parse(f"{name}={value}")
    assert status == 2, err
    assert name in err and words in err, err
    assert "Traceback" not in err



# Flags that contradict each other, in a user's own script as the README wires it (HfArgumentParser, or argparse with
# add_profiling_args): exit 2 and the message, as for one bad value (a trial: a traceback and exit 1, on every rank).
CONFLICTS = [
    (["--profile-on-demand"], "--profile-on-demand opens profiler windows: it needs --enable-profiling"),
    (["--profiler-analyze"], "--profiler-analyze analyses the run's traces: it needs --enable-profiling"),
    (["--max-trace-mb", "5"], "--max-trace-mb limits the profiler's traces: it needs --enable-profiling"),
    (["--hang-abort"], "--hang-abort ends a rank the watchdog finds hung: it needs --hang-timeout SECONDS"),
]


@pytest.mark.parametrize(("argv", "words"), CONFLICTS, ids=[c[0][0] for c in CONFLICTS])
def test_flags_that_contradict_each_other_end_a_plain_script_with_status_2(argv, words, capsys):
    import argparse

    from hf_distprof import add_profiling_args

    parser = HfArgumentParser((ProfilingArguments, TrainingArguments))
    with pytest.raises(SystemExit) as ended:
        parser.parse_args_into_dataclasses(args=[*argv, "--output_dir", "out"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and f"error: {words}" in err and err.startswith("usage:"), err
    plain = argparse.ArgumentParser(prog="train.py")
    add_profiling_args(plain)
    for with_parser in (plain, None):
        with pytest.raises(SystemExit) as ended:
            ProfilingArguments.from_namespace(plain.parse_args(argv), with_parser)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and f"error: {words}" in err and "Traceback" not in err, err
    # A parser asked not to exit, and a dict parsed in code: the exception to catch, as in code.
    with pytest.raises(ValueError, match="needs"):
        HfArgumentParser((ProfilingArguments, TrainingArguments), exit_on_error=False).parse_args_into_dataclasses(
            args=[*argv, "--output_dir", "out"])
    with pytest.raises(ValueError, match="needs"):
        HfArgumentParser(ProfilingArguments).parse_dict(
            {a.lstrip("-").replace("-", "_"): True for a in argv if a.startswith("--")}
            | ({"max_trace_mb": 5.0} if "--max-trace-mb" in argv else {}))
    # Built in code, the same is an exception to catch.
    with pytest.raises(ValueError, match="needs"):
        ProfilingArguments(**{a.lstrip("-").replace("-", "_"): True for a in argv if a.startswith("--")}
                           | ({"max_trace_mb": 5.0} if "--max-trace-mb" in argv else {}))


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_folder_is_refused_with_status_2(value, capsys):
    # Free text, but not empty: a trial's "--profiler-output-dir ''" silently meant the current folder.
    parser = HfArgumentParser((ProfilingArguments, TrainingArguments))
    with pytest.raises(SystemExit) as ended:
        parser.parse_args_into_dataclasses(args=["--profiler-output-dir", value, "--output_dir", "out"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "error: --profiler-output-dir: an empty folder path; give a folder" in err, err
    with pytest.raises(ValueError, match="an empty folder path"):
        ProfilingArguments(profiler_output_dir=value)


def test_an_integer_beyond_what_c_code_takes_is_a_flag_error():
    # The review: a 400-digit --memory-snapshot-max-entries was accepted and would overflow at train start.
    parser = HfArgumentParser(ProfilingArguments)
    with pytest.raises(SystemExit) as info:
        parser.parse_args_into_dataclasses(["--memory-snapshot-max-entries", "1" + "0" * 400])
    assert info.value.code == 2
