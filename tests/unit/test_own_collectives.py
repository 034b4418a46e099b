"""hf_distprof's own collectives are not the user's: a collective issued inside a ``hf_distprof/ours ...`` range on the
training thread (:func:`hf_distprof.dist.ours`) is left out of the user's collectives, communication, per-kind
tables, waits and what-if, and named once as ours.

Hand-written 2-rank gloo traces give exact numbers: each of steps 8-10 (200 ms) holds the user's all-gather and
all-reduce, then, in the "ours" traces, a blocking gather of ours (two all-gathers and the packing between them inside
one range, as ``all_gather_object`` does) and an async one (``all_gather_floats_async``: its gloo span runs on after
its range, while the training thread computes). The same traces without our events must give the same analysis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from hf_distprof import dist
from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_summary
from hf_distprof.analysis.rank.cpu import OURS_PREFIX
from hf_distprof.analysis.read import compact

MAIN, GLOO_A, GLOO_B = 1, 2, 3
STEP_US = 200_000.0
STEPS = 3
MS = 1_000.0


def _span(name: str, ts: float, end: float, tid: int = MAIN, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": end - ts}


def _op(name: str, ts: float, end: float) -> dict[str, Any]:
    return _span(name, ts, end, cat="cpu_op")


def rank_trace(path: Path, rank: int, ours: bool, drop_op: bool = False) -> Path:
    """Steps 8-10: load 10 ms (rank 1: 15 ms), the user's all-gather (until 22 ms), compute to 100 ms, the user's
    all-reduce (in flight to 130 ms, waited for), the optimizer to 150 ms; with ``ours``: our blocking gather at
    150-160 ms (all-gathers in flight 150.6-154 and 155.1-159 ms, packing 154.5-155 ms), our async gather issued at
    165.05 ms (range 165-165.3 ms, in flight 165.25-172 ms under the user's compute at 166-185 ms). ``drop_op``: step
    9 loses the c10d op of our first all-gather, so that its ops and gloo spans cannot be paired."""
    events = []
    for k in range(STEPS):
        t = k * STEP_US
        arrive = t + (15 if rank else 10) * MS
        events += [
            _span(f"ProfilerStep#{k + 8}", t, t + STEP_US),
            _span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, arrive),
            _op("c10d::_allgather_base_", arrive, arrive + 100),
            _span("gloo:all_gather", arrive + 100, t + 22 * MS, GLOO_A),
            _op("aten::mm", t + 22 * MS, t + 100 * MS),
            _op("c10d::allreduce_", t + 100 * MS, t + 100.1 * MS),
            _span("gloo:all_reduce", t + 100.1 * MS, t + 130 * MS, GLOO_A),
            _op("aten::add_", t + 130 * MS, t + 150 * MS),
            _op("aten::mul_", t + 166 * MS, t + 185 * MS),
        ]
        if ours:
            if not (drop_op and k == 1):
                events.append(_op("c10d::allgather_", t + 150.5 * MS, t + 150.6 * MS))
            events += [
                _span(f"{OURS_PREFIX} all_gather_object", t + 150 * MS, t + 160 * MS),
                _span("gloo:all_gather", t + 150.6 * MS, t + 154 * MS, GLOO_B),
                _op("aten::cat", t + 154.5 * MS, t + 155 * MS),
                _op("c10d::allgather_", t + 155 * MS, t + 155.1 * MS),
                _span("gloo:all_gather", t + 155.1 * MS, t + 159 * MS, GLOO_A),
                _span(f"{OURS_PREFIX} all_gather_floats_async", t + 165 * MS, t + 165.3 * MS),
                _op("c10d::allgather_", t + 165.05 * MS, t + 165.2 * MS),
                _span("gloo:all_gather", t + 165.25 * MS, t + 172 * MS, GLOO_B),
            ]
    info = {"rank": rank, "world_size": 2, "backend": "gloo"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": info}))
    return path


def two_ranks(folder: Path, ours: bool, drop_op: bool = False) -> list[Path]:
    return [rank_trace(folder / f"rank-{r}.json", r, ours, drop_op) for r in (0, 1)]


def _without_ours(result_dict: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The result as JSON, with its folder's name, the event counts and our collectives taken out."""
    out = json.loads(json.dumps(result_dict).replace(str(folder), "FOLDER"))
    for rank in out["ranks"]:
        rank.pop("n_events")
        for step in rank["steps"]:
            step.pop("own_collectives")
    return out


def test_our_collectives_are_left_out_of_the_users_and_named_once_as_ours(tmp_path: Path) -> None:
    options = AnalysisOptions(workers=1)
    plain = analyze_paths(two_ranks(tmp_path / "plain", ours=False), options)
    with_ours = analyze_paths(two_ranks(tmp_path / "ours", ours=True), options)
    # Our three all-gathers per step are ours, numbered among ours; the user's one per step is the user's.
    for rank in with_ours.ranks:
        assert [(c.step, c.kind, c.index) for c in rank.collectives if c.kind == "all_gather"] == [
            (8, "all_gather", 0), (9, "all_gather", 0), (10, "all_gather", 0)]
        for step in rank.steps:
            assert step.n_collectives == 2
            assert [(c.kind, c.index, c.start_us - (step.step - 8) * STEP_US, c.duration_us)
                    for c in step.own_collectives] == [
                ("all_gather", 0, 150.6 * MS, pytest.approx(3.4 * MS)),
                ("all_gather", 1, 155.1 * MS, pytest.approx(3.9 * MS)),
                ("all_gather", 2, 165.25 * MS, pytest.approx(6.75 * MS))]
        assert [(row.kind, row.count_per_step) for row in rank.comm_by_kind] == [("all_gather", 1.0),
                                                                                  ("all_reduce", 1.0)]
    # Everything else is what the same traces give without our events: the training thread's time in our ranges is
    # other (not communication, not compute), our gloo spans are not communication in flight, and no table, wait,
    # bandwidth row or what-if counts them.
    assert _without_ours(with_ours.to_dict(), tmp_path / "ours") == _without_ours(plain.to_dict(), tmp_path / "plain")
    step = with_ours.ranks[0].steps[0].cpu
    assert (step.communication_us, step.compute_us, step.comm_busy_us) == pytest.approx(
        (0.1 * MS + 11.9 * MS + 0.1 * MS + 29.9 * MS, 78 * MS + 20 * MS + 19 * MS, 12 * MS - 100 + 29.9 * MS))
    # Named once, in the text: 3 all-gathers per step over 3 steps per rank, 14.05 ms in flight per step.
    text, plain_text = format_summary(with_ours), format_summary(plain)
    line = "hf-distprof's own collectives left out: 9 all_gather per rank in the traced steps (42.15 ms in flight " \
           "per rank)"
    assert line in text.splitlines() and "own collectives" not in plain_text
    assert text.replace(line + "\n", "") == plain_text


def test_the_compact_files_give_the_same_own_collectives(tmp_path: Path) -> None:
    traces = two_ranks(tmp_path / "ours", ours=True)
    from_json = analyze_paths(traces, AnalysisOptions(workers=1)).to_dict()
    for trace in traces:
        compact.write_compact(trace)
        assert compact.load_compact(trace) is not None
    assert analyze_paths(traces, AnalysisOptions(workers=1)).to_dict() == from_json
    assert len(from_json["ranks"][0]["steps"][0]["own_collectives"]) == 3


def test_an_unpaired_gloo_span_that_starts_in_our_range_is_ours(tmp_path: Path) -> None:
    # Step 9 lost the c10d op of our first all-gather: that span, with no op of its own, goes by its start (inside our
    # range); the next ones still pair with theirs, and the user's all-gather of the step keeps its op (ours are
    # paired apart, so a count of ours that does not add up never takes the user's issue times away).
    result = analyze_paths(two_ranks(tmp_path, ours=True, drop_op=True), AnalysisOptions(workers=1))
    for rank in result.ranks:
        assert [len(s.own_collectives) for s in rank.steps] == [3, 3, 3]
        assert [c.issued_us is None for c in rank.steps[1].own_collectives] == [True, False, False]
        assert [(row.kind, row.count_per_step) for row in rank.comm_by_kind] == [("all_gather", 1.0),
                                                                                  ("all_reduce", 1.0)]
        nine = [c for c in rank.collectives if c.step == 9 and c.kind == "all_gather"]
        assert [c.issued_us for c in nine] == [STEP_US + (15 if rank.rank else 10) * MS]


def test_an_async_gather_of_ours_that_starts_in_the_next_step_is_ours(tmp_path: Path) -> None:
    # Seen in a real run: our async gather is issued at the very end of a step, and its gloo span starts in the next
    # one, after our range has closed. Paired with its op over the whole trace, it is still ours, and neither step's
    # user all-gather loses its op.
    for rank in (0, 1):
        path = rank_trace(tmp_path / f"rank-{rank}.json", rank, ours=False)
        trace = orjson.loads(path.read_bytes())
        end = STEP_US - 0.3 * MS  # step 8's end, less our range
        trace["traceEvents"] += [
            _span(f"{OURS_PREFIX} all_gather_floats_async", end, end + 0.2 * MS),
            _op("c10d::allgather_", end + 0.05 * MS, end + 0.15 * MS),
            _span("gloo:all_gather", STEP_US + 0.5 * MS, STEP_US + 2 * MS, GLOO_B),
        ]
        path.write_bytes(orjson.dumps(trace))
    result = analyze_paths(sorted(tmp_path.glob("rank-*.json")), AnalysisOptions(workers=1))
    for rank in result.ranks:
        assert [[(c.kind, c.start_us, c.issued_us) for c in s.own_collectives] for s in rank.steps] == [
            [], [("all_gather", STEP_US + 0.5 * MS, STEP_US - 0.25 * MS)], []]
        assert all(c.issued_us is not None for c in rank.collectives)
        assert [(row.kind, row.count_per_step) for row in rank.comm_by_kind] == [("all_gather", 1.0),
                                                                                  ("all_reduce", 1.0)]


def test_the_training_side_and_the_analysis_spell_our_ranges_alike() -> None:
    assert dist.OURS_PREFIX == OURS_PREFIX == "hf_distprof/ours"


def _kernel(name: str, ts: float, end: float, corr: int, stream: int) -> dict[str, Any]:
    return {**_span(name, ts, end, tid=stream, cat="kernel"), "args": {"stream": stream, "correlation": corr}}


def _launch(ts: float, corr: int) -> dict[str, Any]:
    return {**_span("cudaLaunchKernel", ts, ts + 2, cat="cuda_runtime"), "args": {"correlation": corr}}


def gpu_trace(path: Path, rank: int, ours: bool, shift: float) -> Path:
    """Two 1000 us steps on NCCL: a GEMM and the user's all-reduce, half hidden under it; with ``ours``, our
    all-gather (launched inside our range at the step's end) runs alone after them, 100 us, all of it exposed.
    ``shift`` (0.5) makes the times floats: the analysis' pure Python path instead of its int64 columns (and the
    kernels' ends and starts round inward, HTA's way: 1 us less each)."""
    events = []
    for k in range(2):
        t = k * 1000 + shift
        corr = 10 * k
        events += [
            _span(f"ProfilerStep#{k + 1}", t, t + 1000),
            _launch(t + 10, corr + 1),
            _launch(t + 20, corr + 2),
            _kernel("void gemm_kernel<float>(float*)", t + 100, t + 300, corr + 1, 7),
            _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 200, t + 400,
                    corr + 2, 20),
        ]
        if ours:
            events += [
                _span(f"{OURS_PREFIX} all_gather_floats_async", t + 500, t + 520),
                _launch(t + 505, corr + 3),
                _kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 600, t + 700,
                        corr + 3, 20),
            ]
    info = {"rank": rank, "world_size": 2, "backend": "nccl"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"traceEvents": events, "distributedInfo": info}))
    return path


@pytest.mark.parametrize("shift", [0, 0.5])
def test_an_nccl_kernel_launched_in_our_range_is_ours(tmp_path: Path, shift: float) -> None:
    options = AnalysisOptions(workers=1)
    results = {}
    for name, ours in (("plain", False), ("ours", True)):
        traces = [gpu_trace(tmp_path / name / f"rank-{r}.json", r, ours, shift) for r in (0, 1)]
        results[name] = analyze_paths(traces, options)
    for rank in results["ours"].ranks:
        less = 1 if shift else 0
        assert [[(c.kind, c.duration_us) for c in s.own_collectives] for s in rank.steps] == [
            [("all_gather", 100 - less)], [("all_gather", 100 - less)]]
        assert [(c.step, c.kind) for c in rank.collectives] == [(1, "all_reduce"), (2, "all_reduce")]
        # The step's GPU breakdown leaves our kernel out: the user's all-reduce's last 100 us are the exposed
        # communication (ours would add its 100), and the step's GPU span ends with it (no idle gap before ours).
        assert [(s.gpu.exposed_comm_us, s.gpu.idle_us) for s in rank.steps if s.gpu is not None] == [(100, 0)] * 2
    ours_dict = _without_ours(results["ours"].to_dict(), tmp_path / "ours")
    plain_dict = _without_ours(results["plain"].to_dict(), tmp_path / "plain")
    # HTA's aggregate and the kernel statistics count every kernel of the trace, ours too; nothing else does.
    for d in (ours_dict, plain_dict):
        for rank in d["ranks"]:
            for key in ("gpu_total", "kernel_categories_us", "kernel_categories_count", "top_kernels"):
                rank.pop(key)
    assert ours_dict == plain_dict
