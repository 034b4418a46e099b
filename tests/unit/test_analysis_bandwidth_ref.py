"""``analyze --bandwidth-ref``: trace bandwidth against a bench-collectives CSV, slow network versus late peer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from hf_distprof.collectives import bench as collbench
from hf_distprof.analysis.across.reference import compare_row, compare_to_reference, nearest_reference
from hf_distprof.analysis.results.across import ReferencePoint
from hf_distprof.analysis.results.across import BandwidthStat
from hf_distprof.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data"
K, M = 1 << 10, 1 << 20
POINTS = [ReferencePoint("all_reduce", 64 * K, 0.2, 2), ReferencePoint("all_reduce", 256 * K, 0.5, 2),
          ReferencePoint("all_reduce", M, 2.0, 2), ReferencePoint("all_gather", 256 * K, 9.0, 2)]


def _stat(**kw: object) -> BandwidthStat:
    base = {"kind": "all_reduce", "group_size": 2, "bucket": "256 KiB-1 MiB", "bucket_low_bytes": 256 * K,
            "bucket_high_bytes": M, "ranks": 2, "count": 20, "count_per_rank": 10.0, "mean_bytes": 300 * K,
            "time_us": 70_000.0, "algbw_gbps": 0.04, "busbw_gbps": 0.04, "matched": 20, "wait_us": 20_000.0,
            "transfer_us": 50_000.0, "transfer_algbw_gbps": 0.06, "transfer_busbw_gbps": 0.06}
    return BandwidthStat(**{**base, **kw})  # type: ignore[arg-type]


def test_the_nearest_size_of_the_same_kind_in_ratio() -> None:
    assert nearest_reference(POINTS, "all_reduce", 300 * K) == POINTS[1]
    assert nearest_reference(POINTS, "all_reduce", 700 * K) == POINTS[2]  # 1.46x below 1 MiB, 2.7x above 256 KiB
    assert nearest_reference(POINTS, "all_reduce", 1) == POINTS[0]
    assert nearest_reference(POINTS, "all_reduce", 128 * K) == POINTS[0]  # a tie: the smaller size
    assert nearest_reference(POINTS, "broadcast", 300 * K) is None
    assert nearest_reference(POINTS, "all_reduce", 0) is None


def test_points_of_the_same_group_size_win_and_a_zero_busbw_never_serves() -> None:
    eight = ReferencePoint("all_reduce", M, 40.0, 8)
    assert nearest_reference([*POINTS, eight], "all_reduce", 300 * K, group_size=8) == eight
    assert nearest_reference([*POINTS, eight], "all_reduce", 300 * K, group_size=4) == POINTS[1]
    assert nearest_reference([ReferencePoint("all_reduce", M, 0.0, 1)], "all_reduce", M) is None


def test_transfer_time_against_the_reference_splits_slow_network_from_late_peer() -> None:
    got = compare_row(_stat(), POINTS[1])
    assert got is not None
    # 50 ms of transfers at 0.06 GB/s would take 50 x 0.06 / 0.5 = 6 ms at 0.5 GB/s: 44 ms lost to the network.
    assert (got.basis, got.busbw_gbps, got.time_us, got.at_ref_us) == ("transfer", 0.06, 50_000.0, 6_000.0)
    assert (got.slow_network_us, got.late_peer_us, got.ref_bytes, got.ref_busbw_gbps) == (44_000.0, 20_000.0,
                                                                                           256 * K, 0.5)
    faster = compare_row(_stat(), ReferencePoint("all_reduce", 256 * K, 0.03, 2))
    assert faster is not None and (faster.at_ref_us, faster.slow_network_us) == (100_000.0, 0.0)


def test_without_a_wait_split_the_whole_time_is_compared() -> None:
    one_rank = _stat(ranks=1, matched=0, wait_us=0.0, transfer_us=0.0, transfer_algbw_gbps=None,
                     transfer_busbw_gbps=None, busbw_gbps=0.05)
    got = compare_row(one_rank, POINTS[1])
    assert got is not None
    assert (got.basis, got.time_us, got.at_ref_us, got.slow_network_us, got.late_peer_us) == (
        "whole", 70_000.0, 7_000.0, 63_000.0, None)
    assert compare_row(replace(one_rank, busbw_gbps=None), POINTS[1]) is None  # a kind without a bus factor
    assert compare_to_reference([_stat(kind="send"), _stat()], POINTS) == [compare_row(_stat(), POINTS[1])]


def _reference_csv(tmp_path: Path) -> Path:
    rows = [collbench.BenchRow(p.kind, p.bytes, p.bytes // 4, "float32", p.world_size, "gloo", 20, 1.0, 1.0,
                               p.busbw_gbps, "ok") for p in POINTS]
    path = tmp_path / "ref.csv"
    collbench.write_csv(rows, path)
    return path


def test_analyze_reports_the_clean_gloo_run_against_a_reference(tmp_path: Path, capsys) -> None:
    ref = _reference_csv(tmp_path)
    assert main(["analyze", str(DATA / "clean"), "--workers", "1", "--json", "--bandwidth-ref", str(ref)]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result["bandwidth_reference_file"] == str(ref)
    [row] = result["bandwidth_reference"]
    # 24 all_reduces of 6,328,368 bytes in all, every one matched on both ranks: 3,164,184 bytes per rank,
    # 1 x that at 0.5 GB/s (factor 2(n-1)/n = 1 on 2 ranks) is 6,328.368 us.
    assert (row["kind"], row["group_size"], row["basis"], row["ref_bytes"], row["ref_busbw_gbps"]) == (
        "all_reduce", 2, "transfer", 256 * K, 0.5)
    assert row["at_ref_us"] == pytest.approx(6_328.368, abs=1e-6)
    stat = result["bandwidth"][0]
    assert (row["time_us"], row["late_peer_us"]) == (stat["transfer_us"], stat["wait_us"])
    assert row["slow_network_us"] == pytest.approx(stat["transfer_us"] - 6_328.368, abs=1e-6)


def test_the_summary_and_the_report_show_the_reference(tmp_path: Path, capsys) -> None:
    ref = _reference_csv(tmp_path)
    argv = ["analyze", str(DATA / "clean"), "--workers", "1", "--bandwidth-ref", str(ref)]
    assert main([*argv, "--report", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert f"Against {ref} (busbw GB/s; per rank;" in out
    # (Of the 70.87 ms in the collectives per rank, 9.16 ms were a rank's time past their completion: not transfer.)
    assert ("Per rank: 19.37 ms waiting for a late peer; 42.34 ms of transfers would take 6.33 ms at the reference "
            "speed: 36.01 ms lost to a slow network.") in out
    assert "### Against the reference bandwidth (`--bandwidth-ref`)" in (tmp_path / "rep" / "report.md").read_text()


def test_a_reference_without_the_trace_s_kinds_says_so(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ref.csv"
    collbench.write_csv([collbench.BenchRow("broadcast", M, M // 4, "float32", 2, "gloo", 20, 1.0, 1.0, 1.0, "ok")],
                        path)
    assert main(["analyze", str(DATA / "clean"), "--workers", "1", "--bandwidth-ref", str(path)]) == 0
    assert f"Against {path}: no collective of the trace (all_reduce) has a reference there." in capsys.readouterr().out


def test_a_bad_reference_file_is_exit_2_naming_it(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("kind,size\n1,2\n")
    assert main(["analyze", str(DATA / "clean"), "--bandwidth-ref", str(bad)]) == 2
    assert capsys.readouterr().err == (f"hf-distprof analyze: error: --bandwidth-ref: {bad}: not a bench-collectives "
                                       f"CSV: the header must be {','.join(collbench.CSV_COLUMNS)}\n")
    assert main(["analyze", str(DATA / "clean"), "--bandwidth-ref", str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-distprof analyze: error: --bandwidth-ref: ") and "missing.csv" in err


def test_one_rank_s_trace_is_compared_whole_and_says_so(tmp_path: Path, capsys) -> None:
    ref = _reference_csv(tmp_path)
    assert main(["analyze", str(DATA / "clean" / "rank-0.json.gz"), "--workers", "1", "--bandwidth-ref",
                 str(ref)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Per rank: ")]
    # Rank 0's 12 all_reduces move 3,164,184 bytes: 6.33 ms at 0.5 GB/s, whatever their time was.
    assert " ms in collectives (waits included: one rank) would take 6.33 ms at the reference speed: " in line
    assert "late peer" not in line


def test_the_total_says_faster_than_the_reference_and_marks_a_reference_far_from_the_row_s_size() -> None:
    # A trial: "38.41 ms of transfers would take 55.94 ms at the reference speed: 12.44 ms lost to a slow network"
    # (the lost time is the slower rows' only), its 5.5 MiB row set against the benchmark's 1 MiB point unmarked.
    from hf_distprof.analysis import AnalysisOptions, analyze_paths
    from hf_distprof.analysis.across.reference import totals
    from hf_distprof.analysis.tell.text import reference_lines

    slow = compare_row(_stat(mean_bytes=300 * K, transfer_us=3_000.0), POINTS[1])  # 0.06 GB/s against 0.5
    fast = compare_row(_stat(bucket="4-16 MiB", mean_bytes=5.5 * M, transfer_us=2_000.0, transfer_busbw_gbps=6.0),
                       POINTS[2])  # 6 GB/s against the 1 MiB point's 2
    assert slow is not None and fast is not None and slow.slow_network_us > 0 and fast.slow_network_us == 0
    result = analyze_paths(sorted((DATA / "clean").glob("rank-*.json.gz")), AnalysisOptions(workers=1))
    result.bandwidth_reference, result.bandwidth_reference_file = [slow, fast], "ref.csv"
    result.reference_totals = totals([slow, fast])
    assert result.reference_totals.at_ref_us > result.reference_totals.time_us
    lines = reference_lines(result)
    assert lines[-2].endswith(
        f"at the reference speed: faster than the reference in all, though the rows slower than it lose "
        f"{slow.slow_network_us / 1e3:.2f} ms.")
    assert "  1.00 MiB*" in lines[4] and "*" not in lines[3].split("256 KiB-1 MiB", 1)[1].split()[0]
    assert lines[-1].startswith("* the reference's nearest size is more than 2x off the row's mean size (5.50 MiB "
                                "against 1.00 MiB): bandwidth depends on size")
