"""Kernel categories and collective kinds, and the interval arithmetic under every breakdown."""

from __future__ import annotations

import pytest

from hf_distprof.analysis.rank import intervals as iv
from hf_distprof.analysis.rank.gpu import gpu_breakdown
from hf_distprof.analysis.rank.kernels import c10d_kind, kernel_category, nccl_kind


@pytest.mark.parametrize(
    ("name", "category", "kind"),
    [
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
            "all_reduce",
        ),
        (
            "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
            "all_gather",
        ),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
            "reduce_scatter",
        ),
        ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "communication", "send_recv"),
        ("Memcpy HtoD (Pageable -> Device)", "memory", ""),
        ("Memset (Device)", "memory", ""),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", "computation", ""),
        ("cudaDeviceSynchronize Sync", "other", ""),
    ],
)
def test_kernel_category_and_kind(name: str, category: str, kind: str) -> None:
    assert kernel_category(name) == category
    assert nccl_kind(name) == kind


def test_c10d_kinds() -> None:
    assert c10d_kind("c10d::allreduce_") == "all_reduce"
    assert c10d_kind("c10d::_allgather_base_") == "all_gather"
    assert c10d_kind("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert c10d_kind("aten::mm") == ""


def test_interval_ops() -> None:
    a = iv.merge([(5, 7), (0, 2), (2, 3), (6, 9)])
    assert a == [(0, 3), (5, 9)]
    assert iv.total(a) == 7
    assert iv.intersect(a, [(1, 6)]) == [(1, 3), (5, 6)]
    assert iv.subtract(a, [(1, 6)]) == [(0, 1), (6, 9)]
    assert iv.clip(a, 2, 8) == [(2, 3), (5, 8)]


def test_gpu_breakdown_by_hand() -> None:
    # compute 0-10, comm 5-20 (5 us under compute), memcpy 25-30, idle 20-25.
    names = ["gemm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "Memcpy DtoH"]
    g = gpu_breakdown([0, 5, 25], [10, 20, 30], names, tiny_kernel_us=6)
    assert g is not None
    assert (g.kernel_time_us, g.idle_us, g.compute_us, g.non_compute_us) == (30, 5, 10, 15)
    assert g.comm_comp_overlap_pct == pytest.approx(100 * 5 / 15)
    assert g.exposed_comm_us == 10 and g.exposed_comm_pct == pytest.approx(100 * 10 / 30)
    assert g.n_tiny_kernels == 1
    assert g.category_overlap_us == {
        "COMPUTATION": 5,
        "COMPUTATION overlapping COMMUNICATION": 5,
        "COMMUNICATION": 10,
        "MEMORY": 5,
    }
