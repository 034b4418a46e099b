"""The GPU analyzers on hand-built kernels: every field of the breakdown, the kernel-type table, kernel stats."""

from __future__ import annotations

import pytest

from hf_distprof.analysis.rank.gpu import _mask_label, category_overlap, display_name, gpu_breakdown, kernel_stats
from hf_distprof.analysis.rank.kernels import COMMUNICATION, COMPUTATION, MEMORY, OTHER
from hf_distprof.analysis.results.rank import KernelStat

GEMM = "void gemm<float>(Params)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
ALLGATHER = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*)"
COPY = "Memcpy HtoD (Pinned -> Device)"
SYNC = "cudaDeviceSynchronize Sync"


def test_every_field_of_a_breakdown():
    # compute 100-140 and 150-170 (two kernels overlapping 130-140), comm 135-160 and 200-230,
    # a copy 170-180, a Sync event (other) 240-250; idle: 180-200 and 230-240.
    starts = [100, 130, 150, 135, 200, 170, 240]
    ends = [135, 140, 170, 160, 230, 180, 250]
    names = [GEMM, GEMM, GEMM, ALLREDUCE, ALLGATHER, COPY, SYNC]
    g = gpu_breakdown(starts, ends, names, tiny_kernel_us=10.5)
    assert g is not None
    assert g.kernel_time_us == 150 and g.idle_us == 30
    assert g.compute_us == 60  # 100-140 and 150-170
    assert g.non_compute_us == 150 - 60 - 30
    assert (g.idle_pct, g.compute_pct, g.non_compute_pct) == pytest.approx((20.0, 40.0, 40.0))
    assert g.comm_us == 55  # 135-160 and 200-230
    assert g.comm_comp_overlap_pct == pytest.approx(100 * 15 / 55)  # 135-140 and 150-160
    assert g.exposed_comm_us == 40 and g.exposed_comm_pct == pytest.approx(100 * 40 / 150)
    assert g.memory_us == 10
    assert (g.n_kernels, g.n_tiny_kernels) == (7, 3)  # 10 us < 10.5: 130-140, the copy, the Sync
    assert g.category_overlap_us == {
        "COMPUTATION": 45,
        "COMPUTATION overlapping COMMUNICATION": 15,
        "COMMUNICATION": 40,
        "MEMORY": 10,
    }


def test_a_kernel_exactly_at_the_tiny_threshold_is_not_tiny():
    g = gpu_breakdown([0, 20], [10, 29.5], [GEMM, GEMM], tiny_kernel_us=10)
    assert g is not None and g.n_tiny_kernels == 1


def test_no_event_no_breakdown_and_no_comm_no_overlap_figure():
    assert gpu_breakdown([], [], [], tiny_kernel_us=10) is None
    g = gpu_breakdown([5], [25], [GEMM], tiny_kernel_us=10)
    assert g is not None
    assert (g.kernel_time_us, g.idle_us, g.compute_us, g.non_compute_us, g.comm_us) == (20, 0, 20, 0, 0)
    assert g.comm_comp_overlap_pct is None and g.exposed_comm_pct == 0.0
    assert g.category_overlap_us == {"COMPUTATION": 20}


def test_zero_length_kernels_give_zero_percentages_not_a_division_error():
    g = gpu_breakdown([7], [7], [GEMM], tiny_kernel_us=1)
    assert g is not None
    assert (g.kernel_time_us, g.idle_pct, g.compute_pct, g.non_compute_pct, g.exposed_comm_pct) == (0, 0, 0, 0, 0)


def test_three_way_overlap_labels_in_hta_order():
    merged = {COMPUTATION: [(0.0, 10.0)], COMMUNICATION: [(5.0, 20.0)], MEMORY: [(8.0, 12.0), (30.0, 31.0)]}
    assert category_overlap(merged) == {
        "COMPUTATION": 5.0,
        "COMPUTATION overlapping COMMUNICATION": 3.0,
        "COMPUTATION overlapping COMMUNICATION overlapping MEMORY": 2.0,
        "COMMUNICATION overlapping MEMORY": 2.0,
        "COMMUNICATION": 8.0,
        "MEMORY": 1.0,
    }
    assert category_overlap({}) == {}


def test_kernels_starting_together_leave_no_zero_length_row():
    merged = {COMPUTATION: [(0.0, 10.0)], COMMUNICATION: [(0.0, 10.0)]}
    assert category_overlap(merged) == {"COMPUTATION overlapping COMMUNICATION": 10.0}


@pytest.mark.parametrize(
    ("mask", "label"),
    [
        (0b001, "COMPUTATION"),
        (0b010, "COMMUNICATION"),
        (0b100, "MEMORY"),
        (0b101, "COMPUTATION overlapping MEMORY"),
        (0b111, "COMPUTATION overlapping COMMUNICATION overlapping MEMORY"),
    ],
)
def test_mask_labels_name_the_running_categories_in_hta_order(mask, label):
    assert _mask_label(mask) == label


def test_kernel_stats_count_sum_min_max_and_keep_the_top_per_category():
    starts = [0, 10, 30, 40, 50, 60, 70]
    ends = [4, 19, 31, 42, 55, 66, 71]
    names = [GEMM, GEMM, "relu", "relu", ALLREDUCE, ALLREDUCE, SYNC]
    cat_us, cat_n, top = kernel_stats(starts, ends, names, top=1)
    assert cat_us == {COMPUTATION: 4 + 9 + 1 + 2, COMMUNICATION: 5 + 6, OTHER: 1}
    assert cat_n == {COMPUTATION: 4, COMMUNICATION: 2, OTHER: 1}
    # Sorted by category name, then by total time; one per category (top=1): relu (3 us) is left out.
    assert [(s.category, s.name, s.kind, s.count, s.total_us, s.min_us, s.max_us) for s in top] == [
        (COMMUNICATION, ALLREDUCE, "all_reduce", 2, 11, 5, 6),
        (COMPUTATION, GEMM, "", 2, 13, 4, 9),
        (OTHER, SYNC, "", 1, 1, 1, 1),
    ]
    _, _, both = kernel_stats(starts, ends, names, top=2)
    assert [s.name for s in both] == [ALLREDUCE, GEMM, "relu", SYNC]
    assert both[2].mean_us == 1.5


def test_display_names():
    assert display_name(KernelStat(ALLGATHER, COMMUNICATION, "all_gather", 1, 1, 1, 1)) == (
        "ncclKernel_AllGather_RING_LL_Sum_int8_t [all_gather]"
    )
    assert display_name(KernelStat(GEMM, COMPUTATION, "", 1, 1, 1, 1)) == "void gemm<float>"
    assert KernelStat("k", COMPUTATION, "", 0, 0, 0, 0).mean_us == 0.0


def test_half_a_microsecond_of_communication_alone_is_still_measured():
    g = gpu_breakdown([0.0], [0.5], [ALLREDUCE], tiny_kernel_us=10)
    assert g is not None
    assert (g.kernel_time_us, g.compute_us, g.comm_us, g.exposed_comm_us) == (0.5, 0.0, 0.5, 0.5)
    assert (g.non_compute_pct, g.exposed_comm_pct, g.comm_comp_overlap_pct) == (100.0, 100.0, 0.0)
    assert g.category_overlap_us == {"COMMUNICATION": 0.5}
