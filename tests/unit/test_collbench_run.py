"""``hf-distprof bench-collectives`` in this process: a world of one (gloo), its files, a wrong result, a refusal.

The 2-rank run is in ``tests/integration/test_bench_collectives.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from hf_distprof.collectives import bench as collbench
from hf_distprof.collectives import run as collbench_run
from hf_distprof.core import names
from hf_distprof.cli.main import main

SMALL = ["--sizes", "1K,4K", "--iters", "2", "--warmup", "1", "--no-progress"]


@pytest.fixture(autouse=True)
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher around: the command builds (and destroys) a world of one itself."""
    if torch.cuda.is_available():
        pytest.skip("these runs check gloo on the CPU")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def test_alone_it_runs_a_world_of_one_and_writes_the_csv_and_png(tmp_path: Path, capsys) -> None:
    assert main(["bench-collectives", *SMALL, "--output-dir", str(tmp_path)]) == 0
    assert not dist.is_initialized()  # destroyed at exit
    out = capsys.readouterr().out
    assert out.startswith("hf-distprof bench-collectives: 1 rank(s), backend gloo on cpu, float32, 1 warm-up + 2 ")
    rows = collbench.read_csv(tmp_path / names.BENCH_CSV_NAME)
    assert [(r.op, r.bytes, r.elements, r.world_size, r.status) for r in rows] == [
        (op, size, size // 4, 1, "ok") for op in collbench.OPS for size in (1024, 4096)]
    # One rank: nothing crosses a link, so busbw is 0 but for broadcast (factor 1).
    assert [r.busbw_gbps == r.algbw_gbps for r in rows] == [r.op == "broadcast" for r in rows]
    assert all(r.busbw_gbps == 0.0 for r in rows if r.op != "broadcast")
    assert (tmp_path / names.BENCH_PNG_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / names.BENCH_CSV_NAME} and {tmp_path / names.BENCH_PNG_NAME}" in out


def test_a_wrong_result_is_failed_in_the_table_and_the_exit_status(tmp_path: Path, monkeypatch, capsys) -> None:
    real = collbench.pattern

    def off_by_one(op: str, rank: int, world: int, dtype: str) -> collbench.Pattern:
        pat = real(op, rank, world, dtype)
        return collbench.Pattern(pat.inputs, tuple(v + 1 for v in pat.expected)) if op == "broadcast" else pat

    monkeypatch.setattr(collbench, "pattern", off_by_one)
    argv = ["bench-collectives", *SMALL, "--ops", "broadcast,all_gather", "--dtype", "bfloat16"]
    assert main([*argv, "--output-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "FAILED: rank 0: element 0 is 1, expected 2" in captured.out
    assert "hf-distprof bench-collectives: FAILED: a collective gave a wrong result" in captured.err
    rows = collbench.read_csv(tmp_path / names.BENCH_CSV_NAME)
    assert [(r.op, r.bytes, r.dtype, r.status) for r in rows] == [
        ("all_gather", 1024, "bfloat16", "ok"), ("all_gather", 4096, "bfloat16", "ok"),
        ("broadcast", 1024, "bfloat16", "FAILED"), ("broadcast", 4096, "bfloat16", "FAILED")]


def test_an_op_the_backend_refuses_is_one_skipped_line_not_a_crash(tmp_path: Path, monkeypatch, capsys) -> None:
    real = collbench_run._op_call
    calls: list[str] = []

    def refuse_all_to_all(op: str, buffers: dict[str, Any]) -> Any:
        calls.append(op)
        if op != "all_to_all":
            return real(op, buffers)

        def refuse() -> None:
            raise RuntimeError("ProcessGroupGloo does not support alltoall\nmore detail")

        return refuse

    monkeypatch.setattr(collbench_run, "_op_call", refuse_all_to_all)
    assert main(["bench-collectives", *SMALL, "--ops", "all_reduce,all_to_all", "--output-dir", str(tmp_path)]) == 0
    assert calls == ["all_reduce", "all_reduce", "all_to_all"]  # not tried again at the next size
    table = capsys.readouterr().out
    assert [line for line in table.splitlines() if line.startswith("all_to_all")] == [
        f"{'all_to_all':<15} skipped: not supported by gloo: ProcessGroupGloo does not support alltoall"]
    assert [r.status for r in collbench.read_csv(tmp_path / names.BENCH_CSV_NAME)] == ["ok", "ok", "skipped", "skipped"]


def test_an_unwritable_output_dir_is_exit_2_naming_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    assert main(["bench-collectives", *SMALL, "--ops", "broadcast", "--output-dir", str(tmp_path / "file")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"hf-distprof bench-collectives: error: --output-dir {tmp_path / 'file'}: File exists\n"
    assert captured.out == ""  # said before the benchmark ran (a trial: its table printed, then the files lost)
    assert not dist.is_initialized()
