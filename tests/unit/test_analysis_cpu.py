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
