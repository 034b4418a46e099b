"""Two hosts sharing one output folder: two torchrun agents of 2 ranks each, each in its own UTS namespace with its
own host name (``unshare -r --uts``), run twice. Every file is distinct, nothing is overwritten, and the run manifest
lists both hosts, the 4 ranks and their clocks."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

TINY = Path(__file__).with_name("tiny_trainer.py")
HOSTS = ("hostA", "hostB")
RANKS = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}


def uts_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-r", "--uts", "sh", "-c", 'hostname hostA && [ "$(hostname)" = hostA ]'],
                           capture_output=True)
    return probe.returncode == 0


def run_two_hosts(tmp_path: Path, attempt: int) -> None:
    """One 4-rank job: node 0 as hostA, node 1 as hostB, both writing into ``tmp_path/P``."""
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": "lo", "TINY_STEP_S": "0"}
    procs = []
    for node, host in enumerate(HOSTS):
        log = tmp_path / f"attempt{attempt}_{host}.log"
        cmd = ["unshare", "-r", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--master_addr", "127.0.0.1", "--master_port", port, "--nproc_per_node", "2", str(TINY),
               "--output-dir", str(tmp_path / f"trainer_{host}"), "--use-cpu", "true", "--report-to", "none",
               "--disable-tqdm", "true", "--save-strategy", "no", "--logging-steps", "3", "--max-steps", "3",
               "--enable-profiling", "--profiler-record-shapes", "false", "--profiler-wait-steps", "1",
               "--profiler-warmup-steps", "0", "--profiler-active-steps", "1",
               "--profiler-output-dir", str(tmp_path / "P"), "--profiler-run-name", "run"]
        with open(log, "w") as out:
            procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path), log))
    for proc, log in procs:
        assert proc.wait(timeout=180) == 0, log.read_text()[-4000:]


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Each file's inode, modification time and content hash."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir())}


def check_run(run_dir: Path) -> None:
    names = {p.name for p in run_dir.iterdir()}
    for rank, host in RANKS.items():
        for name in (f"rank{rank}_{host}_step2-2.pt.trace.json.gz", f"rank{rank}_{host}_step2-2_summary.txt",
                     f"manifest_rank{rank}_{host}.json", f"rank{rank}.log"):
            assert name in names, (name, sorted(names))
    assert not [n for n in names if n.startswith(".")]  # no temporary file left
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["world_size"] == 4
    assert manifest["hosts"] == [{"host": "hostA", "ranks": [0, 1]}, {"host": "hostB", "ranks": [2, 3]}]
    assert [(r["rank"], r["host"], r["local_rank"], r["status"]) for r in manifest["ranks"]] == [
        (0, "hostA", 0, "finished"), (1, "hostA", 1, "finished"), (2, "hostB", 0, "finished"),
        (3, "hostB", 1, "finished")]
    clocks = {r["rank"]: r for r in manifest["ranks"]}
    assert [clocks[r]["clock_measured_on_rank"] for r in range(4)] == [0, 0, 2, 2]
    assert clocks[0]["clock_offset_us"] == clocks[1]["clock_offset_us"] == 0.0
    # Both "hosts" read one physical clock: the measured offset is 0 within its stated uncertainty.
    assert abs(clocks[2]["clock_offset_us"]) <= clocks[2]["clock_uncertainty_us"]
    assert [(w["first"], w["last"], w["reasons"], w["ranks"]) for w in manifest["windows"]] == [
        (2, 2, ["schedule"], [0, 1, 2, 3])]
    listed = [f["name"] for f in manifest["files"]]
    assert len(listed) == len(set(listed))  # no two ranks wrote one name
    assert all(name in names for name in listed)
    # Every file that carries a rank in its name is listed under that rank (and host, where it has one).
    owners = {f["name"]: (f["rank"], f["host"]) for f in manifest["files"]}
    for name in names - {"manifest.json"}:
        match = re.search(r"rank(\d+)(?:_(host[AB]))?", name)
        if match is None or name.startswith("manifest_rank"):
            continue
        rank = int(match.group(1))
        assert owners.get(name) == (rank, RANKS[rank]), name
        assert match.group(2) in (None, RANKS[rank]), name


def test_two_hosts_of_two_ranks_run_twice_into_one_folder_write_distinct_files_and_list_both_hosts(tmp_path):
    if not uts_namespaces_work():
        pytest.skip("needs `unshare -r --uts` (user and UTS namespaces) to give each agent its own host name")
    run_two_hosts(tmp_path, 1)
    assert sorted(p.name for p in (tmp_path / "P").iterdir()) == ["run"]
    first = snapshot(tmp_path / "P" / "run")
    run_two_hosts(tmp_path, 2)
    # The second job got a folder of its own; the first job's files are untouched (same inode, time and bytes).
    assert sorted(p.name for p in (tmp_path / "P").iterdir()) == ["run", "run-1"]
    assert snapshot(tmp_path / "P" / "run") == first
    for run in ("run", "run-1"):
        check_run(tmp_path / "P" / run)
    # analyze puts hostB on hostA's clock by the offset the manifest measured (both read one clock: about 0), not by
    # the collectives' ends, which a gloo rank's late thread moves by milliseconds (6.5 ms in a trial).
    run_dir = tmp_path / "P" / "run"
    proc = subprocess.run([sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(run_dir), "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offsets = {p["rank"]: p["clock_offset_us"] for p in json.loads(proc.stdout)["cross_rank"]["per_rank"]}
    clocks = {r["rank"]: r for r in json.loads((run_dir / "manifest.json").read_text())["ranks"]}
    base = {}
    for rank, host in RANKS.items():
        with gzip.open(run_dir / f"rank{rank}_{host}_step2-2.pt.trace.json.gz", "rt") as fh:
            base[rank] = json.load(fh)["baseTimeNanoseconds"]
    for rank in RANKS:  # an offset to subtract, after each trace's base time is put on rank 0's
        expected = clocks[rank]["clock_offset_us"] - (base[rank] - base[0]) / 1e3
        assert offsets[rank] == pytest.approx(expected, abs=1e-3), (rank, offsets, clocks[rank])
