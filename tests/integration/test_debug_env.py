"""The debug flags through train_lambda.sh: both ranks' process groups are created with exactly their variables."""

from __future__ import annotations

import json

import pytest

from hf_distprof.recipe.debug_env import DEBUG_ENV_VARS

from .launch import train_lambda

pytestmark = pytest.mark.integration


def test_both_ranks_create_their_process_group_with_the_debug_variables(tmp_path, monkeypatch):
    for name in DEBUG_ENV_VARS:  # the flags' values, not this shell's
        monkeypatch.delenv(name, raising=False)
    dump = tmp_path / "dump"
    dump.mkdir()
    # FSDP: on gloo, DDP segfaults under DETAIL (the script refuses that combination).
    proc = train_lambda(
        tmp_path, "--nccl-debug", "INFO", "--torch-distributed-debug", "DETAIL", "--flight-recorder-entries", "2000",
        "--max-steps", "2", "--strategy", "fsdp", "--profiler-output-dir", "OUT",
        env={"HF_DISTPROF_DUMP_ENV": str(dump), "SKIP_PREFLIGHT": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    folder = tmp_path / "OUT" / "nccl_debug"
    expected = {
        "env": {
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_FILE": f"{folder}/nccl_%h_%p.log",
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/nccl_trace_rank_",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder}/nccl_trace_rank_",
        },
        "c10d_debug_level": "DETAIL",
        # DETAIL read when the group was created: gloo wrapped in c10d's collective checker.
        "backend": "_ProcessGroupWrapper",
    }
    assert sorted(p.name for p in dump.iterdir()) == ["env_rank0.json", "env_rank1.json"]
    for rank in (0, 1):
        assert json.loads((dump / f"env_rank{rank}.json").read_text()) == expected, rank
    assert folder.is_dir() and list(folder.iterdir()) == []  # gloo: NCCL never writes its log here
    assert proc.stderr.count("configure NCCL, which a run without CUDA does not use") == 1  # rank 0 only
