"""The vectorised analyzers (hf_distprof.analysis.rank.fast) give exactly what the pure-Python ones give: values and
types, on random int-time events (overlapping, touching, zero-length), and hand back to them on float times."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hf_distprof.analysis.rank import exposure, fast
from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.cpu import split_main_thread
from hf_distprof.analysis.rank.gpu import gpu_breakdown, kernel_stats
from hf_distprof.analysis.read.events import GpuEvent, ParsedTrace, Step
from hf_distprof.analysis.results.rank import Collective

KERNELS = [
    "void gemm_kernel<float>(int)",  # computation
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",  # communication
    "ncclDevKernel_AllGather_RING_LL(x)",  # communication
    "Memcpy HtoD (Pageable -> Device)",  # memory
    "Memset (Device)",  # memory
    "cudaStreamSynchronize Sync",  # other
    "elementwise_kernel",  # computation
]
OP_NAMES = [
    "aten::mm",
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "c10d::allreduce_",
    "autograd::engine::evaluate_function: MmBackward0",
    "FSDP::all_gather (layers.0)",
    "_c10d_functional::wait_tensor",
    "hf_distprof/forward",
    "ProfilerStep#7",
]


def _events(rng: random.Random, n: int, span: int = 2000) -> tuple[list[int], list[int]]:
    starts = [rng.randrange(span) for _ in range(n)]
    ends = [s + rng.choice((0, 1, 3, 10, 50, 200)) for s in starts]
    return starts, ends


@pytest.mark.parametrize("seed", range(40))
def test_gpu_breakdown_and_kernel_stats_equal_the_reference(seed: int):
    rng = random.Random(seed)
    starts, ends = _events(rng, rng.randrange(1, 120))
    names = [rng.choice(KERNELS[: rng.randrange(1, len(KERNELS) + 1)]) for _ in starts]
    cols = fast.GpuColumns.of(GpuEvent(starts, ends, names, [7] * len(starts), list(range(len(starts)))))
    assert cols is not None
    everything = np.arange(len(starts))
    assert repr(cols.breakdown(everything, 10.0)) == repr(gpu_breakdown(starts, ends, names, 10.0))
    assert repr(fast.kernel_stats(cols.starts, cols.ends, names, 3)) == repr(kernel_stats(starts, ends, names, 3))
    assert fast.as_list(fast.merge(cols.starts, cols.ends)) == iv.merge(zip(starts, ends))
    # Exposure of collectives under the computation kernels.
    compute = [(s, e) for s, e, n in zip(starts, ends, names) if n in (KERNELS[0], KERNELS[6])]
    spans = _events(rng, 30)
    ours = [Collective(0, "all_reduce", k, s, e) for k, (s, e) in enumerate(zip(*spans))]
    ref = [Collective(0, "all_reduce", k, s, e) for k, (s, e) in enumerate(zip(*spans))]
    fast.set_exposure(ours, cols.merged(fast.COMP_BIT))
    exposure.set_exposure(ref, iv.merge(compute), hidden_when_covered=True)
    assert repr(ours) == repr(ref)


def _trace(ops: list[tuple[int, int, str]], steps: list[Step]) -> ParsedTrace:
    return ParsedTrace("t", 0, 1, "gloo", None, 0, steps, 1, ops, [], [], [], [], GpuEvent(), {}, len(ops))


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("waits_block", [True, False])
def test_main_thread_split_equals_the_reference(seed: int, waits_block: bool):
    rng = random.Random(seed)
    starts, ends = _events(rng, rng.randrange(1, 150))
    ops = sorted((s, e, rng.choice(OP_NAMES)) for s, e in zip(starts, ends))
    steps = [Step(k, 500 * k - rng.randrange(50), 500 * (k + 1) + rng.randrange(50)) for k in range(4)]
    comm_spans = iv.merge(zip(*_events(rng, 20)))
    cols = fast.MainOpColumns.of(_trace(ops, steps))
    assert cols is not None
    op_starts = [op[0] for op in ops]
    for step in steps:
        lo, hi = int(np.searchsorted(cols.starts, step.start)), int(np.searchsorted(cols.starts, step.end))
        ours = cols.split(lo, hi, comm_spans, step.start, step.end, waits_block)
        ref = split_main_thread(ops, comm_spans, step.start, step.end, op_starts, waits_block)
        assert repr(ours) == repr(ref)


def test_float_times_go_to_the_reference_code():
    assert fast.int_column([1, 2.5]) is None and fast.int_column([2**63]) is None and fast.int_column([]) is None
    assert fast.GpuColumns.of(GpuEvent([1.0], [2.0], ["k"], [7], [1])) is None
    assert fast.MainOpColumns.of(_trace([(0.5, 2.0, "aten::mm")], [Step(1, 0.0, 3.0)])) is None
    assert fast.int_column([3, 4]).tolist() == [3, 4]


def test_to_dict_is_the_one_from_dataclasses_asdict(monkeypatch: pytest.MonkeyPatch):
    import dataclasses
    from pathlib import Path

    from hf_distprof.analysis import AnalysisOptions, analyze_paths
    from hf_distprof.analysis.results import result as model

    folder = Path(__file__).resolve().parents[1] / "data" / "gpu_float_ts"
    res = analyze_paths([folder], AnalysisOptions(workers=1), read_compact=False)
    assert sum(len(r.collectives) for r in res.ranks) > 0
    out = res.to_json()
    monkeypatch.setattr(model, "_asdict", dataclasses.asdict)
    assert out == res.to_json()


@pytest.mark.parametrize("name", ["gpu_float_ts", "dlrm_8gpu_v100"])
def test_a_whole_rank_is_the_same_through_either_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """analyze_rank asks one path for the GPU events (hf_distprof.analysis.rank.device): the columns when every time
    is an int, else the reference code; forced through the reference code, each rank's result is the same."""
    from pathlib import Path

    from hf_distprof.analysis.options import AnalysisOptions
    from hf_distprof.analysis.rank import analyze, device
    from hf_distprof.analysis.read.events import parse_trace
    from tests.conftest import require

    root = Path(__file__).resolve().parents[2]
    folder = root / "tests" / "data" / name if name == "gpu_float_ts" else root.parent / "shared" / "traces" / name
    require(folder.is_dir(), f"the shared traces are not at {folder}")
    traces = [parse_trace(p) for p in sorted(folder.glob("*.json.gz"))[:2]]
    options = AnalysisOptions(workers=1)
    paths = {type(device.gpu_events(t, [])).__name__ for t in traces}
    assert paths == ({"ReferencePath"} if name == "gpu_float_ts" else {"ColumnPath"})  # float times: the reference
    # repr: every field (collectives and the what-if timeline too), values and types.
    by_path = [repr(analyze.analyze_rank(t, options)) for t in traces]
    monkeypatch.setattr(fast.ColumnPath, "of", classmethod(lambda cls, trace, own: None))
    assert [repr(analyze.analyze_rank(t, options)) for t in traces] == by_path
