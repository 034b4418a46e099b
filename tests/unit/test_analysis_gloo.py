"""CPU/gloo analysis on the committed 2-rank traces (tests/data/make_gloo_traces.py wrote them)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from hf_distprof.analysis import AnalysisOptions, AnalysisResult, analyze_paths, format_findings
from hf_distprof.analysis.events import parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def results() -> dict[str, AnalysisResult]:
    return {
        name: analyze_paths([DATA / name], AnalysisOptions(workers=1))
        for name in ("clean", "slow_rank1", "slow_data")
    }


@pytest.mark.parametrize("scenario", ["clean", "slow_rank1", "slow_data"])
def test_parse_keeps_exact_counts(scenario: str) -> None:
    for rank in (0, 1):
        path = DATA / scenario / f"rank-{rank}.json.gz"
        doc = orjson.loads(gzip.decompress(path.read_bytes()))
        events = doc["traceEvents"]
        trace = parse_trace(path)
        assert trace.rank == rank and trace.world_size == 2 and trace.backend == "gloo"
        assert trace.n_events == len(events)
        assert [s.number for s in trace.steps] == [2, 3, 4, 5, 6, 7]
        gloo = [e for e in events if e.get("ph") == "X" and e["name"].startswith("gloo:")]
        assert len(trace.comm_spans) == len(gloo) == 12
        assert [n for _, _, n in trace.c10d_ops] == ["c10d::allreduce_"] * 12
        assert len(trace.gpu) == 0


def test_cpu_breakdown_adds_up_to_the_step(results: dict[str, AnalysisResult]) -> None:
    for result in results.values():
        for rank in result.ranks:
            assert rank.device == "cpu"
            for s in rank.steps:
                c = s.cpu
                parts = c.compute_us + c.communication_us + c.data_loading_us + c.other_us
                assert parts == pytest.approx(s.duration_us)
                assert s.n_collectives == 2
                assert c.comm_backward_overlap_pct is not None and 0 <= c.comm_backward_overlap_pct <= 100


def test_slow_rank_is_named_not_the_waiting_one(results: dict[str, AnalysisResult]) -> None:
    result = results["slow_rank1"]
    cross = result.cross_rank
    assert cross is not None and cross.matched_collectives == 12
    assert [s.rank for s in cross.stragglers] == [1]
    late = {p.rank: p.lateness_us for p in cross.per_rank}
    assert late[0] == 0.0 and late[1] is not None and late[1] > 25_000  # rank 1 sleeps 30 ms per step
    wait = {p.rank: p.comm_wait_us for p in cross.per_rank}
    assert wait[0] > 25_000 > wait[1]  # the fast rank is the one that waits
    kinds = [f.kind for f in result.findings]
    assert kinds[0] == "straggler" and result.findings[0].ranks == [1]
    assert "imbalance" in kinds and result.imbalance_pct > 50
    assert "rank 1" in format_findings(result)


def test_clean_run_raises_no_alarm(results: dict[str, AnalysisResult]) -> None:
    result = results["clean"]
    assert result.findings == []
    assert result.cross_rank is not None and result.cross_rank.stragglers == []
    assert result.imbalance_pct < 10
    assert "No finding" in format_findings(result)
    # Both questions were asked and answered "no", each with the evidence why.
    verdicts = (result.cross_rank.straggler_verdict, result.cross_rank.imbalance_verdict)
    assert [v.status for v in verdicts] == ["quiet", "quiet"] and all(v.steps == 6 for v in verdicts)
    assert result.undecided == []


def test_slow_data_loader_is_the_only_finding(results: dict[str, AnalysisResult]) -> None:
    result = results["slow_data"]
    assert [f.kind for f in result.findings] == ["data_loading_bound"]
    assert result.findings[0].ranks == [0, 1]
    for rank in result.ranks:
        for s in rank.steps:
            assert s.cpu.data_loading_us > 25_000  # the loader sleeps 30 ms per batch


def test_thresholds_are_options() -> None:
    strict = analyze_paths([DATA / "clean"], AnalysisOptions(workers=1, comm_bound_pct=1.0))
    assert {f.kind for f in strict.findings} == {"communication_bound"}
    lax = analyze_paths(
        [DATA / "slow_rank1"], AnalysisOptions(workers=1, straggler_pct=100, imbalance_pct=1000)
    )
    assert {"straggler", "imbalance"}.isdisjoint({f.kind for f in lax.findings})


def test_result_serialises_to_json(results: dict[str, AnalysisResult]) -> None:
    data = orjson.loads(results["slow_rank1"].to_json())
    assert data["imbalance_pct"] == pytest.approx(results["slow_rank1"].imbalance_pct)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["findings"][0]["kind"] == "straggler"
