"""``bench-collectives``' pure parts: sizes and flags, patterns and their exact results, rows, CSV, table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_distprof.collectives import bench as collbench
from hf_distprof.collectives.bench import BenchRow, RankOutcome
from hf_distprof.cli.main import build_parser

from ..conftest import REPO_ROOT

K, M = 1 << 10, 1 << 20


def test_sizes_take_lists_and_ranges_in_binary_units() -> None:
    assert collbench.parse_sizes("1K,1M,16M") == [K, M, 16 * M]
    assert collbench.parse_sizes("64K, 4096 ,64KiB,1kb") == [K, 4096, 64 * K]
    assert collbench.parse_sizes("1K:16K") == [K, 2 * K, 4 * K, 8 * K, 16 * K]
    assert collbench.parse_sizes("1K:20K:4") == [K, 4 * K, 16 * K]  # END included only when hit
    assert collbench.parse_sizes(collbench.DEFAULT_SIZES_GPU)[-1] == 64 * M
    assert len(collbench.parse_sizes(collbench.DEFAULT_SIZES_GPU)) == 17
    assert collbench.parse_sizes(collbench.DEFAULT_SIZES_CPU) == [K, 4 * K, 16 * K, 64 * K, 256 * K, M]


@pytest.mark.parametrize(
    ("text", "says"),
    [("1X", "'1X' is not a size"), ("2", "2 is out of range"), ("16G", "16G is out of range"),
     ("64M:1K", "a range needs START <= END"), ("1K:64M:1", "FACTOR >= 2"), ("1K:2K:x", "FACTOR >= 2"),
     ("1:2:3:4", "is not a range"), (",", "no size given"), ("0", "0 is out of range")],
)
def test_bad_sizes_say_what_is_wrong_and_the_valid_range(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="from 4 B to 8G") as err:
        collbench.parse_sizes(text)
    assert says in str(err.value)


def test_too_many_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="gives 65 sizes"):
        collbench.parse_sizes(",".join(str(4 * (i + 1)) for i in range(65)))


@pytest.mark.parametrize(
    ("argv", "says"),
    [(["--sizes", "1Q"], "argument --sizes: '1Q' is not a size (a list like 1K,1M,16M"),
     (["--iters", "0"], "argument --iters: must be an integer from 1 to 100000, got '0'"),
     (["--warmup", "x"], "argument --warmup: must be an integer from 0 to 10000, got 'x'"),
     (["--ops", "all_reduce,gather"], "argument --ops: gather is not an op; choose from all_reduce,all_gather,"),
     (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'")],
)
def test_bad_flags_exit_2_naming_the_flag(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench-collectives", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_flags_parse_into_ops_in_canonical_order_and_sizes() -> None:
    args = build_parser().parse_args(["bench-collectives", "--ops", "broadcast,all_reduce", "--sizes", "1K:4K"])
    assert (args.ops, args.sizes, args.dtype, args.warmup, args.iters) == (("all_reduce", "broadcast"),
                                                                             [K, 2 * K, 4 * K], "float32", 5, 20)
    assert build_parser().parse_args(["bench-collectives"]).ops == collbench.OPS


def test_sizes_follow_the_analysis_conventions() -> None:
    # 1 MiB of float32 on 3 ranks: split ops round down to a multiple of 3 elements.
    assert collbench.element_count("all_reduce", M, 4, 3) == 262_144
    assert collbench.element_count("all_gather", M, 4, 3) == 262_143
    assert collbench.element_count("all_to_all", 4, 4, 3) == 3  # at least one element per rank
    assert collbench.buffer_bytes("all_gather", 262_143, 4, 3) == (349_524, 1_048_572)
    assert collbench.buffer_bytes("reduce_scatter", 262_143, 4, 3) == (1_048_572, 349_524)
    # S: all_gather's output, reduce_scatter's input, the buffer otherwise.
    assert [collbench.message_size(op, 262_143, 4, 3) for op in collbench.OPS] == [1_048_572] * 5


def test_reduction_values_stay_exact_in_every_dtype() -> None:
    assert collbench.reduction_values(2, "float32") == [1, 2]
    assert collbench.reduction_values(4, "float32") == [1, 2, 3, 4]
    # bfloat16 holds integers up to 256 exactly; reduce_scatter doubles some blocks: sums up to 128. Cycles of
    # 1..4 on 64 ranks would sum to 160; of 1..3, to 21 x 6 + 1.
    assert collbench.reduction_values(64, "bfloat16") == [1 + r % 3 for r in range(64)]
    assert sum(collbench.reduction_values(64, "bfloat16")) == 127
    assert collbench.reduction_values(300, "bfloat16") == [1] * 128 + [0] * 172
    assert sum(collbench.reduction_values(1000, "float16")) <= 1024


def _simulate(op: str, inputs: list[list[int]]) -> list[list[int]]:
    """What each rank must hold after ``op``, from each rank's input blocks (root 0), written out plainly."""
    n = len(inputs)
    if op == "all_reduce":
        return [[sum(x[0] for x in inputs)]] * n
    if op == "all_gather":
        return [[x[0] for x in inputs]] * n
    if op == "reduce_scatter":
        return [[sum(x[r] for x in inputs)] for r in range(n)]
    if op == "broadcast":
        return [inputs[0]] * n
    return [[inputs[i][r] for i in range(n)] for r in range(n)]  # all_to_all


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("op", collbench.OPS)
def test_each_pattern_expects_exactly_what_the_op_computes(op: str, world: int) -> None:
    patterns = [collbench.pattern(op, rank, world, "bfloat16") for rank in range(world)]
    got = _simulate(op, [list(p.inputs) for p in patterns])
    assert [list(p.expected) for p in patterns] == got
    if world > 1:  # rank-dependent: a rank that skipped its part, or sent it to the wrong place, shows
        assert len({p.inputs for p in patterns}) == world


def _row(op: str = "all_reduce", **kw: object) -> BenchRow:
    base = {"op": op, "bytes": M, "elements": 262_144, "dtype": "float32", "world_size": 2, "backend": "gloo",
            "iters": 20, "time_us": 125.0, "algbw_gbps": 8.388608, "busbw_gbps": 8.388608, "status": "ok", "note": ""}
    return BenchRow(**{**base, **kw})  # type: ignore[arg-type]


def test_a_row_keeps_the_slowest_rank_and_nccl_tests_bus_factor() -> None:
    row = collbench.make_row("all_reduce", 262_144, "float32", "gloo", 20, [RankOutcome(100.0), RankOutcome(125.0)])
    assert row == _row()  # 1 MiB / 125 us = 8.388608 GB/s; x 2(n-1)/n = 1 on 2 ranks
    four = [RankOutcome(t) for t in (100.0, 200.0, 150.0, 50.0)]
    row = collbench.make_row("all_gather", 262_144, "float32", "gloo", 20, four)
    assert (row.bytes, row.time_us, row.algbw_gbps, row.busbw_gbps) == (M, 200.0, 5.24288, 5.24288 * 0.75)
    row = collbench.make_row("all_reduce", 262_144, "float32", "gloo", 20, [RankOutcome(100.0)])
    assert (row.algbw_gbps, row.busbw_gbps) == (10.48576, 0.0)  # one rank: nothing crosses a link


def test_a_wrong_result_on_any_rank_fails_the_row_and_names_the_rank() -> None:
    outcomes = [RankOutcome(100.0), RankOutcome(90.0, wrong="element 3 is 2, expected 3")]
    row = collbench.make_row("broadcast", 256, "float32", "gloo", 20, outcomes)
    assert (row.status, row.note, row.time_us) == ("FAILED", "rank 1: element 3 is 2, expected 3", 100.0)


def test_a_refused_op_is_skipped_with_the_backend_s_reason() -> None:
    outcomes = [RankOutcome(None, unsupported="all_to_all is not supported")] * 2
    row = collbench.make_row("all_to_all", 256, "float32", "gloo", 20, outcomes)
    assert (row.status, row.time_us, row.busbw_gbps) == ("skipped", None, None)
    assert row.note == "not supported by gloo: all_to_all is not supported"


def test_csv_round_trips_exactly(tmp_path: Path) -> None:
    rows = [_row(), _row("all_to_all", time_us=None, algbw_gbps=None, busbw_gbps=None, status="skipped",
                         note="not supported by gloo: no, really, not")]
    path = tmp_path / "bench.csv"
    collbench.write_csv(rows, path)
    assert path.read_text().splitlines()[0] == (
        "op,bytes,elements,dtype,world_size,backend,iters,time_us,algbw_gbps,busbw_gbps,status,note")
    assert path.read_text().splitlines()[2] == (
        'all_to_all,1048576,262144,float32,2,gloo,20,,,,skipped,"not supported by gloo: no, really, not"')
    assert collbench.read_csv(path) == rows


@pytest.mark.parametrize(
    ("text", "says"),
    [("", "not a bench-collectives CSV: the header must be op,bytes,"), ("op,bytes\n1,2\n", "the header must be"),
     (",".join(collbench.CSV_COLUMNS) + "\n", "a bench-collectives CSV without a row"),
     (",".join(collbench.CSV_COLUMNS) + "\nall_reduce,1K,1,float32,2,gloo,1,1,1,1,ok,\n",
      "line 2: column bytes: '1K' is not an int"),
     (",".join(collbench.CSV_COLUMNS) + "\nall_reduce,1,1\n", "line 2: 3 cells, expected 12")],
)
def test_a_malformed_csv_is_named_with_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "ref.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        collbench.read_csv(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value)


def test_the_reference_keeps_correct_rows_with_a_busbw(tmp_path: Path) -> None:
    path = tmp_path / "ref.csv"
    collbench.write_csv([_row(), _row(bytes=K, status="FAILED"), _row(world_size=1, busbw_gbps=0.0)], path)
    assert collbench.load_reference(path) == [collbench.ReferencePoint("all_reduce", M, 8.388608, 2)]
    collbench.write_csv([_row(world_size=1, busbw_gbps=0.0)], path)
    with pytest.raises(ValueError, match="no correct row with a positive busbw"):
        collbench.load_reference(path)


def test_the_table_shows_each_row_and_a_refused_op_once() -> None:
    rows = [_row(), _row(status="FAILED", note="rank 1: element 0 is 2, expected 3"),
            *[_row("all_to_all", bytes=b, time_us=None, algbw_gbps=None, busbw_gbps=None, status="skipped",
                   note="not supported by gloo: x") for b in (K, M)]]
    lines = collbench.format_table(rows).splitlines()
    assert lines[0].split() == ["op", "size", "elements", "time", "us", "algbw", "GB/s", "busbw", "GB/s", "check"]
    assert lines[2].split() == ["all_reduce", "1", "MiB", "262144", "125.0", "8.389", "8.389", "ok"]
    assert lines[3].endswith("FAILED: rank 1: element 0 is 2, expected 3")
    assert lines[4:] == [f"{'all_to_all':<15} skipped: not supported by gloo: x"]


def test_size_labels_use_the_largest_exact_unit() -> None:
    assert [collbench.size_label(s) for s in (4, 1536, K, 64 * K, 3 * M, 1 << 30)] == [
        "4 B", "1536 B", "1 KiB", "64 KiB", "3 MiB", "1 GiB"]


def test_the_guide_s_flag_table_lists_exactly_the_command_s_flags() -> None:
    guide = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    section = guide.split("## Collective bandwidth benchmark", 1)[1].split("### What it does", 1)[0]
    documented = {flag for row in re.findall(r"^\| `([^`]+)`", section, re.M) for flag in re.findall(r"--[\w-]+", row)}
    sub = build_parser()._subparsers._group_actions[0].choices["bench-collectives"]  # type: ignore[union-attr]
    flags = {opt for action in sub._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}
    assert documented == flags
