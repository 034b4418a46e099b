"""``hf-distprof doctor`` for real: 2 gloo ranks under torchrun, healthy, with a wrong all_reduce, with a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof.doctor import CHECKS, INJECT_ENV

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def _doctor(*args: str, inject: str | None = None, torchrun: bool = True) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node 2 hf-distprof doctor args...`` (or the console script alone)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop(INJECT_ENV, None)
    if inject:
        env[INJECT_ENV] = inject
    launcher = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())] if torchrun else []
    # The timeout only stops a doctor that hangs, which is the failure these tests exist to catch.
    return subprocess.run([*launcher, str(BIN / "hf-distprof"), "doctor", *args], env=env, capture_output=True,
                          text=True, timeout=90)


def _headlines(stdout: str) -> dict[str, list[str]]:
    """Each check's headline(s), by check name."""
    lines = [line.split(maxsplit=2) for line in stdout.splitlines() if line[:1] in "✓✗-" and " " in line]
    return {name: [" ".join(parts) for parts in lines if parts[1] == name] for name in CHECKS}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("doctor") / "doctor.json"
    return _doctor("--json", str(out)), out


def test_a_healthy_group_passes_every_check_printed_once_by_rank_0(healthy):
    proc, _ = healthy
    assert proc.returncode == 0, proc.stdout + proc.stderr
    headlines = _headlines(proc.stdout)
    assert all(len(lines) == 1 and lines[0].startswith("✓") for lines in headlines.values()), proc.stdout
    assert headlines["init"][0].startswith("✓ init 2/2 ranks initialised, world size 2 (expected 2), backend gloo")
    assert headlines["all_reduce"][0].startswith("✓ all_reduce sum of rank+1 = n(n+1)/2 on 2 rank(s); median")
    assert headlines["p2p"][0].startswith("✓ p2p 1 pair(s) in 1 round(s), 1 MiB each way; round trip median")
    assert proc.stdout.count("hf-distprof doctor: 2 rank(s), backend gloo") == 1
    assert proc.stdout.splitlines()[-1] == f"hf-distprof doctor: {len(CHECKS)} of {len(CHECKS)} checks passed"


def test_json_holds_every_check_with_each_rank_s_numbers(healthy):
    proc, out = healthy
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert list(report) == ["ok", "world_size", "backend", "timeout_s", "failed", "checks"]
    assert (report["ok"], report["world_size"], report["backend"], report["failed"]) == (True, 2, "gloo", [])
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    for check in report["checks"]:
        assert list(check) == ["name", "status", "summary", "details", "bad_ranks", "silent_ranks", "seconds",
                               "per_rank"]
        assert (check["status"], check["bad_ranks"], check["silent_ranks"]) == ("pass", [], [])
        assert list(check["per_rank"]) == ["0", "1"]
    checks = {c["name"]: c for c in report["checks"]}
    assert all(len(checks["all_reduce"]["per_rank"][r]["ms"]) == 3 for r in "01")
    assert [p["rank"] for p in checks["clock_skew"]["per_rank"]["0"]["peers"]] == [1]
    assert [p["peer"] for p in checks["p2p"]["per_rank"]["1"]["pairs"]] == [0]
    assert checks["environment"]["per_rank"]["1"]["env"]["RANK"] == "1"


def test_a_wrong_all_reduce_on_rank_1_fails_that_check_naming_rank_1():
    proc = _doctor(inject="all_reduce:1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    headlines = _headlines(proc.stdout)
    assert headlines["all_reduce"][0].startswith("✗ all_reduce wrong result on rank 1; median"), proc.stdout
    assert "    rank 1: element 0 is 4, expected 3 (262144 of 262144 wrong)" in proc.stdout.splitlines()
    # A wrong result leaves the group usable: the later checks still run, and pass.
    assert all(headlines[name][0].startswith("✓") for name in CHECKS if name != "all_reduce"), proc.stdout
    assert proc.stdout.splitlines()[-1] == f"hf-distprof doctor: {len(CHECKS) - 1} of {len(CHECKS)} checks " \
                                           "passed; FAILED: all_reduce"


def test_a_rank_that_never_joins_a_collective_is_named_and_nothing_hangs():
    proc = _doctor("--timeout", "5", inject="all_reduce:1:hang")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    headlines = _headlines(proc.stdout)
    assert headlines["all_reduce"][0].startswith("✗ all_reduce error on rank 0"), proc.stdout
    assert headlines["all_reduce"][0].endswith("; no answer from rank 1 within 7 s")
    # The group is in an unknown state afterwards: the later collectives are skipped, not waited for.
    for name in ("all_gather", "reduce_scatter", "broadcast", "barrier", "clock_skew"):
        assert headlines[name] == [f"- {name} skipped: all_reduce failed"]
    assert "hf-distprof doctor: 5 of 11 checks passed; FAILED: all_reduce; skipped: all_gather" in proc.stdout


def test_alone_it_is_a_world_of_one_without_point_to_point():
    proc = _doctor(torchrun=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    headlines = _headlines(proc.stdout)
    assert headlines["p2p"] == ["- p2p skipped: needs 2+ ranks"]
    assert headlines["clock_skew"] == ["- clock_skew skipped: needs 2+ ranks"]
    assert headlines["all_reduce"][0].startswith("✓ all_reduce sum of rank+1 = n(n+1)/2 on 1 rank(s)")
    assert proc.stdout.splitlines()[-1] == "hf-distprof doctor: 9 of 11 checks passed; skipped: p2p, clock_skew"


def test_the_watchdog_ends_a_rank_stuck_in_a_check():
    proc = _doctor("--timeout", "1", inject="barrier:0:hang", torchrun=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _headlines(proc.stdout)["broadcast"][0].startswith("✓ broadcast"), proc.stdout
    assert "[RANK 0] hf-distprof doctor: ✗ barrier: still running 7." in proc.stderr
