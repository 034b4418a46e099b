"""Every option of every ``hf-distprof`` subcommand with invalid values, table-driven: exit status 2, the flag's
name and its valid range on stderr, no traceback.

The coverage test walks the real parser, so an option added to a subcommand fails it until it has invalid values
in TABLE or is listed in NO_INVALID_VALUE (switches, and paths only read or written later).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from hf_distprof import ProfilingArguments
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.cli.main import build_parser, main

from .test_flags_invalid import FREE_TEXT, cases

DATA = Path(__file__).resolve().parents[1] / "data"
CLEAN = str(DATA / "clean")
# What a subcommand needs before its options so that only the option under test is wrong.
POSITIONALS = {"analyze": [CLEAN], "merge": [CLEAN], "compare": [CLEAN, CLEAN], "hang-report": [CLEAN]}
SCALING_COMMAND = ["--", "python", "train.py", "--nproc", "{nproc}", "--out", "{output_dir}"]
RUN_COMMAND = ["--", "python", "train.py"]

PERCENT = ("comm_bound_pct", "low_util_pct", "data_loading_pct", "launch_bound_tiny_pct", "fsdp_exposed_pct")


def analysis_rows() -> list[tuple[str, str, str, str]]:
    """``analyze``'s threshold options, from :class:`AnalysisOptions` (their flags are generated from it too)."""
    rows = []
    for f in dataclasses.fields(AnalysisOptions):
        if f.name == "progress":
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "message_sizes":
            rows.append(("analyze", flag, "bogus", "invalid choice: 'bogus' (choose from 'auto', 'shapes')"))
            continue
        number = "an integer" if isinstance(f.default, int) else "a number"
        if f.name == "profiler_slowdown_threshold":  # a ratio: > 0 (-1 was said as ">= 0", 0 as "> 0")
            rows += [("analyze", flag, v, f"{flag} must be > 0, got {w}") for v, w in (("-1", "-1.0"), ("0", "0.0"))]
            rows += [("analyze", flag, "x", f"argument {flag}: must be a number > 0, got 'x'")]
            rows += [("analyze", flag, v, f"{flag} must be a finite number > 0, got {v}") for v in ("nan", "inf")]
            continue
        rows += [
            ("analyze", flag, "-1", f"{flag} must be >= 0, got -1"),
            ("analyze", flag, "x", f"argument {flag}: must be {number} >= 0, got 'x'"),
        ]
        if isinstance(f.default, int):
            rows.append(("analyze", flag, "1.5", f"argument {flag}: must be an integer >= 0, got '1.5'"))
        else:
            rows += [("analyze", flag, v, f"{flag} must be a finite number >= 0, got {v}") for v in ("nan", "inf")]
        if f.name in PERCENT:
            rows.append(("analyze", flag, "101", f"{flag} is a percentage in [0, 100], got 101.0"))
    return rows


# (subcommand, flag, invalid value, words stderr must hold)
TABLE: list[tuple[str, str, str, str]] = [
    *analysis_rows(),
    ("analyze", "--bandwidth-ref", "/nonexistent/bench.csv", "--bandwidth-ref: [Errno 2] No such file or directory"),
    ("analyze", "--log-to", "comet", "argument --log-to: invalid choice: 'comet' (choose from 'tensorboard', 'wandb', "
                                     "'mlflow', 'trackio')"),
    ("merge", "--workers", "-1", "--workers must be >= 0, got -1"),
    ("merge", "--workers", "two", "argument --workers: must be an integer >= 0, got 'two'"),
    ("merge", "--align", "gps", "argument --align: invalid choice: 'gps' (choose from 'collectives', 'clock', 'none')"),
    ("doctor", "--timeout", "0", "argument --timeout: must be a number > 0, got '0'"),
    ("doctor", "--timeout", "nan", "argument --timeout: must be a number > 0, got 'nan'"),
    ("doctor", "--timeout", "inf", "argument --timeout: must be a number > 0, got 'inf'"),
    ("doctor", "--timeout", "soon", "argument --timeout: must be a number > 0, got 'soon'"),
    ("doctor", "--expect-world-size", "0", "argument --expect-world-size: must be an integer > 0, got '0'"),
    ("doctor", "--expect-world-size", "2.5", "argument --expect-world-size: must be an integer > 0, got '2.5'"),
    ("doctor", "--min-free-gb", "-1", "argument --min-free-gb: must be a number >= 0, got '-1'"),
    ("doctor", "--min-free-gb", "nan", "argument --min-free-gb: must be a number >= 0, got 'nan'"),
    ("doctor", "--max-skew-ms", "0", "argument --max-skew-ms: must be a number > 0, got '0'"),
    ("doctor", "--max-skew-ms", "inf", "argument --max-skew-ms: must be a number > 0, got 'inf'"),
    ("doctor", "--backend", "mpi", "argument --backend: invalid choice: 'mpi' (choose from 'gloo', 'nccl')"),
    ("bench-collectives", "--ops", "all_to_nowhere", "argument --ops: all_to_nowhere is not an op; choose from "),
    ("bench-collectives", "--ops", "", "argument --ops: names no op; choose from all_reduce,"),
    ("bench-collectives", "--ops", "x,y", "argument --ops: x, y are not ops; choose from all_reduce,"),
    ("bench-collectives", "--sizes", "huge", "argument --sizes: 'huge' is not a size (a list like 1K,1M,16M"),
    ("bench-collectives", "--sizes", "-1K", "argument --sizes: '-1K' is not a size (a list like 1K,1M,16M"),
    ("bench-collectives", "--dtype", "int8", "argument --dtype: invalid choice: 'int8'"),
    ("bench-collectives", "--warmup", "-1", "argument --warmup: must be an integer from 0 to 10000, got '-1'"),
    ("bench-collectives", "--iters", "0", "argument --iters: must be an integer from 1 to 100000, got '0'"),
    ("bench-collectives", "--iters", "many", "argument --iters: must be an integer from 1 to 100000, got 'many'"),
    ("compare", "--warmup-steps", "-1", "argument --warmup-steps: must be an integer >= 0, got '-1'"),
    ("compare", "--warmup-steps", "x", "argument --warmup-steps: must be an integer >= 0, got 'x'"),
    ("compare", "--min-effect-pct", "0", "argument --min-effect-pct: must be a number > 0, got '0'"),
    ("compare", "--min-effect-pct", "nan", "argument --min-effect-pct: must be a finite number > 0, got 'nan'"),
    ("scaling", "--nprocs", "0", "argument --nprocs: must be distinct integers >= 1 separated by commas, got '0'"),
    ("scaling", "--nprocs", "2,2", "argument --nprocs: must be distinct integers >= 1 separated by commas"),
    ("scaling", "--nprocs", "1,x", "argument --nprocs: must be comma-separated integers >= 1, got '1,x'"),
    ("scaling", "--steps", "0", "argument --steps: must be an integer >= 2 (the first step is the warm-up"),
    ("scaling", "--steps", "nan", "argument --steps: must be an integer >= 2 (the first step is the warm-up"),
    ("scaling", "--mode", "medium", "argument --mode: invalid choice: 'medium' (choose from 'weak', 'strong')"),
    ("scaling", "--batch-size", "0", "argument --batch-size: must be an integer >= 1, got '0'"),
    ("scaling", "--timeout", "-5", "argument --timeout: must be an integer >= 1, got '-5'"),
    # A tracker's run and project (any name) without --log-to: it was ignored, the answer sent nowhere.
    *[("analyze", flag, "abc", f"{flag} says where --log-to sends the answer: it needs --log-to TRACKER")
      for flag in ("--log-to-run", "--log-to-project")],
    # hf-distprof run takes the profiling flags: the same invalid values as the training script's parser.
    *[("run", flag, value, words) for _, flag, value, words in cases(ProfilingArguments)],
]
# Options no value of which is invalid on the command line: switches, and paths (a path that cannot be read or
# written is a file error when it is used, tested with each subcommand).
NO_INVALID_VALUE = {
    ("flags", "--update"), ("flags", "--commands"),
    ("analyze", "--json"), ("analyze", "--findings"), ("analyze", "--report"), ("analyze", "--no-compact"),
    ("analyze", "--write-compact"), ("analyze", "--progress"),
    ("merge", "--output"),
    ("doctor", "--json"),
    ("bench-collectives", "--output-dir"), ("bench-collectives", "--progress"),
    ("compare", "--json"), ("compare", "--report"), ("compare", "--significant-only"), ("compare", "--traces"),
    ("scaling", "--output-dir"), ("scaling", "--overwrite"), ("scaling", "--reuse"),
    *[("run", "--" + name.replace("_", "-")) for name in FREE_TEXT if name in ProfilingArguments.__dataclass_fields__],
}


def options() -> set[tuple[str, str]]:
    """(subcommand, long flag) of every option of every subcommand, from the real parser."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = set()
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                out.add((name, max(action.option_strings, key=len) if not isinstance(
                    action, argparse.BooleanOptionalAction) else action.option_strings[0]))
    return out


def test_every_option_of_every_subcommand_has_invalid_values_or_takes_any():
    covered = {(sub, flag) for sub, flag, _, _ in TABLE}
    assert options() - covered - NO_INVALID_VALUE == set()
    assert (covered | NO_INVALID_VALUE) - options() == set()  # no stale row
    assert covered & NO_INVALID_VALUE == set()


@pytest.mark.parametrize(("sub", "flag", "value", "words"), TABLE,
                         ids=[f"{r[0]}{r[1]}={r[2] or 'EMPTY'}" for r in TABLE])
def test_an_invalid_option_exits_2_naming_the_flag_and_the_valid_range(sub, flag, value, words, capsys):
    argv = [sub, *POSITIONALS.get(sub, []), f"{flag}={value}"]
    if sub == "scaling":
        argv += SCALING_COMMAND
    if sub == "run":
        argv += RUN_COMMAND
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    captured = capsys.readouterr()
    assert status == 2, captured.err
    assert flag in captured.err and words in captured.err, captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_scalings_default_script_is_inside_the_package():
    # A wheel install has the package and nothing beside it: the default command must not need python_scripts/.
    import hf_distprof
    from hf_distprof.runs.scaling_launch import DEFAULT_SCRIPT

    assert DEFAULT_SCRIPT.is_file() and Path(hf_distprof.__file__).resolve().parent in DEFAULT_SCRIPT.parents


@pytest.mark.parametrize("argv, usage, extra", [
    (["doctor", "some/run/folder"], "usage: hf-distprof doctor", "some/run/folder"),
    (["analyze", "--bogus", "x"], "usage: hf-distprof analyze", "--bogus"),
    (["--bogus"], "usage: hf-distprof [-h]", "--bogus"),
    (["run", "--bogus"], "usage: hf-distprof run", "--bogus"),
])
def test_an_unknown_argument_is_said_with_its_subcommand_s_usage(argv, usage, extra, capsys):
    # argparse leaves a sub-parser's unrecognised arguments to the top-level parser, whose usage names no flag of the
    # subcommand (a new user ran `hf-distprof doctor RUN_FOLDER` and read the top-level usage).
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage), err
    assert err.rstrip().endswith(f"error: unrecognized arguments: {extra}"), err


def test_scaling_names_an_output_folder_it_cannot_make(tmp_path, capsys):
    # A trial: a file in the way of --output-dir ended in a NotADirectoryError traceback.
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["scaling", "--output-dir", str(afile), "--nprocs", "1", "--", "true", "{nproc}", "{output_dir}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"hf-distprof scaling: error: --output-dir {afile}: Not a directory\n"
