"""--nccl-debug, --torch-distributed-debug, --flight-recorder-entries: the variables they stand for, the user's
own values winning, and bad values failing with the flag's name."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed
from transformers import HfArgumentParser

from hf_distprof.recipe.debug_env import (
    DEBUG_ENV_VARS,
    DebugArguments,
    apply_debug_env,
    debug_env_vars,
    debug_flags_markdown,
)

from ..conftest import REPO_ROOT
from . import training_script

SCRIPT = REPO_ROOT / "python_scripts" / "train_modernBERT.py"


@pytest.fixture
def levels_set(monkeypatch) -> list[torch.distributed.DebugLevel]:
    """c10d debug levels set by apply_debug_env (the real setter would change this test process's c10d)."""
    seen: list[torch.distributed.DebugLevel] = []
    monkeypatch.setattr(torch.distributed, "set_debug_level", seen.append)
    return seen


def test_no_flag_no_variable(tmp_path):
    assert debug_env_vars(DebugArguments(), tmp_path) == {}


def test_every_flag_maps_to_its_variables_in_order(tmp_path):
    args = DebugArguments(nccl_debug="INFO", nccl_debug_subsys="init, coll", torch_distributed_debug="DETAIL",
                          flight_recorder_entries=2000)
    env = debug_env_vars(args, tmp_path, "run7")
    folder = tmp_path / "nccl_debug" / "run7"
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,COLL",
        "NCCL_DEBUG_FILE": f"{folder}/nccl_%h_%p.log",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/nccl_trace_rank_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/nccl_trace_rank_",
    }
    assert list(env) == list(DEBUG_ENV_VARS)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (DebugArguments(nccl_debug="WARN"), {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "{dir}/nccl_%h_%p.log"}),
        (DebugArguments(torch_distributed_debug="OFF"), {"TORCH_DISTRIBUTED_DEBUG": "OFF"}),
        (
            DebugArguments(flight_recorder_entries=1),
            {"TORCH_FR_BUFFER_SIZE": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
             "TORCH_FR_DUMP_TEMP_FILE": "{dir}/nccl_trace_rank_",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "{dir}/nccl_trace_rank_"},
        ),
    ],
    ids=["nccl-debug", "torch-distributed-debug", "flight-recorder"],
)
def test_one_flag_sets_only_its_own_variables(tmp_path, monkeypatch, args, expected):
    # Without a run name every run shares <output_dir>/nccl_debug/; a relative output folder is made absolute.
    monkeypatch.chdir(tmp_path)
    got = debug_env_vars(args, "out")
    assert got == {k: v.format(dir=tmp_path / "out" / "nccl_debug") for k, v in expected.items()}


def test_apply_sets_creates_the_folder_and_tells_c10d(tmp_path, levels_set):
    environ: dict[str, str] = {"PATH": "/bin"}
    args = DebugArguments(nccl_debug="INFO", torch_distributed_debug="DETAIL")
    applied = apply_debug_env(args, tmp_path, "run", environ=environ)
    assert applied == debug_env_vars(args, tmp_path, "run")
    assert environ == {"PATH": "/bin", **applied}
    assert (tmp_path / "nccl_debug" / "run").is_dir()
    assert levels_set == [torch.distributed.DebugLevel.DETAIL]


def test_the_users_own_value_wins_and_rank_0_says_so(tmp_path, levels_set, caplog):
    environ = {"NCCL_DEBUG": "WARN", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    args = DebugArguments(nccl_debug="INFO", torch_distributed_debug="DETAIL")
    with caplog.at_level(logging.WARNING, logger="hf_distprof.recipe.debug_env"):
        applied = apply_debug_env(args, tmp_path, environ=environ)
    assert applied == {"NCCL_DEBUG_FILE": f"{tmp_path}/nccl_debug/nccl_%h_%p.log"}
    assert environ["NCCL_DEBUG"] == "WARN"
    # The same value is no conflict; c10d keeps what it read from the user's variable at import.
    assert [r.getMessage() for r in caplog.records if "wins" in r.getMessage()] == [
        "[RANK 0] NCCL_DEBUG=WARN from the environment wins over --nccl-debug (INFO)"
    ]
    assert levels_set == []


def test_only_flags_that_write_files_create_the_folder(tmp_path, levels_set):
    apply_debug_env(DebugArguments(torch_distributed_debug="INFO"), tmp_path, environ={})
    assert not (tmp_path / "nccl_debug").exists()
    assert levels_set == [torch.distributed.DebugLevel.INFO]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nccl_debug": "info"}, "--nccl-debug must be one of WARN, INFO, TRACE, got 'info'"),
        ({"torch_distributed_debug": "ALL"}, "--torch-distributed-debug must be one of OFF, INFO, DETAIL, got 'ALL'"),
        ({"flight_recorder_entries": 0}, "--flight-recorder-entries must be an integer >= 1, got 0"),
        ({"nccl_debug_subsys": "INIT"}, "--nccl-debug-subsys filters NCCL's log: it needs --nccl-debug INFO or TRACE"),
        ({"nccl_debug": "INFO", "nccl_debug_subsys": "INIT,COLLS"}, "--nccl-debug-subsys: 'COLLS' is not an NCCL"),
        ({"nccl_debug": "INFO", "nccl_debug_subsys": " , "}, "--nccl-debug-subsys: names no subsystem; valid: INIT,"),
    ],
)
def test_bad_values_raise_naming_the_flag(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DebugArguments(**kwargs)


def test_an_exclusion_list_is_kept():
    assert DebugArguments(nccl_debug="TRACE", nccl_debug_subsys="^net,proxy").nccl_debug_subsys == "^NET,PROXY"


@pytest.mark.parametrize(
    ("argv", "message", "valid"),
    [
        (["--nccl-debug", "info"], "--nccl-debug: invalid choice: 'info' (choose from ", ["WARN", "INFO", "TRACE"]),
        (["--torch-distributed-debug", "FULL"], "--torch-distributed-debug: invalid choice: 'FULL' (choose from ",
         ["OFF", "INFO", "DETAIL"]),
        (["--flight-recorder-entries", "0"], "--flight-recorder-entries: must be an integer >= 1, got '0'", []),
    ],
)
def test_the_parser_exits_2_naming_the_flag_and_the_choices(argv, message, valid, capsys):
    with pytest.raises(SystemExit) as exc:
        HfArgumentParser(DebugArguments).parse_args_into_dataclasses(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert all(v in err.split("choose from ", 1)[-1] for v in valid)  # however this Python's argparse quotes them


def _parse_only(cwd, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_DISTPROF_PARSE_ONLY": "1", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nccl-debug", "DEBUG"), "--nccl-debug: invalid choice: 'DEBUG' (choose from "),
        (("--nccl-debug-subsys", "INIT"), "--nccl-debug-subsys filters NCCL's log: it needs --nccl-debug"),
        (("--torch-distributed-debug", "DETAIL"), "--torch-distributed-debug DETAIL crashes DDP on gloo"),
    ],
)
def test_the_training_script_exits_2_before_anything_runs(tmp_path, args, message):
    if torch.cuda.is_available() and "DETAIL" in args:
        pytest.skip("a CPU-machine message: DDP on NCCL builds no gloo logger")
    status, err = training_script.parse(*args)
    assert status == 2, err[-2000:]
    assert message in err and "Traceback" not in err


def test_the_launchers_flag_check_sets_nothing_and_creates_nothing(tmp_path):
    proc = _parse_only(tmp_path, "--nccl-debug", "INFO", "--flight-recorder-entries", "10")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_the_guide_snippet_table_is_the_generated_one():
    text = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- debug-flags:start -->\n(.*?)<!-- debug-flags:end -->", text, re.S)
    assert match, "PROFILING_GUIDE.md has no <!-- debug-flags:start --> ... <!-- debug-flags:end --> table"
    assert match.group(1) == debug_flags_markdown()
