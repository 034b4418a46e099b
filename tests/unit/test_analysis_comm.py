"""Communication by collective kind and FSDP unit: kinds, issuing unit and phase, exposed time, findings.

Hand-written traces give exact expected numbers (CPU/gloo and GPU/NCCL, both NCCL kernel naming schemes);
the committed 2-rank FSDP2 and DDP gloo traces (tests/data/make_gloo_traces.py) check real FSDP2 output,
and the shared 8-GPU DLRM traces check the per-kind exposed time against HTA's overlap figure.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_summary
from hf_distprof.analysis.rank.exposure import SpanIndex, fsdp_context, unit_of
from hf_distprof.analysis.tell.report import write_report

DATA = Path(__file__).resolve().parents[1] / "data"
DLRM = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "dlrm_8gpu_v100"
MAIN, WORKER, AUTOGRAD = 1, 2, 3


def _span(name: str, ts: float, end: float, tid: int = MAIN, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": end - ts}


def _op(name: str, ts: float, end: float, tid: int = MAIN) -> dict[str, Any]:
    return _span(name, ts, end, tid, cat="cpu_op")


def _write(path: Path, events: list[dict[str, Any]], backend: str, world: int = 2) -> Path:
    info = {"rank": 0, "world_size": world, "backend": backend}
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": info}))
    return path


def cpu_trace(path: Path, world: int = 2) -> Path:
    """One 1000 us step on gloo: three all-gathers, a reduce-scatter (FSDP2) and a plain all-reduce.

    - layers.0 forward all-gather [140, 280]: the thread waits in FSDP::all_gather the whole time (140 exposed);
    - layers.1 forward all-gather [450, 550]: the thread computes (aten::mm) until 520, then waits in
      wait_tensor: 30 exposed of 100;
    - layers.1 backward all-gather [620, 680]: waited on, 60 exposed;
    - layers.1 reduce-scatter [775, 875] (runs as gloo:all_reduce): waited on, 100 exposed;
    - an all-reduce outside FSDP [920, 960]: the thread sits idle (a gap) while it runs, 40 exposed.
    """
    return _write(
        path,
        [
            _span("ProfilerStep#1", 0, 1000),
            _span("FSDP::pre_forward (layers.0)", 100, 400),
            _span("FSDP::all_gather (layers.0)", 110, 300),
            _op("fsdp::all_gather_copy_in", 112, 118),
            _op("c10d::_allgather_base_", 120, 130),
            _span("gloo:all_gather", 140, 280, WORKER),
            _span("FSDP::all_gather_copy_out (layers.0)", 300, 305),
            _op("aten::mm", 310, 390),
            _span("FSDP::pre_forward (layers.1)", 420, 600),
            _span("FSDP::all_gather (layers.1)", 420, 445),
            _op("c10d::_allgather_base_", 430, 440),
            _span("gloo:all_gather", 450, 550, WORKER),
            _op("aten::mm", 445, 520),
            _op("_c10d_functional::wait_tensor", 520, 560),
            _span("FSDP::pre_backward (layers.1)", 600, 700),
            _span("FSDP::all_gather (layers.1)", 605, 690),
            _op("c10d::_allgather_base_", 610, 615),
            _span("gloo:all_gather", 620, 680, WORKER),
            _span("FSDP::post_backward_reduce (layers.1)", 750, 900),
            _op("fsdp::chunk_cat", 752, 760),
            _op("c10d::_reduce_scatter_base_", 760, 770),
            _span("gloo:all_reduce", 775, 875, WORKER),
            _op("c10d::allreduce_", 910, 915),
            _span("gloo:all_reduce", 920, 960, WORKER),
        ],
        "gloo",
        world,
    )


def _kernel(name: str, ts: float, end: float, corr: int, stream: int) -> dict[str, Any]:
    return {**_span(name, ts, end, tid=stream, cat="kernel"), "args": {"stream": stream, "correlation": corr}}


def _launch(ts: float, corr: int, tid: int = MAIN) -> dict[str, Any]:
    return {**_span("cudaLaunchKernel", ts, ts + 2, tid, cat="cuda_runtime"), "args": {"correlation": corr}}


def gpu_trace(path: Path) -> Path:
    """One step on NCCL: an all-gather (new kernel naming) launched in FSDP's forward, 150 of its 200 us under
    a GEMM; a reduce-scatter (old naming) launched from the autograd thread in FSDP's backward, 30 of 100
    hidden; an all-to-all that runs as a SendRecv kernel under nccl:all_to_all, not hidden at all."""
    return _write(
        path,
        [
            _span("ProfilerStep#1", 0, 1000),
            _span("FSDP::pre_forward (layers.0)", 50, 90),
            _span("FSDP::all_gather (layers.0)", 55, 70),
            _launch(52, 1),
            _launch(60, 2),
            _kernel("void gemm_kernel<float>(float*)", 100, 300, 1, 7),
            _kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 150, 350, 2, 20),
            _span("FSDP::post_backward_reduce (layers.0)", 510, 530, AUTOGRAD),
            _launch(500, 4, AUTOGRAD),
            _launch(520, 3, AUTOGRAD),
            _kernel("ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)", 600, 700, 3, 20),
            _kernel("void elementwise_kernel<float>(float*)", 650, 680, 4, 7),
            _span("nccl:all_to_all", 750, 770),
            _launch(760, 5),
            _kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 800, 900, 5, 21),
        ],
        "nccl",
    )


def _rows(result: AnalysisResult) -> dict[str, tuple[float, float, float, float, float, list[str]]]:
    return {
        r.kind: (r.count_per_step, r.time_us, r.exposed_us, r.forward_exposed_us, r.backward_exposed_us, r.kinds)
        for r in result.ranks[0].comm_by_kind
    }


def test_cpu_collectives_by_kind_unit_phase_and_exposed_time(tmp_path: Path) -> None:
    result = analyze_paths([cpu_trace(tmp_path / "rank0.json")], AnalysisOptions(workers=1))
    (rank,) = result.ranks
    got = [(c.kind, c.module, c.phase, c.duration_us, c.exposed_us) for c in rank.collectives]
    assert got == [
        ("all_gather", "layers.0", "forward", 140, 140),
        ("all_gather", "layers.1", "forward", 100, 30),
        ("all_gather", "layers.1", "backward", 60, 60),
        ("reduce_scatter", "layers.1", "backward", 100, 100),
        ("all_reduce", None, None, 40, 40),
    ]
    # Per kind, each collective's share of the step's communication: its exposed time plus the enqueue that issued
    # it (c10d::* ops: 10 + 10 + 5 for the all-gathers, 10 for the reduce-scatter, 5 for the all-reduce), so that the
    # rows add up to the step's communication (410, test below); time is the union of the spans and those enqueues.
    assert _rows(result) == {
        "all_gather": (3, 325, 255, 190, 65, ["all_gather"]),
        "reduce_scatter": (1, 110, 110, 0, 110, ["reduce_scatter"]),
        "all_reduce": (1, 45, 45, 0, 0, ["all_reduce"]),
    }
    assert [r.kind for r in rank.comm_by_kind] == ["all_gather", "reduce_scatter", "all_reduce"]
    ag = rank.comm_by_kind[0]
    assert ag.exposed_pct == pytest.approx(25.5) and ag.exposed_pct_median == pytest.approx(25.5)
    assert ag.overlap_pct == pytest.approx(100 * 70 / 325)
    assert sum(r.exposed_pct for r in rank.comm_by_kind) == pytest.approx(rank.exposed_comm_pct) == 41.0
    # One rank: nobody to wait for; every exposed microsecond is the collectives' own.
    assert all(r.wait_us == 0.0 and r.transfer_us == r.exposed_us for r in rank.comm_by_kind)


def test_cpu_breakdown_counts_fsdp_waits_as_communication(tmp_path: Path) -> None:
    result = analyze_paths([cpu_trace(tmp_path / "rank0.json")], AnalysisOptions(workers=1))
    cpu = result.ranks[0].steps[0].cpu
    # Enqueues (10 + 10 + 5 + 10 + 5) + waits with a collective in flight (140 + 30 + 60 + 100) + the idle 40.
    assert cpu.communication_us == pytest.approx(410)
    assert cpu.compute_us + cpu.communication_us + cpu.data_loading_us + cpu.other_us == pytest.approx(1000)
    # Compute: what the enclosing ops cover outside the waits' self time and the enqueues. pre_forward
    # (layers.0) [100, 400] less [110, 112] and [118, 300] = 10 + 6 (the nested copy-in) + 100; pre_forward
    # (layers.1) and pre_backward, merged as [420, 700], less [420, 445], [520, 560] and [605, 690]
    # = 75 + 45 + 10; the chunk-cat nested in the reduce's wait, 8. 116 + 130 + 8 = 254.
    assert cpu.compute_us == pytest.approx(254)
    # Other: wait self time with nothing in flight (2 + 2 + 10 + 20, 10 + 5, 10, 5 + 5 + 10, 2 + 5 + 25) and
    # gaps with nothing in flight (0-100, 400-420, 700-750, 900-910, 915-920, 960-1000): 111 + 225.
    assert cpu.other_us == pytest.approx(336)


def test_gpu_collectives_by_kind_with_both_nccl_namings(tmp_path: Path) -> None:
    result = analyze_paths([gpu_trace(tmp_path / "rank0.json")], AnalysisOptions(workers=1))
    (rank,) = result.ranks
    assert rank.device == "gpu"
    got = [(c.kind, c.module, c.phase, c.duration_us, c.exposed_us) for c in rank.collectives]
    assert got == [
        ("all_gather", "layers.0", "forward", 200, 50),
        ("reduce_scatter", "layers.0", "backward", 100, 70),
        ("all_to_all", None, None, 100, 100),
    ]
    assert _rows(result) == {
        "all_gather": (1, 200, 50, 50, 0, ["all_gather"]),
        "reduce_scatter": (1, 100, 70, 0, 70, ["reduce_scatter"]),
        "other": (1, 100, 100, 0, 0, ["all_to_all"]),
    }
    # Shares of the step's GPU span (HTA's basis): the first kernel starts at 100, the last ends at 900.
    assert rank.comm_by_kind[0].exposed_pct == pytest.approx(100 * 50 / 800)


def test_unit_table_and_fsdp_findings_on_the_hand_written_cpu_trace(tmp_path: Path) -> None:
    # A 1-rank world: its waits are its own. (One rank of a larger world, alone, has its FSDP findings withheld: its
    # wait for the others inside the all-gathers cannot be told from the transfer.)
    alone = analyze_paths([cpu_trace(tmp_path / "rank0.json")], AnalysisOptions(workers=1))
    assert [u.question for u in alone.undecided] == ["communication_bound", "fsdp_exposed_all_gather",
                                                      "fsdp_exposed_reduce_scatter", "what_if"]
    assert alone.unread_ranks == [1] and not alone.findings
    result = analyze_paths([cpu_trace(tmp_path / "rank0.json", world=1)], AnalysisOptions(workers=1))
    units = [(u.module, u.kind, u.phase, u.count_per_step, u.time_us, u.exposed_us) for u in result.comm_by_module]
    assert units == [
        ("layers.0", "all_gather", "forward", 1, 150, 150),  # with its enqueue, as in the per-kind table
        ("layers.1", "reduce_scatter", "backward", 1, 110, 110),
        ("layers.1", "all_gather", "backward", 1, 65, 65),
        ("layers.1", "all_gather", "forward", 1, 110, 40),
    ]
    by_kind = {f.kind: f for f in result.findings}
    ag = by_kind["fsdp_exposed_all_gather"]
    assert ag.title == "Exposed FSDP all-gather before forward"  # 190 us in forward, 65 in backward
    assert ag.numbers["exposed_pct"] == pytest.approx(25.5)
    assert "most exposed unit: layers.0 (forward, 0.15 ms per step)" in ag.evidence
    # The reduce-scatter's 11% is above the default 10% threshold; at 12% neither it nor the all-gather's 25.5% at
    # 26% is a finding.
    rs = by_kind["fsdp_exposed_reduce_scatter"]
    assert rs.numbers["exposed_pct"] == pytest.approx(11.0) and rs.ranks == [0]
    assert "0.0% of it hidden behind backward" in rs.evidence
    quiet = analyze_paths([tmp_path / "rank0.json"], AnalysisOptions(workers=1, fsdp_exposed_pct=26))
    assert not {"fsdp_exposed_all_gather", "fsdp_exposed_reduce_scatter"} & {f.kind for f in quiet.findings}
    only_ag = analyze_paths([tmp_path / "rank0.json"], AnalysisOptions(workers=1, fsdp_exposed_pct=12))
    assert [f.kind for f in only_ag.findings if f.kind.startswith("fsdp")] == ["fsdp_exposed_all_gather"]


def test_text_json_and_report_show_the_kinds(tmp_path: Path) -> None:
    result = analyze_paths([cpu_trace(tmp_path / "rank0.json")], AnalysisOptions(workers=1))
    text = format_summary(result)
    # Each percentage column names its base: exp/late-peer %step of the step, hid %busy of the busy time; FSDP's
    # forward/backward columns because FSDP issued these collectives.
    assert ("rank kind             calls  busy ms   exp ms late-peer ms exp %step late-peer %step hid %busy  fwd exp  "
            "bwd exp" in text)
    # (One rank of two read: its wait for rank 1 cannot be told from the transfer, so the late-peer columns say n/a.)
    assert ("   0 all_gather         3.0     0.33     0.26          n/a      25.5             n/a      21.5     "
            "0.19     0.07" in text)
    assert ("mean reduce_scatter     1.0     0.11     0.11          n/a      11.0             n/a       0.0     "
            "0.00     0.11" in text)
    # The rows add up to the headline's exposed communication.
    assert "exposed %step per rank (its rows added up; the headline's figure): rank 0 41.0%" in text
    assert "Headline: exposed communication 41.0% of step time" in text
    assert "layers.0                     all_gather      forward      1.0      0.15       0.15" in text
    data = orjson.loads(result.to_json())
    assert [(r["kind"], r["exposed_us"]) for r in data["comm_by_kind"]] == [
        ("all_gather", 255), ("reduce_scatter", 110), ("all_reduce", 45)
    ]
    assert data["ranks"][0]["comm_by_kind"][0]["hidden_pct"] == pytest.approx(100 * 70 / 325)
    assert data["comm_by_module"][0] == {
        "module": "layers.0", "kind": "all_gather", "phase": "forward", "count_per_step": 1.0, "time_us": 150.0,
        "exposed_us": 150.0,
    }
    html = write_report(result, tmp_path / "report").read_text()
    assert "<h2>Communication by collective kind</h2>" in html
    assert ("<tr><td>all_gather (all_gather)</td><td>3.0</td><td>0.33</td><td>0.26</td><td>n/a</td><td>25.5</td>"
            "<td>n/a</td><td>21.5</td>") in html


def test_unit_names_and_phases() -> None:
    assert unit_of("FSDP::all_gather (model.layers.3)") == "model.layers.3"
    assert unit_of("FSDP::all_gather") == ""  # the root
    assert unit_of("FSDP::post_backward_reduce (a.b)") == "a.b"
    assert unit_of("FSDP::all_gather_copy_out (a)") is None
    assert unit_of("FSDP::pre_forward (a)") is None
    spans = sorted([
        (0.0, 100.0, "FSDP::pre_backward (a)"),
        (10.0, 50.0, "FSDP::backward_prefetch for b"),
        (20.0, 40.0, "FSDP::all_gather (b)"),
        (60.0, 90.0, "FSDP::pre_forward (c)"),  # another thread, overlapping in time
    ])
    index = SpanIndex(spans)
    assert fsdp_context(index, 30) == ("b", "backward")
    assert fsdp_context(index, 70) == (None, "forward")  # innermost hook wins
    assert fsdp_context(index, 150) == (None, None)


@pytest.fixture(scope="module")
def committed() -> dict[str, AnalysisResult]:
    return {name: analyze_paths([DATA / name], AnalysisOptions(workers=1)) for name in ("fsdp2", "clean")}


def test_real_fsdp2_trace_names_every_unit_and_kind(committed: dict[str, AnalysisResult]) -> None:
    result = committed["fsdp2"]
    assert result.cross_rank is not None and result.cross_rank.matched_collectives == 18
    for rank in result.ranks:
        for step in (2, 3):
            mine = sorted((c.kind, c.module, c.phase) for c in rank.collectives if c.step == step)
            units = ("net.0", "net.2", "net.4")
            assert mine == sorted(
                [("all_gather", unit, phase) for unit in units for phase in ("forward", "backward")]
                + [("reduce_scatter", unit, "backward") for unit in units]
            )
        rows = {r.kind: r for r in rank.comm_by_kind}
        assert sorted(rows) == ["all_gather", "reduce_scatter"]
        assert rows["all_gather"].count_per_step == 6 and rows["reduce_scatter"].count_per_step == 3
        # On gloo the training thread waits out every FSDP collective.
        for row in rows.values():
            assert row.exposed_us == pytest.approx(row.time_us, rel=0.05)
    assert {(u.module, u.kind, u.phase) for u in result.comm_by_module} == {
        (unit, "all_gather", phase) for unit in ("net.0", "net.2", "net.4") for phase in ("forward", "backward")
    } | {(unit, "reduce_scatter", "backward") for unit in ("net.0", "net.2", "net.4")}


def test_ddp_trace_has_all_reduce_only_and_no_fsdp_finding(committed: dict[str, AnalysisResult]) -> None:
    result = committed["clean"]
    for rank in result.ranks:
        assert [(r.kind, r.count_per_step) for r in rank.comm_by_kind] == [("all_reduce", 2)]
        assert all(c.module is None and c.phase is None for c in rank.collectives)
    assert result.comm_by_module == []
    assert not [f for f in result.findings if f.kind.startswith("fsdp_")]
    assert "FSDP collectives per unit" not in format_summary(result)


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"shared DLRM traces not found at {DLRM.resolve()}")
def test_dlrm_kinds_and_exposed_time_match_htas_overlap() -> None:
    result = analyze_paths([DLRM], AnalysisOptions(workers=2))
    ref = {}
    with open(DLRM / "hta_reference" / "comm_comp_overlap.csv", newline="") as fh:
        ref = {int(row["rank"]): float(row["comp_comm_overlap_pctg"]) for row in csv.DictReader(fh)}
    for rank in result.ranks:
        rows = {r.kind: r for r in rank.comm_by_kind}
        assert sorted(rows) == ["all_reduce", "other"]
        assert rows["other"].kinds == ["all_to_all"]  # SendRecv kernels, named by their nccl:all_to_all
        assert rows["other"].count_per_step == 5 and rows["all_reduce"].count_per_step == 3
        # Per-collective exposure adds up to HTA's: comm time not overlapped with compute (one step here).
        time = sum(r.time_us for r in rows.values())
        exposed = sum(r.exposed_us for r in rows.values())
        assert 100 * (1 - exposed / time) == pytest.approx(ref[rank.rank], abs=0.5)
