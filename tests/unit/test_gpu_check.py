"""``benchmarks/gpu_check.py`` without a GPU: its dry run, its refusal on CPU, its flag check, writers and runner."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def test_the_dry_run_lists_every_check_numbered_and_finds_every_command_and_flag(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    numbered = re.findall(r"^\s*(\d+)\. ", proc.stdout, flags=re.MULTILINE)
    assert [int(n) for n in numbered] == list(range(1, len(numbered) + 1)) and len(numbered) >= 8
    assert "0 problem(s)" in proc.stdout and "PROBLEM" not in proc.stderr
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_real_run_exits_2_and_says_cuda(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert "CUDA" in proc.stderr and "--dry-run" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_flag_the_command_does_not_have_fails_the_dry_run_naming_it(gc, tmp_path, capsys):
    bad = gc.Check("analyze with a typo", 10, lambda ctx: [gc.Cmd("analyze", (str(ctx.out), "--no-such-flag"), 5)],
                   lambda *a: None)
    assert gc.main(["--dry-run", "--out", str(tmp_path)], checks=[bad]) == 1  # the real `analyze -h`
    err = capsys.readouterr().err
    assert "check 1 (analyze with a typo): --no-such-flag is not a flag of" in err and "analyze" in err


def test_a_flag_renamed_in_the_training_script_breaks_the_real_plan(gc, tmp_path):
    ctx = gc.Ctx(tmp_path)
    used = {f for c in gc.CHECKS for cmd in c.plan(ctx) for seg in [cmd.args, *([cmd.via[1]] if cmd.via else [])]
            for f in seg if f.startswith("-")}
    # Every tool's help lists every flag the plan uses but --memory-snapshot (as if it had been renamed).
    problems, _ = gc.validate(gc.CHECKS, ctx, help_of=lambda tool: " ".join(sorted(used - {"--memory-snapshot"})))
    train = " ".join(gc.TOOLS["train"].argv)
    assert problems == [f"check 6 (memory snapshot): --memory-snapshot is not a flag of `{train}` (not in its help)"]


def test_a_test_hook_variable_no_script_reads_is_a_problem(gc, tmp_path):
    cmd = gc.Cmd("train", ("--max-steps", "1"), 5, {"HF_DISTPROF_SIMULATE_NOTHING": "1"})
    check = gc.Check("hook", 5, lambda ctx: [cmd], lambda *a: None)
    problems, _ = gc.validate([check], gc.Ctx(tmp_path), help_of=lambda tool: "--max-steps")
    assert problems == ["check 1 (hook): no script of train reads HF_DISTPROF_SIMULATE_NOTHING"]


def test_the_budgets_fit_in_eight_minutes_with_room_for_overruns(gc, tmp_path):
    ctx = gc.Ctx(tmp_path)
    assert len(gc.CHECKS) >= 8 and sum(c.budget_s for c in gc.CHECKS) <= 450
    for check in gc.CHECKS:
        assert sum(cmd.timeout_s for cmd in check.plan(ctx)) <= check.budget_s, check.name


def test_the_writers_give_one_exact_record_per_check(gc, tmp_path):
    results = [gc.Result("environment", True, {"gpu": "NVIDIA H100", "mfu_pct": 0.123456}, 1.5, None),
               gc.Result("fsdp2", False, {"built": "ddp", "units": [1, 2]}, 20.25, "built 'ddp' | not\nfsdp2")]
    gc.write_results(results, tmp_path)
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == [
        {"name": "environment", "passed": True, "numbers": {"gpu": "NVIDIA H100", "mfu_pct": 0.123456},
         "seconds": 1.5, "error": None},
        {"name": "fsdp2", "passed": False, "numbers": {"built": "ddp", "units": [1, 2]}, "seconds": 20.25,
         "error": "built 'ddp' | not\nfsdp2"},
    ]
    assert (tmp_path / "gpu_check.md").read_text() == (
        "# GPU check\n\n1 of 2 checks passed.\n\n"
        "| # | check | passed | seconds | numbers | error |\n|---|---|---|---|---|---|\n"
        "| 1 | environment | yes | 1.5 | gpu: NVIDIA H100; mfu_pct: 0.1235 |  |\n"
        "| 2 | fsdp2 | NO | 20.2 | built: ddp; units: [1, 2] | built 'ddp' \\| not<br>fsdp2 |\n"
    )


def test_a_failing_check_does_not_stop_the_next_ones(gc, tmp_path, monkeypatch):
    monkeypatch.setitem(gc.SNIPPETS, "hello", "print('{\"said\": \"hello\"}')")
    monkeypatch.setitem(gc.SNIPPETS, "stuck", "import time; time.sleep(60)")

    def fails(ctx, cmds, n, sh):
        n["seen"] = 1
        gc.expect(False, "expected 2, got 1")

    def breaks(ctx, cmds, n, sh):
        raise KeyError("per_rank")

    def runs(ctx, cmds, n, sh):
        n.update(gc.last_json(gc.succeeded(sh, cmds[0])))

    def hangs(ctx, cmds, n, sh):
        sh(cmds[0])

    checks = [gc.Check("fails", 1, lambda ctx: [], fails), gc.Check("breaks", 1, lambda ctx: [], breaks),
              gc.Check("stuck", 1, lambda ctx: [gc.Cmd("snippet", ("stuck",), 1)], hangs),
              gc.Check("runs", 10, lambda ctx: [gc.Cmd("snippet", ("hello",), 10)], runs)]
    results = gc.run_checks(checks, gc.Ctx(tmp_path))
    assert [(r.name, r.passed, r.numbers) for r in results] == [
        ("fails", False, {"seen": 1}), ("breaks", False, {}), ("stuck", False, {}), ("runs", True, {"said": "hello"})]
    assert results[0].error == "expected 2, got 1" and results[1].error == "KeyError: 'per_rank'"
    assert results[2].error.startswith("timed out after 1 s") and results[2].seconds < 10
    assert results[3].error is None
    assert [r["name"] for r in json.loads((tmp_path / "gpu_check.json").read_text())] == [c.name for c in checks]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["03_stuck_1.log", "04_runs_1.log"]
