"""``hf-distprof scaling``: the maths (step time, throughput, speedup, efficiency, comm share) and the command,
with a stand-in training command that writes synthetic timing files (no torch, no processes of its own)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hf_distprof.core import names
from hf_distprof.cli.main import main
from hf_distprof.runs.scaling_launch import default_template, fill, per_rank_batch
from hf_distprof.runs.load import load_run
from hf_distprof.runs.scaling import format_scaling, point_from_run, scaling_csv, scaling_result

from .fake_runs import record, scaled_step_s, write_run

FAKE = [sys.executable, str(Path(__file__).with_name("fake_runs.py")), "{nproc}", "{output_dir}", "{steps}",
        "{batch}"]


def fake_run(folder: Path, nproc: int, step_s: float, batch: int = 8, steps: int = 6, sync: float = 0.05) -> Path:
    ranks = {r: [record(s, samples=batch, tokens=batch * 100, step_s=step_s, compute=0.3, bwd=0.3 + sync)
                 for s in range(1, steps + 1)] for r in range(nproc)}
    return write_run(folder, ranks, summary={"warmup_steps_excluded": 1})


def test_a_point_has_the_slowest_ranks_step_time_and_all_ranks_throughput(tmp_path):
    ranks = {0: [record(s, step_s=0.4, samples=8, tokens=800) for s in range(1, 6)],
             1: [record(s, step_s=0.5, samples=8, tokens=800) for s in range(1, 6)]}
    point = point_from_run(load_run(write_run(tmp_path / "r", ranks)), 2)
    assert (point.steps, point.step_s, point.per_rank_batch, point.global_batch) == (4, 0.5, 8, 16)
    assert point.samples_per_s == pytest.approx(32.0) and point.tokens_per_s == pytest.approx(3200.0)
    assert point.comm_pct == pytest.approx(10.0)  # record(): backward 0.4 - compute 0.35 = 0.05 of 0.5 s
    with pytest.raises(ValueError, match=r"timing files of ranks \[0, 1\], expected ranks 0..3"):
        point_from_run(load_run(tmp_path / "r"), 4)


def test_the_comm_probe_share_is_taken_only_when_the_probe_resolved_it(tmp_path):
    ranks = {r: [record(s, step_s=0.5, samples=8) for s in range(1, 6)] for r in (0, 1)}

    def probe(comm: dict) -> float | None:
        folder = write_run(tmp_path / str(len(list(tmp_path.iterdir()))), ranks, summary={"comm_overhead": comm})
        return point_from_run(load_run(folder), 2).probe_comm_pct

    assert probe({"overhead_pct": 7.5, "resolved": True}) == 7.5
    assert probe({"overhead_pct": 7.5}) == 7.5  # written before the probe judged its spread
    assert probe({"overhead_pct": -0.6, "resolved": False}) is None


def test_weak_scaling_speedup_and_efficiency_against_the_smallest_count(tmp_path):
    # Per-rank batch 8: 1 process at 0.1 s per step (80 samples/s), 2 at 0.125 s (128/s), 4 at 0.2 s (160/s).
    points = [point_from_run(load_run(fake_run(tmp_path / f"n{n}", n, t)), n) for n, t in ((4, 0.2), (1, 0.1),
                                                                                            (2, 0.125))]
    result = scaling_result(points, "weak")
    assert [p.nproc for p in result.points] == [1, 2, 4] and result.base_nproc == 1 and result.notes == []
    assert [p.samples_per_s for p in result.points] == pytest.approx([80.0, 128.0, 160.0])
    assert [p.speedup for p in result.points] == pytest.approx([1.0, 1.6, 2.0])
    assert [p.efficiency_pct for p in result.points] == pytest.approx([100.0, 80.0, 50.0])
    assert format_scaling(result).splitlines()[1:3] == [
        "nproc  steps  median step s  samples/s  tokens/s  speedup  efficiency %  comm %",
        "    1      5         0.1000      80.00    8000.0    1.000         100.0    50.0",
    ]
    csv_lines = scaling_csv(result).splitlines()
    assert csv_lines[0] == ("mode,nproc,steps,step_s,samples_per_s,tokens_per_s,speedup,efficiency_pct,comm_pct,"
                            "probe_comm_pct,per_rank_batch,global_batch")
    assert csv_lines[2].startswith("weak,2,5,0.125,128.0,12800.0,1.6,80.0,")


def test_strong_scaling_is_the_step_time_ratio_and_a_changed_batch_is_noted(tmp_path):
    # Global batch 8: 1 process x 8 at 0.2 s; 2 processes x 4 at 0.125 s: speedup 1.6, efficiency 80%.
    one = point_from_run(load_run(fake_run(tmp_path / "n1", 1, 0.2, batch=8)), 1)
    two = point_from_run(load_run(fake_run(tmp_path / "n2", 2, 0.125, batch=4)), 2)
    result = scaling_result([one, two], "strong")
    assert (two.speedup, two.efficiency_pct, result.notes) == (pytest.approx(1.6), pytest.approx(80.0), [])
    weak = scaling_result([one, two], "weak")
    assert weak.notes == ["weak scaling keeps the per-rank batch fixed, but it was 4, 8 across the runs: "
                          "speedup and efficiency compare different workloads"]
    with pytest.raises(ValueError, match="mode must be one of"):
        scaling_result([one], "diagonal")


def test_placeholders_are_filled_and_the_strong_batch_shrinks():
    assert fill(["run", "--n={nproc}", "{output_dir}/x", "{steps}", "{batch}", "{other}"], 2, Path("/o"), 5, 4) == [
        "run", "--n=2", "/o/x", "5", "4", "{other}"]
    assert (per_rank_batch("weak", 8, 2), per_rank_batch("strong", 8, 2)) == (8, 4)
    template = default_template()
    assert template[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "{nproc}"]
    assert "--enable-step-timing" in template and "{output_dir}" in template and "{batch}" in template


def test_scaling_cli_runs_the_template_per_count_and_writes_csv_json_png(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["scaling", "--nprocs", "2,1", "--steps", "6", "--batch-size", "4", "--output-dir", str(out),
                 "--", *FAKE]) == 0
    text = capsys.readouterr().out
    assert "weak scaling (per-rank batch fixed); speedup and efficiency against 1 process(es)" in text
    # 1 process: 4 samples / 0.1 s = 40/s; 2: 8 / 0.125 s = 64/s -> speedup 1.6, efficiency 80%.
    assert "    2      5         0.1250      64.00    8192.0    1.600          80.0" in text
    assert scaled_step_s(2) == 0.125
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["nproc1", "nproc2", names.SCALING_CSV, names.SCALING_JSON, names.SCALING_PNG])
    assert (out / names.SCALING_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / names.SCALING_JSON).read_text())
    assert [(p["nproc"], p["efficiency_pct"]) for p in data["points"]] == [(1, 100.0), (2, pytest.approx(80.0))]
    assert (out / "nproc2" / "launch.log").exists()
    # A second study into the same folder must not mix runs; --reuse reads them again without running anything.
    assert main(["scaling", "--nprocs", "1,2", "--output-dir", str(out), "--", *FAKE]) == 2
    assert "holds an earlier run; pass --overwrite" in capsys.readouterr().err
    assert main(["scaling", "--nprocs", "1,2", "--output-dir", str(out), "--reuse"]) == 0
    assert "80.0" in capsys.readouterr().out
    # --reuse of a folder that holds no such run: a path given wrong, exit 2 as elsewhere (trial T: it was 1).
    assert main(["scaling", "--nprocs", "1,4", "--output-dir", str(out), "--reuse"]) == 2
    assert capsys.readouterr().err.endswith(f"{out / 'nproc4'}: no such folder\n")
    # Reading the runs and replacing them, or reading them and running a command, are contradictions: said at once.
    for extra, words in ((["--overwrite"], "argument --overwrite: not allowed with argument --reuse"),
                         (["--", *FAKE], "--reuse runs nothing: it reads the runs already in --output-dir, so a "
                                         "command after -- would be ignored")):
        with pytest.raises(SystemExit) as stop:
            main(["scaling", "--nprocs", "1,2", "--output-dir", str(out), "--reuse", *extra])
        assert stop.value.code == 2 and words in capsys.readouterr().err
    assert (out / "nproc2" / "launch.log").exists()


def test_a_failing_run_stops_the_study_with_its_output(tmp_path, capsys):
    failing = [sys.executable, "-c", "import sys; print('boom {nproc}'); sys.exit(3)", "{output_dir}"]
    assert main(["scaling", "--nprocs", "1", "--output-dir", str(tmp_path), "--", *failing]) == 1
    err = capsys.readouterr().err
    assert "the run with 1 process(es) exited with status 3" in err and "boom 1" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nprocs", "0,2"], "--nprocs: must be distinct integers >= 1 separated by commas, got '0,2'"),
        (["--steps", "1"], "--steps: must be an integer >= 2 (the first step is the warm-up, left out), got '1'"),
        (["--steps", "x"], "--steps: must be an integer >= 2 (the first step is the warm-up, left out), got 'x'"),
        (["--batch-size", "0"], "--batch-size: must be an integer >= 1, got '0'"),
        (["--mode", "diagonal"], "--mode: invalid choice: 'diagonal'"),
        (["--", "torchrun", "train.py", "{output_dir}"], "the command template must contain {nproc}"),
        (["--", "run", "{nproc}"], "the command template must contain {output_dir}"),
        (["--mode", "strong", "--", "run", "{nproc}", "{output_dir}"], "--mode strong needs {batch}"),
        (["--mode", "strong", "--batch-size", "3"], "--batch-size 3 (the global batch under --mode strong) must be "
                                                    "divisible by every process count in --nprocs; it is not by [2]"),
    ],
)
def test_bad_flags_exit_2_with_the_flag_and_no_traceback(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["scaling", "--output-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
