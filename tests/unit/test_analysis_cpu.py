"""The CPU (gloo) breakdown of one step, on hand-built steps whose every part is known to the microsecond."""

from __future__ import annotations

import pytest

from hf_distprof.analysis.rank.cpu import _op_kind, breakdown_of, split_main_thread

# One step, 0-1000 us, of the training thread (sorted by start), and two collectives in flight on gloo threads.
OPS = [
    (-50.0, 20.0, "aten::before_the_step"),  # starts before the step: the previous step's
    (0.0, 1000.0, "ProfilerStep#3"),  # encloses work, is not work
    (0.0, 100.0, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),  # loading 0-100
    (50.0, 80.0, "aten::stack"),  # inside the loading: loading, not compute
    (100.0, 400.0, "aten::linear"),  # compute 100-400
    (100.0, 400.0, "hf_distprof/forward"),  # the step timer's phase range: not work
    (400.0, 410.0, "c10d::allreduce_"),  # enqueue: communication 400-410
    (410.0, 900.0, "hf_distprof/backward"),  # would cover the gaps 700-900 if it counted as work
    (420.0, 700.0, "autograd::engine::evaluate_function: MmBackward0"),  # compute and backward 420-700
    (450.0, 460.0, "c10d::allreduce_"),  # an enqueue inside the backward: communication 450-460
    (900.0, 950.0, "Optimizer.step#SGD.step"),  # compute 900-950
    (980.0, 1100.0, "aten::zero_"),  # runs past the step's end: clipped to 980-1000
]
COMM = [(405.0, 600.0), (650.0, 880.0)]


def test_a_ddp_step_splits_into_exact_parts():
    split = split_main_thread(OPS, COMM, 0.0, 1000.0)
    assert split.loading == [(0.0, 100.0)]
    assert split.compute == [(100.0, 400.0), (420.0, 450.0), (460.0, 700.0), (900.0, 950.0), (980.0, 1000.0)]
    # Enqueues, plus the gaps while a collective is in flight (410-420 and 700-880: the thread waits in DDP).
    assert split.communication == [(400.0, 420.0), (450.0, 460.0), (700.0, 880.0)]
    assert split.comm_in_step == COMM
    assert split.backward == [(420.0, 700.0)]
    b = breakdown_of(split, 1000.0)
    assert (b.duration_us, b.compute_us, b.communication_us, b.data_loading_us) == (1000.0, 640.0, 210.0, 100.0)
    assert b.other_us == 50.0  # the gaps 880-900 and 950-980, with nothing in flight
    assert b.comm_busy_us == 425.0
    assert b.comm_backward_overlap_pct == pytest.approx(100 * (180 + 50) / 425)  # 420-600 and 650-700


def test_collectives_are_clipped_to_the_step():
    split = split_main_thread(OPS, [(-100.0, 50.0), (990.0, 1200.0)], 0.0, 1000.0)
    assert split.comm_in_step == [(0.0, 50.0), (990.0, 1000.0)]
    b = breakdown_of(split, 1000.0)
    assert b.comm_busy_us == 60.0 and b.comm_backward_overlap_pct == 0.0


def test_a_step_without_collectives_has_no_overlap_figure():
    b = breakdown_of(split_main_thread(OPS, [], 0.0, 1000.0), 1000.0)
    assert (b.communication_us, b.comm_busy_us, b.comm_backward_overlap_pct) == (20.0, 0.0, None)
    assert b.other_us == 1000.0 - 640.0 - 20.0 - 100.0


# FSDP2 on a CPU backend: the thread blocks inside FSDP's wait op, which holds a copy-in op of its own.
FSDP_OPS = [
    (100.0, 300.0, "FSDP::all_gather (layers.0)"),
    (110.0, 130.0, "fsdp::all_gather_copy_in"),
    (300.0, 400.0, "aten::mm"),
]


def test_fsdp_wait_ops_count_as_communication_only_while_a_collective_runs():
    split = split_main_thread(FSDP_OPS, [(150.0, 250.0)], 0.0, 400.0)
    assert split.compute == [(110.0, 130.0), (300.0, 400.0)]  # the copy-in is work, the wait around it is not
    assert split.communication == [(150.0, 250.0)]
    b = breakdown_of(split, 400.0)
    assert (b.compute_us, b.communication_us, b.data_loading_us, b.other_us) == (120.0, 100.0, 0.0, 180.0)


def test_on_gpu_the_wait_ops_only_enqueue_and_count_as_compute():
    split = split_main_thread(FSDP_OPS, [(150.0, 250.0)], 0.0, 400.0, waits_block=False)
    assert split.compute == [(100.0, 400.0)]
    b = breakdown_of(split, 400.0)
    assert (b.compute_us, b.communication_us, b.other_us) == (300.0, 0.0, 100.0)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ProfilerStep#12", 0),
        ("hf_distprof/optimizer", 0),
        ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 1),
        ("c10d::_allgather_base_", 2),
        ("aten::addmm", 3),
        ("autograd::engine::evaluate_function: AddmmBackward0", 4),
        ("FSDP::all_gather", 5),
        ("FSDP::post_backward_reduce (layers.1)", 5),
        ("_c10d_functional::wait_tensor", 5),
        ("FSDP::all_gather_copy_out", 3),  # a copy, not a wait
        ("cudaStreamSynchronize", 6),
        ("cudaMemcpy", 6),  # blocking
        ("cudaMemcpyAsync", 3),  # not
    ],
)
def test_op_kinds(name, kind):
    assert _op_kind(name) == kind


def test_a_fully_accounted_step_has_no_other_time_and_a_tiny_collective_still_has_an_overlap():
    ops = [(0.0, 60.0, "aten::mm"), (60.0, 100.0, "autograd::engine::evaluate_function: MmBackward0")]
    b = breakdown_of(split_main_thread(ops, [(99.5, 100.0)], 0.0, 100.0), 100.0)
    assert (b.compute_us, b.communication_us, b.other_us) == (100.0, 0.0, 0.0)
    assert b.comm_busy_us == 0.5 and b.comm_backward_overlap_pct == 100.0


def test_an_op_nested_to_the_end_of_a_wait_is_work_and_one_spanning_two_waits_is_not_nested():
    # The copy-in ends exactly where its wait ends: still inside it, so the wait's self time is 100-110 only.
    flush = [(100.0, 130.0, "FSDP::all_gather (layers.0)"), (110.0, 130.0, "fsdp::all_gather_copy_in")]
    split = split_main_thread(flush, [(100.0, 130.0)], 100.0, 130.0)
    assert (split.compute, split.communication) == ([(110.0, 130.0)], [(100.0, 110.0)])
    # An op from inside the first wait to inside the second is not nested in either: both waits lose it whole.
    spanning = [
        (100.0, 200.0, "FSDP::all_gather (layers.0)"),
        (150.0, 350.0, "aten::copy_"),
        (300.0, 400.0, "FSDP::all_gather (layers.1)"),
    ]
    split = split_main_thread(spanning, [(100.0, 400.0)], 100.0, 400.0)
    assert split.communication == [(100.0, 200.0), (300.0, 400.0)]
    assert split.compute == [(200.0, 300.0)]


# A GPU step's training thread: a loss.item() (the copy to the host waits for the GPU) and an optimizer whose
# clip_grad_norm_ syncs, among ops that only launch kernels.
GPU_OPS = [
    (0.0, 1000.0, "ProfilerStep#4"),
    (0.0, 300.0, "aten::linear"),  # launches: compute
    (300.0, 700.0, "aten::item"),
    (310.0, 690.0, "aten::_local_scalar_dense"),
    (320.0, 330.0, "cudaMemcpyAsync"),  # a launch: compute
    (330.0, 680.0, "cudaStreamSynchronize"),  # waiting for the GPU: 350 us
    (700.0, 900.0, "Optimizer.step#AdamW.step"),
    (800.0, 850.0, "cudaDeviceSynchronize"),  # 50 us more
    (950.0, 980.0, "cudaMemcpy"),  # a blocking copy outside any op: 30 us
]


def test_on_gpu_the_host_waiting_for_the_gpu_is_sync_not_compute():
    split = split_main_thread(GPU_OPS, [], 0.0, 1000.0, waits_block=False)
    assert split.gpu_wait == [(330.0, 680.0), (800.0, 850.0), (950.0, 980.0)]
    assert split.compute == [(0.0, 330.0), (680.0, 800.0), (850.0, 900.0)]
    b = breakdown_of(split, 1000.0)
    assert (b.compute_us, b.gpu_wait_us, b.communication_us, b.other_us) == (500.0, 430.0, 0.0, 70.0)
    # Before, the 430 us counted as compute (800 us, 80% of the step): a host waiting for its GPU read as busy.


def test_the_numpy_split_takes_the_same_waits_out():
    import numpy as np

    from hf_distprof.analysis.rank import fast
    from hf_distprof.analysis.rank.cpu import _op_kind

    starts, ends = np.array([int(o[0]) for o in GPU_OPS]), np.array([int(o[1]) for o in GPU_OPS])
    kinds = np.array([_op_kind(o[2]) for o in GPU_OPS], dtype=np.int8)
    split = fast.MainOpColumns(starts, ends, kinds).split(0, len(GPU_OPS), [], 0, 1000, False)
    assert split == split_main_thread(GPU_OPS, [], 0.0, 1000.0, waits_block=False)


def test_dlrm_rank_1_waits_a_third_of_its_step_for_its_gpu():
    import gzip

    import orjson

    from hf_distprof.analysis import AnalysisOptions, analyze_paths
    from hf_distprof.analysis.rank import intervals as iv

    from ..conftest import SHARED_DIR, require

    dlrm = SHARED_DIR / "traces" / "dlrm_8gpu_v100"
    path = next(iter(sorted(dlrm.glob("worker1_*.json.gz"))), None)
    require(path is not None, f"the shared DLRM traces are not in {dlrm}")
    assert path is not None
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    step = next(e for e in events if e.get("name", "").startswith("ProfilerStep#"))
    start, end = step["ts"], step["ts"] + step["dur"]
    # The reference: every synchronizing CUDA call of the training thread in the step (none sits in data loading or
    # an enqueue there), their union.
    syncs = iv.merge((max(e["ts"], start), min(e["ts"] + e["dur"], end)) for e in events
                     if e.get("cat") == "cuda_runtime" and e["name"] in (
                         "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
                     and e["tid"] == step["tid"] and start <= e["ts"] < end)
    rank = next(r for r in analyze_paths([path], AnalysisOptions(workers=1), read_compact=False).ranks)
    cpu = rank.steps[0].cpu
    assert cpu.gpu_wait_us == pytest.approx(iv.total(syncs))
    assert cpu.pct(cpu.gpu_wait_us) == pytest.approx(33.2, abs=0.05)  # its cpu% read 92.1% before, 58.9% now
    assert cpu.compute_us + cpu.communication_us + cpu.data_loading_us + cpu.gpu_wait_us + cpu.other_us == \
        pytest.approx(cpu.duration_us)


def test_a_gpu_run_s_step_without_gpu_events_keeps_the_table_s_columns():
    # gpu_float_ts: a GPU run; one step of rank 0 made to hold no GPU event (a step the profiler caught only on the
    # host). Its row has the sync% cell and blanks under the GPU columns, as long as the header, where it used to take
    # the CPU run's gloo columns.
    from pathlib import Path

    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_summary

    result = analyze_paths([Path(__file__).resolve().parents[1] / "data" / "gpu_float_ts"], AnalysisOptions(workers=1))
    result.ranks[0].steps[0].gpu = None
    lines = format_summary(result).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("rank   step   step ms"))
    row = lines[head + 2]
    assert row.split() == ["0", "5", "2.98", "5.9", "27.5", "0.0", "66.6", "0.0", "|", "-", "-", "-", "-", "-"]
    assert len(row) == len(lines[head]) and row.index("|") == lines[head].index("|")
