"""The step timer's records beside the traces: read once, judged again with the timer's own rule (the same verdict the
live timer reached at train end, on the same steps), the steps inside and outside the profiler's window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_distprof.analysis.across.evidence import timer_figures
from hf_distprof.analysis.judge.verdicts import run_verdict
from hf_distprof.analysis.read.timer_records import read_timer_records
from hf_distprof.analysis.results.timer import TimerRecords
from hf_distprof.timing.series import StepSeries
from hf_distprof.core.verdicts import KEPT_CELLS

STEPS = range(1, 23)  # the scenario suite's run: warm-up 1, profiler over 6-10 (warmup 6-7, active 8-10)
TRACED = set(range(6, 11))


def own_work(rank: int, step: int) -> float:
    # Rank 1 25% slower, with the same step-to-step wobble on both; the traced steps 3x slower (the profiler's doing).
    base = 0.1 + 0.004 * ((step * 7) % 5)
    return base * (1.25 if rank == 1 else 1.0) * (3.0 if step in TRACED else 1.0)


def verdict(records: TimerRecords, threshold_pct: float, traced: set[int] | None = None):  # type: ignore[no-untyped-def]
    """The run's verdict the analysis judges again from the records (the traces holding ``traced``)."""
    return run_verdict(timer_figures(records, traced or set()), threshold_pct)


def write(folder: Path, marked: bool = True) -> None:
    for rank in (0, 1):
        rows = []
        for step in STEPS:
            row = {"step": step, "step_s": 0.2 + 0.001 * step + 0.0001 * rank, "cpu_wait_s": 0.001 * rank,
                   "pre_sync_s": own_work(rank, step) + 0.001 * rank}
            if marked:
                row.update(own_work_s=own_work(rank, step), warmup=step == 1, traced=step in TRACED)
            rows.append(row)
        (folder / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_verdict_is_the_live_timers_on_the_same_steps(tmp_path: Path) -> None:
    write(tmp_path)
    records = read_timer_records([tmp_path / "rank0_host_step8-10.pt.trace.json.gz"])
    assert records.marked and records.warmup == {1} and records.traced == TRACED
    got = verdict(records, 10.0)
    # The live timer: every step after its warm-up, as [step, step_s, own_work_s] rows, the profiler's steps left out.
    series = StepSeries(2)
    series.add([[[s, 0.2 + 0.001 * s + 0.0001 * r, own_work(r, s)] for s in STEPS if s > 1] for r in (0, 1)])
    live = series.verdict(10.0, lambda s: s in TRACED)
    assert got is not None and live is not None
    assert got.to_json() == live.to_json()
    assert (got.status, got.rank, got.steps, got.slowest_in) == ("raised", 1, 16, 16)  # 2-5 and 11-22
    assert got.effect_pct == pytest.approx(25.0)
    # Steps of a trace the marks do not cover (an on-demand window) are left out too.
    more = verdict(records, 10.0, traced={20, 21, 22})
    assert more is not None and more.steps == 13


def test_cpu_wait_step_times_and_the_warm_up(tmp_path: Path) -> None:
    write(tmp_path)
    records = read_timer_records([tmp_path / "x.json"])
    figures = timer_figures(records, set())
    assert figures.cpu_wait == {0: {s: 0.0 for s in STEPS}, 1: {s: 0.001 for s in STEPS}}
    times = figures.step_times
    assert sorted(times) == list(range(2, 23)) and times[5] == 0.2 + 0.005 + 0.0001  # the slowest rank's


def test_older_files_without_marks_give_no_verdict_and_their_first_row_is_the_warm_up(tmp_path: Path) -> None:
    write(tmp_path, marked=False)
    records = read_timer_records([tmp_path / "x.json"])
    assert not records.marked and records.warmup == {1} and records.traced == set()
    assert verdict(records, 10.0) is None
    assert sorted(timer_figures(records, set()).step_times) == list(range(2, 23))


def test_a_garbled_line_is_left_out_and_said_and_one_rank_gives_no_verdict(tmp_path: Path) -> None:
    row = {"step": 2, "step_s": 0.2, "own_work_s": 0.1, "warmup": False, "traced": False}
    (tmp_path / "timing_rank0.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "timing_rank1.jsonl").write_text("\n".join(["{not json", json.dumps(["a", "list"]),
                                                              json.dumps({**row, "step": "3"}),
                                                              json.dumps({**row, "step": True}), ""]))
    (tmp_path / "timing_rankX.jsonl").write_text(json.dumps(row))  # no rank in the name
    records = read_timer_records([tmp_path / "x.json"])
    assert records.rows == {0: {2: row}} and records.marked
    assert [(Path(p).name, why) for p, why in records.skipped] == [(
        "timing_rank1.jsonl", "line 1: not JSON (Expecting property name enclosed in double quotes); line 2: a record "
        "without a 'step'; line 3: 'step' is '3', not a number (and 1 more): those lines are left out, no record of "
        "this rank read")]
    assert verdict(records, 10.0) is None  # one rank
    assert read_timer_records([tmp_path / "elsewhere" / "x.json"]).rows == {}


def test_one_garbled_line_of_the_slow_rank_s_records_keeps_its_verdict(tmp_path: Path) -> None:
    """A review: a rank's whole file left out for one bad line re-judged the others without it (3 ranks), and the
    slow rank was cleared."""
    for rank in (0, 1, 2):
        rows = [{"step": s, "step_s": 1.0, "own_work_s": 1.5 if rank == 1 else 1.0, "warmup": s == 1,
                 "traced": False} for s in range(1, 31)]
        lines = [json.dumps(r) for r in rows]
        if rank == 1:
            lines[5] = lines[5][:20]  # cut short mid-file
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    records = read_timer_records([tmp_path / "x.json"])
    assert sorted(records.rows) == [0, 1, 2] and len(records.rows[1]) == 29
    got = verdict(records, 10.0)
    assert got is not None and (got.status, got.rank) == ("raised", 1)


def test_the_verdict_keeps_the_latest_steps_the_timer_keeps(tmp_path: Path) -> None:
    # 2 ranks keep KEPT_CELLS // 2 steps: rank 1 slow only in the early steps that fall out of that.
    kept = KEPT_CELLS // 2
    for rank in (0, 1):
        rows = [{"step": s, "step_s": 1.0, "own_work_s": 1.5 if (rank == 1 and s <= 100) else 1.0,
                 "warmup": s == 1, "traced": False} for s in range(1, kept + 101)]
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = verdict(read_timer_records([tmp_path / "x.json"]), 10.0)
    assert got is not None and (got.steps, got.effect_pct, got.status) == (kept, 0.0, "quiet")


def test_a_gpu_s_records_count_the_loading_the_device_waited_for(tmp_path: Path) -> None:
    # A GPU's rows: the loader's next() took 0.5 s on the host, the device waited 0.1 s for it (the rest it spent on
    # the previous step's queued work), then 0.3 s in the token-count gather for a peer (data_s 0.4 s). The live
    # timer's pre-sync time counts 0.1 s of loading, and so must the parts and phases the analysis reads back: 0.4 s
    # of data once read as compute here, and the per-phase excess named the loading.
    from hf_distprof.analysis.across.evidence import _phases, data_part

    for rank in (0, 1):
        rows = [{"step": step, "step_s": 4.175, "data_s": 0.4, "data_load_s": 0.5, "forward_s": 1.0,
                 "backward_compute_s": 2.0, "pre_sync_s": 3.1, "own_work_s": 3.1, "tokens": 64, "samples": 4,
                 "warmup": step == 1, "traced": False} for step in range(1, 6)]
        (tmp_path / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = read_timer_records([tmp_path / "rank0_host_step8-10.pt.trace.json.gz"])
    figures = timer_figures(records, set())
    assert figures.parts[1][3] == (3.1, 0.0, pytest.approx(0.1), pytest.approx(3.0), 64.0, 4.0)
    assert _phases(records, [2, 3])["data"] == {0: pytest.approx([0.1, 0.1]), 1: pytest.approx([0.1, 0.1])}
    # A CPU's row: the loading is all counted, its own figure; without the phases, capped by the data wait.
    cpu = {"data_s": 0.6, "data_load_s": 0.5, "forward_s": 1.0, "backward_compute_s": 2.0, "pre_sync_s": 3.5}
    assert data_part(cpu) == 0.5
    assert data_part({"data_s": 0.4, "data_load_s": 0.5}) == 0.4 and data_part({"data_s": 0.4}) == 0.4
