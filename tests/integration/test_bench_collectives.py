"""``torchrun --nproc_per_node 2 hf-distprof bench-collectives`` for real: 2 gloo ranks, every op checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof.collectives import bench as collbench
from hf_distprof.core import names
from hf_distprof.analysis.across.bandwidth import bus_factor

from ..conftest import REPO_ROOT
from .launch import free_port

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def test_two_gloo_ranks_check_every_op_and_write_the_table_csv_and_png(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()), str(BIN / "hf-distprof"),
         "bench-collectives", "--sizes", "1K,64K", "--iters", "3", "--warmup", "1", "--output-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,  # the timeout only stops a hung run
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("hf-distprof bench-collectives: 2 rank(s), backend gloo on cpu, float32, 1 warm-up ")
    assert proc.stdout.count("hf-distprof bench-collectives: 2 rank(s)") == 1  # rank 0 only
    table = [line.split() for line in lines if line.split()[:1] and line.split()[0] in collbench.OPS]
    sizes = (("1 KiB", "256"), ("64 KiB", "16384"))
    assert [(t[0], " ".join(t[1:3]), t[3], t[-1]) for t in table] == [
        (op, size, elements, "ok") for op in collbench.OPS for size, elements in sizes]
    rows = collbench.read_csv(tmp_path / names.BENCH_CSV_NAME)
    assert [(r.op, r.bytes, r.elements, r.dtype, r.world_size, r.backend, r.iters, r.status, r.note) for r in rows] == [
        (op, size, size // 4, "float32", 2, "gloo", 3, "ok", "") for op in collbench.OPS for size in (1024, 65536)]
    for r in rows:
        assert r.time_us is not None and r.algbw_gbps == pytest.approx(r.bytes / r.time_us / 1e3, rel=1e-12)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * bus_factor(r.op, 2), rel=1e-12)
    assert (tmp_path / names.BENCH_PNG_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert lines[-1] == f"wrote {tmp_path / names.BENCH_CSV_NAME} and {tmp_path / names.BENCH_PNG_NAME}"
