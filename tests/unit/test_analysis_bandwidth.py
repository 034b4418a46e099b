"""Collective bandwidth: message sizes from traces, nccl-tests' algbw/busbw, waiting vs transfer.

Hand-written traces and results give exact expected numbers (NCCL ``record_param_comms`` sizes, gloo
shapes, the wait/transfer split on two ranks with known arrivals and clocks); the shared 8-GPU DLRM traces
are checked against sizes and bandwidths recomputed here from their raw JSON; the committed gloo traces
were recorded without shapes, and the tables must say so.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from statistics import median
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_summary
from hf_distprof.analysis.read import trace_io
from hf_distprof.analysis.across.align import align, set_waits
from hf_distprof.analysis.across.bandwidth import bus_factor, collective_bandwidth, size_bucket
from hf_distprof.analysis.read.message_sizes import message_bytes
from hf_distprof.analysis.read.events import parse_trace
from hf_distprof.analysis.read.message_sizes import MessageSize
from hf_distprof.analysis.results.across import BandwidthStat
from hf_distprof.analysis.results.rank import Collective, RankResult
from hf_distprof.analysis.tell.report import write_report

from .test_analysis_hta import DLRM

DATA = Path(__file__).resolve().parents[1] / "data"
MAIN, WORKER = 1, 2
MiB = 1 << 20


def _span(name: str, ts: float, end: float, tid: int = MAIN, cat: str = "user_annotation", **args: Any) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": end - ts}
    if args:
        event["args"] = args
    return event


def _shapes(types: list[str], dims: list[Any]) -> dict[str, Any]:
    return {"Input type": types, "Input Dims": dims}


def _write(path: Path, events: list[dict[str, Any]], rank: int, backend: str, world_size: int) -> Path:
    info = {"rank": rank, "world_size": world_size, "backend": backend}
    path.write_bytes(orjson.dumps({"record_shapes": 1, "distributedInfo": info, "traceEvents": events}))
    return path


def _nccl_collective(kind: str, kernel: str, t: float, corr: int, start: float, dur: float, **sizes: Any) -> list:
    """A collective as newer PyTorch records it: record_param_comms (with sizes) > nccl:* > the launch."""
    return [
        _span("record_param_comms", t, t + 100, cat="cpu_op", **sizes),
        _span(f"nccl:{kind}", t + 10, t + 90),
        _span("cudaLaunchKernel", t + 50, t + 60, cat="cuda_runtime", correlation=corr),
        _span(kernel, start, start + dur, tid=7, cat="kernel", stream=20, correlation=corr),
    ]


def nccl_trace(path: Path) -> Path:
    """One step of one rank (of 16) issuing three collectives in a group of 8, sized by record_param_comms.

    - all_reduce of 250M float (1e9 B) taking 10 ms: algbw 100 GB/s, busbw 100 x 2 x 7/8 = 175 GB/s;
    - all_gather of 50M bf16 per rank into 400M (S = the output, 8e8 B) in 4 ms: algbw 200, busbw 175;
    - reduce_scatter of 400M bf16 (S = the input, 8e8 B) into 50M in 8 ms: algbw 100, busbw 87.5.
    """
    group = {"dtype": "Float", "Group size": 8}
    bf16 = {"dtype": "BFloat16", "Group size": 8}
    events = [_span("ProfilerStep#1", 0, 30_000)]
    events += _nccl_collective(
        "all_reduce", "ncclDevKernel_AllReduce_RING_LL_Sum_float(x)", 100, 1, 1000, 10_000,
        **{"In msg nelems": 250_000_000, "Out msg nelems": 250_000_000, **group},
    )
    events += _nccl_collective(
        "_all_gather_base", "ncclDevKernel_AllGather_RING_LL(x)", 300, 2, 12_000, 4000,
        **{"In msg nelems": 50_000_000, "Out msg nelems": 400_000_000, **bf16},
    )
    events += _nccl_collective(
        "_reduce_scatter_base", "ncclDevKernel_ReduceScatter_RING_LL_Sum_bf16(x)", 500, 3, 17_000, 8000,
        **{"In msg nelems": 400_000_000, "Out msg nelems": 50_000_000, **bf16},
    )
    return _write(path, events, rank=0, backend="nccl", world_size=16)


def gloo_trace(path: Path, rank: int, late_us: float) -> Path:
    """One step on gloo with shapes recorded as torch 2.13 writes them; this rank enqueues ``late_us`` late.

    - all_reduce of 1000 floats: c10d::allreduce_ records a TensorList (no dtype), the gloo span its input;
    - all_gather of 1000 floats on 2 ranks: the gloo span has no shapes here, so the size comes from
      c10d::_allgather_base_'s (output, input) = (2000, 1000) floats: S = 8000 B;
    - reduce_scatter of 1000 floats (runs as gloo:all_reduce, whose input is the whole buffer): S = 4000 B.
    Every gloo span ends at the same time on both ranks (t + 1000 us).
    """
    floats = _shapes(["float"], [[1000]])
    d = late_us
    events = [
        _span("ProfilerStep#3", 0, 10_000),
        _span("c10d::allreduce_", 100 + d, 110 + d, cat="cpu_op",
              **_shapes(["TensorList", "", "", "", "Scalar", "Scalar"], [[[1000]], [], [], [], [], []])),
        _span("gloo:all_reduce", 120 + d, 1120, WORKER, **floats),
        _span("c10d::_allgather_base_", 2000 + d, 2010 + d, cat="cpu_op",
              **_shapes(["float", "float", "", "Scalar", "Scalar"], [[2000], [1000], [], [], []])),
        _span("gloo:all_gather", 2020 + d, 3020, WORKER),
        _span("c10d::_reduce_scatter_base_", 4000 + d, 4010 + d, cat="cpu_op",
              **_shapes(["float", "float", "", "", "Scalar", "Scalar"], [[500], [1000], [], [], [], []])),
        _span("gloo:all_reduce", 4020 + d, 5020, WORKER, **floats),
    ]
    return _write(path, events, rank=rank, backend="gloo", world_size=2)


def _rank(rank: int, collectives: list[Collective]) -> RankResult:
    return RankResult(
        rank=rank, path=f"rank{rank}", device="gpu", backend="nccl", world_size=2, host=None, n_events=0,
        steps=[], gpu_total=None, kernel_categories_us={}, kernel_categories_count={}, top_kernels=[],
        collectives=collectives,
    )


def _row(rows: list[BandwidthStat], kind: str, bucket: str) -> BandwidthStat:
    (row,) = [r for r in rows if r.kind == kind and r.bucket == bucket]
    return row


# --- definitions -------------------------------------------------------------------------------------


def test_size_is_the_buffer_the_gathered_output_or_the_scattered_input() -> None:
    assert message_bytes("all_reduce", 400, 400, 8) == 400
    assert message_bytes("all_to_all", 300, 500, 8) == 300  # uneven splits: what this rank sends
    assert message_bytes("all_gather", 100, 800, 8) == 800
    assert message_bytes("all_gather", 100, None, 8) == 800  # only the input recorded: n x input
    assert message_bytes("all_gather", 100, None, None) is None
    assert message_bytes("reduce_scatter", 800, 100, 8) == 800
    assert message_bytes("reduce_scatter", None, 100, 8) == 800
    assert message_bytes("broadcast", None, None, 8) is None


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == bus_factor("send", 2) == 1.0
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("gather", 8) is None and bus_factor("all_reduce", None) is None


@pytest.mark.parametrize(
    ("size", "bucket"),
    [
        (0, (0, 1, "0 B")),
        (1, (1, 4, "1-4 B")),
        (448, (256, 1024, "256 B-1 KiB")),
        (1024, (1024, 4096, "1-4 KiB")),
        (907_840, (256 << 10, MiB, "256 KiB-1 MiB")),
        (MiB, (MiB, 4 * MiB, "1-4 MiB")),
        (4 * MiB - 1, (MiB, 4 * MiB, "1-4 MiB")),
        (64 * MiB, (64 * MiB, 256 * MiB, "64-256 MiB")),
        (1 << 30, (1 << 30, 4 << 30, "1-4 GiB")),
    ],
)
def test_size_buckets_are_powers_of_4_with_readable_labels(size: int, bucket: tuple[int, int, str]) -> None:
    assert size_bucket(size) == bucket


# --- NCCL: record_param_comms -------------------------------------------------------------------------


def test_nccl_sizes_come_from_record_param_comms_with_its_group_size(tmp_path: Path) -> None:
    trace = parse_trace(nccl_trace(tmp_path / "rank0.json"))
    assert sorted(trace.message_sizes.values(), key=lambda m: m.in_bytes or 0) == [
        MessageSize(in_bytes=100_000_000, out_bytes=800_000_000, group_size=8),
        MessageSize(in_bytes=800_000_000, out_bytes=100_000_000, group_size=8),
        MessageSize(in_bytes=1_000_000_000, out_bytes=1_000_000_000, group_size=8),
    ]
    result = analyze_paths([tmp_path], AnalysisOptions(workers=1))
    (rank,) = result.ranks
    assert [(c.kind, c.bytes, c.group_size) for c in rank.collectives] == [
        ("all_reduce", 1_000_000_000, 8),
        ("all_gather", 800_000_000, 8),
        ("reduce_scatter", 800_000_000, 8),
    ]
    rows = {r.kind: r for r in result.bandwidth}
    assert [(r.kind, r.bucket, r.count, r.group_size) for r in result.bandwidth] == [
        ("all_gather", "256 MiB-1 GiB", 1, 8),
        ("all_reduce", "256 MiB-1 GiB", 1, 8),
        ("reduce_scatter", "256 MiB-1 GiB", 1, 8),
    ]
    assert rows["all_reduce"].algbw_gbps == pytest.approx(100.0)
    assert rows["all_reduce"].busbw_gbps == pytest.approx(175.0)
    assert rows["all_gather"].algbw_gbps == pytest.approx(200.0)
    assert rows["all_gather"].busbw_gbps == pytest.approx(175.0)
    assert rows["reduce_scatter"].algbw_gbps == pytest.approx(100.0)
    assert rows["reduce_scatter"].busbw_gbps == pytest.approx(87.5)
    # One rank: nobody to wait for, so no split and no transfer bandwidth.
    assert all(r.matched == 0 and r.wait_pct is None and r.transfer_busbw_gbps is None for r in result.bandwidth)
    assert result.unsized_collectives == 0


# --- waiting vs transfer ------------------------------------------------------------------------------


def test_wait_is_the_last_arrival_minus_ones_own_on_aligned_clocks() -> None:
    """Rank 1's clock runs 5000 us ahead. Collective 0: rank 0 arrives at 100, rank 1 at 700 (aligned),
    both end at 1100: rank 0 waits 600 of its 1000 us, rank 1 none of its 400. Collective 1 ends together
    too (so the offset is exactly 5000). Collective 2 is a clock outlier: rank 1 arrives (500 aligned)
    after rank 0 has finished (200), so rank 0's wait is clipped to its duration, 100."""
    gb = 400_000_000

    def c(index: int, start: float, end: float, size: int = gb) -> Collective:
        return Collective(1, "all_reduce", index, start, end, bytes=size, group_size=2)

    r0 = _rank(0, [c(0, 100, 1100), c(1, 2000, 2500), c(2, 100, 200, 4000)])
    r1 = _rank(1, [c(0, 5700, 6100), c(1, 7200, 7500), c(2, 5500, 5600, 4000)])
    set_waits([r0, r1], align([r0, r1]))
    waits = {(r.rank, (c.step, c.kind, c.index)): c.late_peer_wait_us for r in (r0, r1) for c in r.collectives}
    assert waits == {
        (0, (1, "all_reduce", 0)): 600.0,
        (1, (1, "all_reduce", 0)): 0.0,
        (0, (1, "all_reduce", 1)): 200.0,
        (1, (1, "all_reduce", 1)): 0.0,
        (0, (1, "all_reduce", 2)): 100.0,
        (1, (1, "all_reduce", 2)): 0.0,
    }
    rows = collective_bandwidth([r0, r1])
    big = _row(rows, "all_reduce", "256 MiB-1 GiB")
    # 4 collectives of 4e8 B: 1000 + 400 + 500 + 300 = 2200 us in all, of which 600 + 200 waiting.
    assert (big.count, big.ranks, big.matched, big.group_size) == (4, 2, 4, 2)
    assert big.time_us == pytest.approx(2200 / 2)
    assert big.wait_us == pytest.approx(800 / 2)
    assert big.transfer_us == pytest.approx(1400 / 2)
    assert big.wait_pct == pytest.approx(100 * 800 / 2200)
    assert big.algbw_gbps == pytest.approx(4 * gb / 2200 / 1e3)  # bytes/us / 1e3 = GB/s
    assert big.busbw_gbps == pytest.approx(4 * gb / 2200 / 1e3)  # 2 (n - 1) / n = 1 for n = 2
    assert big.transfer_algbw_gbps == pytest.approx(4 * gb / 1400 / 1e3)
    small = _row(rows, "all_reduce", "1-4 KiB")
    assert (small.wait_us, small.transfer_us) == (50.0, 50.0)  # rank 0: 100 waiting, 0 moving; rank 1: 0, 100


def test_a_single_rank_or_an_unmatched_collective_has_no_wait() -> None:
    alone = _rank(0, [Collective(1, "all_reduce", 0, 0, 10, bytes=4, group_size=2)])
    set_waits([alone], align([alone]))
    assert alone.collectives[0].late_peer_wait_us is None
    other = _rank(1, [Collective(1, "all_gather", 0, 0, 10, bytes=8, group_size=2)])
    set_waits([alone, other], align([alone, other]))
    rows = collective_bandwidth([alone, other])
    assert [(r.kind, r.matched, r.wait_pct, r.transfer_algbw_gbps) for r in rows] == [
        ("all_gather", 0, None, None),
        ("all_reduce", 0, None, None),
    ]


# --- gloo ---------------------------------------------------------------------------------------------


@pytest.fixture
def gloo_run(tmp_path: Path) -> Path:
    gloo_trace(tmp_path / "rank0.json", rank=0, late_us=0)
    gloo_trace(tmp_path / "rank1.json", rank=1, late_us=500)
    return tmp_path


@pytest.mark.parametrize("chunk", [997, trace_io.CHUNK_BYTES])
def test_gloo_sizes_come_from_the_recorded_shapes(
    monkeypatch: pytest.MonkeyPatch, gloo_run: Path, chunk: int
) -> None:
    monkeypatch.setattr(trace_io, "CHUNK_BYTES", chunk)  # shapes kept across chunk cuts too
    result = analyze_paths([gloo_run], AnalysisOptions(workers=1))
    for rank in result.ranks:
        assert [(c.kind, c.bytes, c.group_size) for c in rank.collectives] == [
            ("all_reduce", 4000, 2),
            ("all_gather", 8000, 2),
            ("reduce_scatter", 4000, 2),
        ]
    assert result.unsized_collectives == 0
    # Rank 1 arrives 500 us late at each: rank 0 waits 500 of its 1000 us, rank 1 none of its 500.
    for row in result.bandwidth:
        assert (row.count, row.matched) == (2, 2)
        assert row.wait_us == pytest.approx(250.0)
        assert row.transfer_us == pytest.approx(500.0)
        assert row.transfer_algbw_gbps == pytest.approx(2 * message_bytes(row.kind, 4000, 8000, 2) / 1000 / 1e3)
    assert [(r.kind, r.bucket) for r in result.bandwidth] == [
        ("all_gather", "4-16 KiB"),
        ("all_reduce", "1-4 KiB"),
        ("reduce_scatter", "1-4 KiB"),
    ]
    text = format_summary(result)
    assert "Collective bandwidth" in text and "--profiler-record-shapes" not in text


def test_gloo_shapes_are_not_read_when_declined(gloo_run: Path) -> None:
    # Without the shapes, the c10d ops and gloo spans give no size (parse_trace(shapes=False)).
    trace = parse_trace(gloo_run / "rank0.json", shapes=False)
    assert trace.message_sizes == {}
    assert len(parse_trace(gloo_run / "rank0.json").message_sizes) == 4  # 2 gloo spans, 2 (output, input) ops


def test_message_sizes_option_is_checked() -> None:
    with pytest.raises(ValueError, match=r"^AnalysisOptions.message_sizes is one of auto, shapes, got 'all'$"):
        AnalysisOptions(message_sizes="all")


def test_committed_gloo_traces_with_shapes_give_the_bandwidth_table() -> None:
    # make_gloo_traces.py records shapes for the DDP scenarios: each gloo:all_reduce span states its bucket.
    for scenario in ("clean", "slow_rank1", "slow_data"):
        raw = []
        for rank in (0, 1):
            events = orjson.loads(gzip.decompress((DATA / scenario / f"rank-{rank}.json.gz").read_bytes()))
            spans = [e for e in events["traceEvents"] if e.get("name") == "gloo:all_reduce"]
            assert all(e["args"]["Input type"] == ["float"] for e in spans)
            raw += [4 * math.prod(e["args"]["Input Dims"][0]) for e in spans]
        result = analyze_paths([DATA / scenario], AnalysisOptions(workers=1))
        (row,) = result.bandwidth
        assert (row.kind, row.group_size, row.count, row.count_per_rank) == ("all_reduce", 2, 24, 12.0)
        assert row.mean_bytes == pytest.approx(sum(raw) / len(raw)) and result.unsized_collectives == 0
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps)  # all_reduce on 2 ranks: 2(n-1)/n = 1
        assert row.transfer_busbw_gbps > row.busbw_gbps  # waiting for the last rank excluded
    # The late rank makes the other one wait in its collectives: most of the time of slow_rank1's.
    slow = analyze_paths([DATA / "slow_rank1"], AnalysisOptions(workers=1)).bandwidth[0]
    assert slow.wait_us / slow.time_us > 0.5


def test_traces_without_shapes_say_how_to_get_the_table(tmp_path: Path) -> None:
    for path in sorted(DATA.glob("fsdp2/rank-*.json.gz")):
        events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        assert not any("Input Dims" in (e.get("args") or {}) for e in events), path
        assert not any(e.get("name") == "record_param_comms" for e in events), path
    result = analyze_paths([DATA / "fsdp2"], AnalysisOptions(workers=1))
    assert result.bandwidth == []
    assert result.unsized_collectives == sum(len(r.collectives) for r in result.ranks) == 36
    assert "36 collective(s), counted on every rank, have no message size" in format_summary(result)
    assert "--profiler-record-shapes" in format_summary(result)
    write_report(result, tmp_path)
    assert "--profiler-record-shapes" in (tmp_path / "report.md").read_text()
    assert orjson.loads((tmp_path / "analysis.json").read_bytes())["bandwidth"] == []


# --- the shared DLRM traces (NCCL, 8 V100s) -----------------------------------------------------------

needs_dlrm = pytest.mark.skipif(not DLRM.is_dir(), reason=f"shared DLRM traces not found at {DLRM.resolve()}")


def _raw_collectives(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """This rank's NCCL kernels in order, each with its kind, k-th of its kind, and the bytes of the
    nccl:* annotation of the same kind and order (its recorded input), read straight from the JSON."""
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_")),
                     key=lambda e: e["ts"])
    annotations = sorted((e for e in events if e.get("name", "").startswith("nccl:")), key=lambda e: e["ts"])
    width = {"float": 4, "int": 4, "long int": 8}
    sizes: dict[str, list[int]] = {}
    for a in annotations:
        (dims,), (dtype,) = a["args"]["Input Dims"], a["args"]["Input type"]
        sizes.setdefault(a["name"][len("nccl:"):], []).append(math.prod(dims) * width[dtype])
    out, seen = [], {"all_reduce": 0, "all_to_all": 0}
    for k in kernels:
        kind = "all_reduce" if k["name"].startswith("ncclKernel_AllReduce") else "all_to_all"
        out.append({"kind": kind, "index": seen[kind], "start": k["ts"], "end": k["ts"] + k["dur"],
                    "bytes": sizes[kind][seen[kind]]})
        seen[kind] += 1
    return doc["distributedInfo"]["rank"], out


@pytest.fixture(scope="module")
def dlrm() -> AnalysisResult:
    # PyTorch of 2023: record_param_comms states no size; the nccl:* annotations' recorded shapes do.
    return analyze_paths([DLRM], AnalysisOptions(workers=2, message_sizes="shapes"))


@needs_dlrm
def test_dlrm_shapes_are_read_only_when_asked_for() -> None:
    """By default NCCL traces are parsed without their (costly) shapes: no size, and a note says how."""
    result = analyze_paths([DLRM], AnalysisOptions(workers=2))
    assert result.bandwidth == []
    assert result.unsized_collectives == 8 * 8
    assert "--message-sizes shapes" in format_summary(result)


@needs_dlrm
def test_dlrm_kinds_counts_and_sizes(dlrm: AnalysisResult) -> None:
    assert dlrm.unsized_collectives == 0
    counts: dict[str, int] = {}
    for row in dlrm.bandwidth:
        counts[row.kind] = counts.get(row.kind, 0) + row.count
        assert row.group_size == 8 and row.ranks == 8 and row.matched == row.count
    assert counts == {"all_reduce": 3 * 8, "all_to_all": 5 * 8}
    raw = dict(_raw_collectives(p) for p in sorted(DLRM.glob("*.pt.trace.json.gz")))
    for rank in dlrm.ranks:
        ours = sorted((c.kind, c.index, c.bytes) for c in rank.collectives)
        assert ours == sorted((c["kind"], c["index"], c["bytes"]) for c in raw[rank.rank])


@needs_dlrm
def test_dlrm_busbw_matches_a_recomputation_from_the_raw_json(dlrm: AnalysisResult) -> None:
    """The 1.5 MB gradient all-reduce: algbw, busbw and transfer busbw from the kernels' times, the
    nccl:all_reduce annotations' shapes, and clocks aligned on the collectives' end times."""
    raw = dict(_raw_collectives(p) for p in sorted(DLRM.glob("*.pt.trace.json.gz")))
    keyed = {rank: {(c["kind"], c["index"]): c for c in cs} for rank, cs in raw.items()}
    offsets = {r: median(keyed[r][k]["end"] - keyed[0][k]["end"] for k in keyed[0]) for r in keyed}
    same = {r: keyed[r][("all_reduce", 0)] for r in keyed}
    assert {c["bytes"] for c in same.values()} == {394_241 * 4}
    last = max(c["start"] - offsets[r] for r, c in same.items())
    waits = {r: min(max(last - (c["start"] - offsets[r]), 0), c["end"] - c["start"]) for r, c in same.items()}
    # The all-reduce completed at the first rank's end: a rank's kernel time past that (microseconds here) moves no
    # bytes either.
    done = min(c["end"] - offsets[r] for r, c in same.items())
    lags = {r: min(max(0.0, c["end"] - offsets[r] - max(done, c["start"] - offsets[r])),
                   c["end"] - c["start"] - waits[r]) for r, c in same.items()}
    size = sum(c["bytes"] for c in same.values())
    time = sum(c["end"] - c["start"] for c in same.values())
    row = _row(dlrm.bandwidth, "all_reduce", "1-4 MiB")
    assert row.count == 8
    assert row.algbw_gbps == pytest.approx(size / time / 1e3)
    assert row.busbw_gbps == pytest.approx(size / time / 1e3 * 2 * 7 / 8)
    assert done >= last and 0 < sum(lags.values()) < 0.1 * time
    moving = time - sum(waits.values()) - sum(lags.values())
    assert row.transfer_busbw_gbps == pytest.approx(size / moving / 1e3 * 2 * 7 / 8)
    assert row.wait_us == pytest.approx(sum(waits.values()) / 8)
