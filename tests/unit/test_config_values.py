"""The flags' value parsing and descriptions, spelling by spelling (what the flag table and --help are built from)."""

from __future__ import annotations

import argparse

import pytest

from hf_distprof import config
from hf_distprof.core import argtypes
from hf_distprof.core.argtypes import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, RankList


@pytest.mark.parametrize("text", ["yes", "YES", "true", "True", "t", "T", "y", "Y", "1"])
def test_true_spellings(text):
    assert argtypes.str_to_bool(text) is True


@pytest.mark.parametrize("text", ["no", "NO", "false", "False", "f", "F", "n", "N", "0"])
def test_false_spellings(text):
    assert argtypes.str_to_bool(text) is False


def test_bools_pass_through_and_anything_else_is_refused():
    assert argtypes.str_to_bool(True) is True and argtypes.str_to_bool(False) is False
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a boolean \(true/false\), got 'maybe'$"):
        argtypes.str_to_bool("maybe")


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (bool, "true/false"),
        (NonNegativeInt, "integer >= 0"),
        (PositiveInt, "integer >= 1"),
        (RankList, "`all`, `auto` or ranks like `0,3`"),
        (NonNegativeFloat, "number >= 0"),
        (PositiveFloat, "number > 0"),
        (str, "string"),
    ],
)
def test_valid_range_texts(kind, text):
    assert argtypes.valid_values(kind) == text


def test_help_metadata():
    assert config._help("What it does.") == {"help": "What it does."}


def test_plain_argparse_group_and_bool_metavar():
    parser = argparse.ArgumentParser(prog="train.py")
    group = config.add_profiling_args(parser)
    assert group.title == "hf_distprof profiling"
    usage = parser.format_help()
    assert "hf_distprof profiling:\n" in usage
    assert "--enable-profiling [BOOL], --enable_profiling [BOOL]" in usage
    assert parser.parse_args(["--enable-profiling"]).enable_profiling is True
    assert parser.parse_args(["--enable-profiling", "f"]).enable_profiling is False
