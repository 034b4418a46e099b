"""Cross-rank maths: the slow rank comes from pre-sync time, thresholds, MFU, the GPU table, the table."""

from __future__ import annotations

import math

import json

import pytest

from hf_distprof.timing.recorder import StepTiming
from hf_distprof.timing.series import StepSeries
from hf_distprof.timing.report import (
    PhaseTotals,
    RankSummary,
    cross_rank_report,
    format_table,
    imbalance_pct,
    peak_tflops_for_device,
)


def ddp_rank(
    rank: int,
    load: float,
    fwd: float = 0.1,
    compute: float = 0.2,
    step: float = 1.0,
    mem: int | None = 1000,
    samples: int = 80,
) -> RankSummary:
    """A rank under DDP: every rank's step lasts as long as the slowest; the rest of it is waiting."""
    totals = PhaseTotals()
    for i in range(10):
        totals.add(
            StepTiming(
                step=i + 2,
                data_s=0.3,
                forward_s=fwd,
                backward_s=step - 0.3 - fwd - 0.05,
                optimizer_s=0.05,
                step_s=step,
                data_load_s=load,
                backward_compute_s=compute,
                micro_batches=1,
                samples=samples // 10,
                tokens=samples * 128 // 10,
            )
        )
    return totals.to_rank_summary(rank, "host", mem)


def test_imbalance_pct_is_the_slowest_over_the_median_of_the_others():
    assert imbalance_pct([1.0, 1.0, 1.0]) == 0.0
    assert imbalance_pct([1.0, 3.0]) == pytest.approx(200.0)
    assert imbalance_pct([1.0, 1.15]) == pytest.approx(15.0)  # "15% slower" reads as 15%, with 2 ranks or 8
    assert imbalance_pct([1.0] * 7 + [1.15]) == pytest.approx(15.0)
    assert imbalance_pct([2.0]) == 0.0 and imbalance_pct([0.0, 0.0]) == 0.0


def series(ranks: list[RankSummary], steps: int = 10, jitter: float = 0.002) -> StepSeries:
    """Per-step rows matching ``ranks``' means: each rank's pre-sync time, with a small alternating jitter."""
    out = StepSeries(len(ranks))
    rows = [
        [[2 + i, r.step_s, (r.pre_sync_s or 0.0) + (jitter if (i + r.rank) % 2 else -jitter)] for i in range(steps)]
        for r in ranks
    ]
    out.add(rows)
    return out


def report_of(ranks: list[RankSummary], **kw) -> object:
    return cross_rank_report(ranks, verdict=series(ranks).verdict(kw.get("time_threshold_pct", 10.0)), **kw)


def test_phase_totals_means_and_unmeasured_phases():
    totals = PhaseTotals()
    totals.add(
        StepTiming(
            step=1,
            data_s=1.0,
            forward_s=2.0,
            backward_s=3.0,
            optimizer_s=0.5,
            step_s=6.5,
            samples=2,
            tokens=10,
        )
    )
    totals.add(
        StepTiming(
            step=2,
            data_s=3.0,
            forward_s=None,
            backward_s=5.0,
            optimizer_s=0.5,
            step_s=8.5,
            samples=2,
            tokens=10,
        )
    )
    assert totals.mean("data_s") == 2.0 and totals.mean("step_s") == 7.5
    assert totals.mean("forward_s") is None  # missing on one step: no mean over a subset
    assert totals.mean("data_load_s") is None
    summary = totals.to_rank_summary(3, "h", None)
    assert summary.samples_per_s == pytest.approx(4 / 15.0) and summary.tokens_per_s == pytest.approx(
        20 / 15.0
    )


@pytest.mark.parametrize("slow", [0, 1, 3])
def test_the_slow_rank_is_found_from_pre_sync_time_although_all_steps_are_equal(slow):
    ranks = [ddp_rank(r, load=0.4 if r == slow else 0.01) for r in range(4)]
    report = report_of(ranks, time_threshold_pct=10, memory_threshold_pct=20)
    assert report.step_imbalance_pct == 0.0  # total step time cannot tell
    assert report.slowest_rank == slow and report.slowest_phase == "data"
    assert report.imbalance_pct == pytest.approx((0.4 + 0.3) / (0.01 + 0.3) * 100 - 100)
    (warning,) = report.warnings
    assert f"rank {slow} is the slowest" in warning and "dataloader_num_workers" in warning
    assert "slowest in 10 of 10 steps" in warning
    assert report.imbalance_verdict["status"] == "raised" and report.imbalance_verdict["rank"] == slow
    json.dumps(report.to_json())


def test_means_alone_never_warn():
    # The same means without the per-step evidence: a figure, not a verdict.
    ranks = [ddp_rank(0, 0.01), ddp_rank(1, 0.4)]
    report = cross_rank_report(ranks)
    assert report.imbalance_pct > 100 and report.warnings == [] and report.imbalance_verdict is None


def test_a_rank_slow_in_7_of_12_steps_is_noise():
    # Rank 1 is 32% slower in 7 of 12 steps and rank 0 as much slower in the other 5: a large effect, but an
    # alternation like this happens by chance 39% of the time with two ranks (slowest in 7 of 12 at 1/2 a step).
    ranks = [ddp_rank(0, 0.01), ddp_rank(1, 0.01)]
    rows = [[[2 + i, 1.0, 0.31 + (0.1 if (r == 1) == (i < 7) else 0.0)] for i in range(12)] for r in (0, 1)]
    s = StepSeries(2)
    s.add(rows)
    verdict = s.verdict(10.0)
    assert (verdict.status, verdict.rank, verdict.slowest_in) == ("quiet", 1, 7)
    assert verdict.effect_pct == pytest.approx(10 / 31 * 100) and "not persistent" in verdict.reason
    assert verdict.p_value == pytest.approx(sum(math.comb(12, i) for i in range(7, 13)) / 4096)
    assert cross_rank_report(ranks, verdict=verdict).warnings == []


def test_compute_slow_rank_gets_compute_advice():
    ranks = [ddp_rank(0, 0.01), ddp_rank(1, 0.01, compute=0.5)]
    report = report_of(ranks)
    assert report.slowest_rank == 1 and report.slowest_phase == "backward"
    assert "group_by_length" in report.warnings[0]


def test_below_thresholds_no_warning():
    ranks = [ddp_rank(0, 0.010), ddp_rank(1, 0.030, mem=1150)]
    report = report_of(ranks, time_threshold_pct=10, memory_threshold_pct=20)
    assert report.imbalance_pct < 10 and report.memory_imbalance_pct == pytest.approx(15.0)
    assert report.imbalance_verdict["status"] == "quiet"
    assert report.warnings == []


def test_memory_imbalance_warning_names_the_rank():
    ranks = [ddp_rank(0, 0.01, mem=2000), ddp_rank(1, 0.01, mem=1000)]
    report = cross_rank_report(ranks, memory_threshold_pct=20)
    assert report.max_memory_rank == 0 and report.memory_imbalance_pct == pytest.approx(100.0)
    (warning,) = report.warnings
    assert warning.startswith("Peak memory imbalance") and "rank 0 peaks" in warning


def test_single_rank_never_warns_about_imbalance():
    report = cross_rank_report([ddp_rank(0, 0.5, mem=10)])
    assert report.warnings == [] and report.memory_imbalance_pct is None


def test_mfu_only_with_a_peak():
    ranks = [ddp_rank(0, 0.01), ddp_rank(1, 0.01)]  # 10 steps of 1 s each per rank
    assert cross_rank_report(ranks, flops=4e12).mfu_pct is None
    # 4e12 FLOPs over 2 devices x 10 s at 1 TFLOPs peak = 20 %.
    assert cross_rank_report(ranks, flops=4e12, peak_tflops=1.0).mfu_pct == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A10G", None),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("Tesla T4", 65.0),
        ("Some CPU", None),
    ],
)
def test_gpu_peak_table(name, peak):
    assert peak_tflops_for_device(name) == peak


def test_empty_input_is_rejected():
    with pytest.raises(ValueError, match="timed steps"):
        cross_rank_report([])


def test_table_marks_the_slowest_rank_and_prints_comm_overhead():
    report = report_of([ddp_rank(0, 0.01), ddp_rank(1, 0.4)])
    comm = {"passes": 3, "compute_s": 0.3, "with_sync_s": 0.4, "comm_s": 0.1, "overhead_pct": 25.0}
    lines = format_table(report, comm).splitlines()
    rows = {line.split()[0]: line for line in lines if line.split()[0].isdigit() and "warning" not in line}
    assert rows["1"].endswith("<- slowest") and not rows["0"].endswith("<- slowest")
    assert any("25.0%" in line and "communication 0.1000s" in line for line in lines)
    assert "MFU n/a" in "\n".join(lines)


def test_rank_summary_round_trips_through_a_dict():
    summary = ddp_rank(2, 0.1)
    assert RankSummary.from_dict({**summary.__dict__, "extra": 1}) == summary


def test_one_row_added_to_two_totals_at_once_is_the_row_added_to_each():
    """The step timer adds each step to the window's totals and the run's in one pass: the same sums and counts as two
    passes, a phase measured on some steps only (None on the others) included."""
    rows = [
        StepTiming(step=s, data_s=0.1 * s, forward_s=None if s == 3 else 0.2, backward_s=0.3, optimizer_s=0.05,
                   step_s=1.0 + s, data_load_s=None if s % 2 else 0.01, backward_compute_s=0.25, micro_batches=1,
                   samples=8, tokens=100 + s, cpu_wait_s=0.001 * s, pre_sync_cpu_wait_s=None).to_json()
        for s in range(1, 6)
    ]
    window, run = PhaseTotals(), PhaseTotals()
    run.add_row(rows[0])  # the run has steps the window has not
    apart_window, apart_run = PhaseTotals(), PhaseTotals()
    apart_run.add_row(rows[0])
    for row in rows[1:]:
        window.add_row(row, run)
        apart_window.add_row(row)
        apart_run.add_row(row)
    assert window == apart_window and run == apart_run
    assert (run.steps, run.samples, run.tokens, window.steps) == (5, 40, 515, 4)
    assert run.counts["forward_s"] == 4 and window.mean("forward_s") is None  # not measured on every step
