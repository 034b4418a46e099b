"""``benchmarks/gpu_check.py`` without a GPU: its dry run (checks, models, parameter counts, budgets), its refusal on
CPU, its flag check, writers and runner, and what its checks read back from files written here."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


CHECK_NAMES = ["environment", "demo on 1 GPU", "mfu", "analyze and HTA", "overhead", "no host sync", "memory views",
               "oom snapshot", "fsdp2", "hang and flight recorder", "nvtx", "gpu tests"]
BASE = "ModernBERT (hidden 768, 22 layers, 4 heads, vocab 8192), batch 32 x 1024 tokens, bf16 (136.7 M parameters)"
TINY = "ModernBERT (hidden 128, 4 layers, 4 heads, vocab 8192), batch 8 x 128 tokens (1.73 M parameters)"
FAST = "ModernBERT (hidden 768, 20 layers, 4 heads, vocab 8192), batch 16 x 512 tokens, bf16 (124.9 M parameters)"


def test_the_dry_run_names_every_check_its_budget_and_models_and_finds_every_command_and_flag(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    checks = re.findall(r"^\s*(\d+)\. (.+?) \((\d+) s\): ", proc.stdout, flags=re.MULTILINE)
    assert [int(n) for n, _, _ in checks] == list(range(1, 13))
    assert [name for _, name, _ in checks] == CHECK_NAMES
    blocks = re.split(r"^\s*\d+\. ", proc.stdout, flags=re.MULTILINE)[1:]
    models = {name: re.findall(r"^\s+model: (.+)$", block, flags=re.MULTILINE) for (_, name, _), block
              in zip(checks, blocks)}
    assert models == {
        "environment": ["none"], "demo on 1 GPU": [BASE], "mfu": [BASE], "analyze and HTA": [BASE],
        "overhead": [FAST, BASE], "no host sync": ["MLP 512-2048-512, the snippet's own (2.10 M parameters)"],
        "memory views": [BASE], "oom snapshot": ["Linear 1024 x 1024, the snippet's own (1.05 M parameters)"],
        "fsdp2": [BASE], "hang and flight recorder": [TINY], "nvtx": [BASE, TINY],
        "gpu tests": ["the gpu-marked tests' own tiny models"],
    }
    total = sum(int(budget) for _, _, budget in checks)
    assert total == 467
    assert "total budget: 467 s for 12 checks (limit 480 s)" in proc.stdout
    assert proc.stdout.startswith("gpu_check plan: 12 checks, budget 467 s (limit 480 s)")
    assert "0 problem(s)" in proc.stdout and "PROBLEM" not in proc.stderr
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_the_plans_parameter_counts_are_the_models_built_from_their_configs(gc):
    counts = {check.name: [m.params() for m in check.models] for check in gc.CHECKS}
    base, tiny = 136_686_080, 1_729_792
    assert counts == {
        "environment": [], "demo on 1 GPU": [base], "mfu": [base], "analyze and HTA": [base],
        "overhead": [124_886_528, base],
        "no host sync": [512 * 2048 + 2048 + 2048 * 512 + 512], "memory views": [base],
        "oom snapshot": [1024 * 1024 + 1024], "fsdp2": [base], "hang and flight recorder": [tiny],
        "nvtx": [base, tiny], "gpu tests": [None],
    }
    assert max(n for c in counts.values() for n in c if n) >= 100e6


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_real_run_exits_2_and_says_cuda(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert "CUDA" in proc.stderr and "--dry-run" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_flag_the_command_does_not_have_fails_the_dry_run_naming_it(gc, tmp_path, capsys):
    bad = gc.Check("analyze with a typo", 10, lambda ctx: [gc.Cmd("analyze", (str(ctx.out), "--no-such-flag"), 5)],
                   lambda *a: None)
    assert gc.main(["--dry-run", "--out", str(tmp_path)], checks=[bad]) == 1  # the real `analyze -h`
    err = capsys.readouterr().err
    assert "check 1 (analyze with a typo): --no-such-flag is not a flag of" in err and "analyze" in err


def test_a_flag_renamed_in_the_training_script_breaks_the_real_plan(gc, tmp_path):
    ctx = gc.Ctx(tmp_path)
    used = {f for c in gc.CHECKS for cmd in c.plan(ctx) for seg in [cmd.args, *([cmd.via[1]] if cmd.via else [])]
            for f in seg if f.startswith("-")}
    # Every tool's help lists every flag the plan uses but --memory-snapshot (as if it had been renamed).
    problems, _ = gc.validate(gc.CHECKS, ctx, help_of=lambda tool: " ".join(sorted(used - {"--memory-snapshot"})))
    train = " ".join(gc.TOOLS["train"].argv)
    assert problems == [f"check 7 (memory views): --memory-snapshot is not a flag of `{train}` (not in its help)"]


def test_a_test_hook_variable_no_script_reads_is_a_problem(gc, tmp_path):
    cmd = gc.Cmd("train", ("--max-steps", "1"), 5, {"HF_DISTPROF_SIMULATE_NOTHING": "1"})
    check = gc.Check("hook", 5, lambda ctx: [cmd], lambda *a: None)
    problems, _ = gc.validate([check], gc.Ctx(tmp_path), help_of=lambda tool: "--max-steps")
    assert problems == ["check 1 (hook): no script of train reads HF_DISTPROF_SIMULATE_NOTHING"]


def test_the_budgets_fit_in_eight_minutes_with_room_for_overruns(gc, tmp_path):
    ctx = gc.Ctx(tmp_path)
    # Reading traces and snapshots between commands runs under no timeout: 8 s of the 480 are left for it.
    assert len(gc.CHECKS) >= 12 and sum(c.budget_s for c in gc.CHECKS) <= gc.TOTAL_LIMIT_S - 8
    for check in gc.CHECKS:
        assert sum(cmd.timeout_s for cmd in check.plan(ctx)) <= check.budget_s, check.name


def test_the_writers_give_one_exact_record_per_check(gc, tmp_path):
    results = [gc.Result("environment", True, {"gpu": "NVIDIA H100", "mfu_pct": 0.123456}, 1.5, None),
               gc.Result("fsdp2", False, {"built": "ddp", "units": [1, 2]}, 20.25, "built 'ddp' | not\nfsdp2")]
    gc.write_results(results, tmp_path)
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == [
        {"name": "environment", "passed": True, "numbers": {"gpu": "NVIDIA H100", "mfu_pct": 0.123456},
         "seconds": 1.5, "error": None},
        {"name": "fsdp2", "passed": False, "numbers": {"built": "ddp", "units": [1, 2]}, "seconds": 20.25,
         "error": "built 'ddp' | not\nfsdp2"},
    ]
    assert (tmp_path / "gpu_check.md").read_text() == (
        "# GPU check\n\n1 of 2 checks passed.\n\n"
        "| # | check | passed | seconds | numbers | error |\n|---|---|---|---|---|---|\n"
        "| 1 | environment | yes | 1.5 | gpu: NVIDIA H100; mfu_pct: 0.1235 |  |\n"
        "| 2 | fsdp2 | NO | 20.2 | built: ddp; units: [1, 2] | built 'ddp' \\| not<br>fsdp2 |\n"
    )


def test_a_failing_check_does_not_stop_the_next_ones(gc, tmp_path, monkeypatch):
    monkeypatch.setitem(gc.SNIPPETS, "hello", "print('{\"said\": \"hello\"}')")
    monkeypatch.setitem(gc.SNIPPETS, "stuck", "import time; time.sleep(60)")

    def fails(ctx, cmds, n, sh):
        n["seen"] = 1
        gc.expect(False, "expected 2, got 1")

    def breaks(ctx, cmds, n, sh):
        raise KeyError("per_rank")

    def runs(ctx, cmds, n, sh):
        n.update(gc.last_json(gc.succeeded(sh, cmds[0])))

    def hangs(ctx, cmds, n, sh):
        sh(cmds[0])

    checks = [gc.Check("fails", 1, lambda ctx: [], fails), gc.Check("breaks", 1, lambda ctx: [], breaks),
              gc.Check("stuck", 1, lambda ctx: [gc.Cmd("snippet", ("stuck",), 1)], hangs),
              gc.Check("runs", 10, lambda ctx: [gc.Cmd("snippet", ("hello",), 10)], runs)]
    results = gc.run_checks(checks, gc.Ctx(tmp_path))
    assert [(r.name, r.passed, r.numbers) for r in results] == [
        ("fails", False, {"seen": 1}), ("breaks", False, {}), ("stuck", False, {}), ("runs", True, {"said": "hello"})]
    assert results[0].error == "expected 2, got 1" and results[1].error == "KeyError: 'per_rank'"
    assert results[2].error.startswith("timed out after 1 s") and results[2].seconds < 10
    assert results[3].error is None
    assert [r["name"] for r in json.loads((tmp_path / "gpu_check.json").read_text())] == [c.name for c in checks]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["03_stuck_1.log", "04_runs_1.log"]


# ---- what the checks read back, on files written here --------------------------------------------------------


@pytest.fixture(scope="module")
def checks(gc):
    import gpu_check_checks  # on the path once gpu_check is loaded

    return gpu_check_checks


def test_our_flops_per_token_come_back_from_the_mfu_of_one_rank_and_of_two(checks):
    peak, non_embedding, params = 989.0, 130_394_624, 136_686_080  # the Trainer counts 6 x non-embedding params
    one = [{"steps": 10, "total_s": 1.0, "tokens": 327_680}]
    two = [{"steps": 10, "total_s": 1.0, "tokens": 327_680}, {"steps": 10, "total_s": 1.2, "tokens": 327_680}]
    for ranks in (one, two):
        flops = 6 * non_embedding * sum(r["tokens"] for r in ranks)
        mean_s = sum(r["total_s"] for r in ranks) / len(ranks)
        summary = {"per_rank": ranks, "peak_tflops": peak, "mfu_pct": flops / (len(ranks) * mean_s * peak * 1e12) * 100}
        got = checks.mfu_against_analytic(summary, params)
        assert got["tokens_per_step"] == 32_768
        assert got["ratio"] == pytest.approx(non_embedding / params)  # 0.954: within 10%
        assert got["analytic_gflop_per_token"] == pytest.approx(6 * params / 1e9)
    with pytest.raises(checks.CheckFailed, match="no MFU to compare: mfu_pct None"):
        checks.mfu_against_analytic({"per_rank": one, "peak_tflops": peak, "mfu_pct": None}, params)


def test_the_overhead_figures_are_read_from_the_benchs_lines(checks):
    out = ("3 A/B pairs of 20 steps, 1 CUDA process, ModernBERT hidden 768 x 22 layers, batch 32 x 1024 tokens, bf16\n"
           "median step time: none 91.2 ms, all 91.5 ms\n"
           "median step-time ratio (all / none): 1.0031 (95% interval 0.9990-1.0102; pairs min 0.9990, max 1.0102; "
           "target <= 1.01)\n"
           "direct cost, rank 0: 2.41 ms per step = 2.63% of all's median step (the mean over all steps); once per "
           "train() call: 120.0 ms\n"
           "  ordinary step (median of per-step sums): 0.085 ms (timer 0.060, memory 0.005, profiler 0.004); most: \n"
           "  logging step (median): 21.300 ms over 12 logging steps, 88 ordinary ones\n")
    assert checks.parse_overhead(out) == {"ab_ratio": 1.0031, "ab_low": 0.999, "ab_high": 1.0102,
                                          "step_ms_none": 91.2, "step_ms_all": 91.5, "direct_ms_per_step": 2.41,
                                          "direct_pct": 2.63, "ordinary_step_ms": 0.085, "logging_step_ms": 21.3}
    with pytest.raises(checks.CheckFailed, match="no ratio, median or direct-cost line"):
        checks.parse_overhead(out.replace("direct cost", "cost"))


def test_the_trackers_peak_is_set_against_the_allocators_peak_of_the_same_step(checks):
    mib = 2**20
    modules = {"step": 6, "peak": {"Parameter": 1000 * mib, "Gradient": 1000 * mib, "Activation": 3000 * mib,
                                   "Temp": 0, "Total": 5000 * mib}}
    rows = [{"step": 5, "peak_allocated_mb": 9000.0}, {"step": 6, "peak_allocated_mb": 5200.0}]
    assert checks.memory_against_allocator(modules, rows) == {
        "tracker_step": 6, "tracker_peak_mib": 5000.0, "allocator_peak_mib": 5200.0, "difference_pct": -3.85,
        "by_category_mib": {"Parameter": 1000.0, "Gradient": 1000.0, "Activation": 3000.0}}
    with pytest.raises(checks.CheckFailed, match="no memory sample with peak_allocated_mb at the tracker's step 6"):
        checks.memory_against_allocator(modules, rows[:1])


def _write_trace(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


FSDP_EVENTS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4"},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#4"},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5"},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "hf_distprof/forward"},
    {"ph": "X", "cat": "user_annotation", "name": "hf_distprof/backward"},  # host side only: not on the GPU
    {"ph": "X", "cat": "user_annotation", "name": "FSDP::all_gather (model.layers.0)"},
    {"ph": "X", "cat": "user_annotation", "name": "FSDP::all_gather (model.layers.1)"},
    {"ph": "X", "cat": "user_annotation", "name": "FSDP::post_backward_reduce (model.layers.0)"},
    {"ph": "X", "cat": "user_annotation", "name": "FSDP::pre_forward (model.layers.0)"},
    {"ph": "X", "cat": "user_annotation", "name": "FSDP::backward_prefetch for model.layers.0"},  # as on the H100
    {"ph": "i", "cat": "user_annotation", "name": "FSDP::all_gather (an instant: not a span)"},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_ReduceScatter_RING_LL_Sum_bf16(...)"},
    {"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm_bf16_128x128"},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)"},
]


def test_trace_stats_count_kernels_steps_phases_and_communication_by_kind(checks, tmp_path):
    trace = _write_trace(tmp_path / "rank0.pt.trace.json.gz", FSDP_EVENTS)
    assert checks.trace_stats(trace) == {
        "kernels": 3, "gpu_memcpy": 1, "profiler_steps": 2, "phases_on_gpu": ["hf_distprof/forward"],
        "fsdp_annotations": {"FSDP::all_gather": 2, "FSDP::backward_prefetch": 1, "FSDP::post_backward_reduce": 1,
                             "FSDP::pre_forward": 1},
        "nccl_kernels": {"AllGather": 1, "ReduceScatter": 1}}


def _fsdp_run(ctx, built: str, fsdp_peak: float, events: list[dict], world_size: int = 1) -> None:
    run, demo = ctx.traces / "fsdp", ctx.traces / "demo"
    _write_trace(run / "rank0_host.pt.trace.json.gz", events)
    demo.mkdir(parents=True)
    report = {"built": built, "world_size": world_size, "fsdp_units": [1, 2, 3]}
    (run / "parallelism.json").write_text(json.dumps(report))
    (run / "memory_summary.json").write_text(json.dumps({"per_rank": [{"peak_allocated_mb": fsdp_peak}]}))
    (demo / "memory_summary.json").write_text(json.dumps({"per_rank": [{"peak_allocated_mb": 40000.0}]}))
    (demo / "parallelism.json").write_text(json.dumps({"built": "none"}))


def test_the_fsdp_check_reads_what_was_built_the_communication_and_the_peaks(checks, tmp_path):
    ctx = checks.Ctx(tmp_path)
    _fsdp_run(ctx, "fsdp2", 36000.0, FSDP_EVENTS)
    numbers: dict = {}
    checks.run_fsdp(ctx, checks.plan_fsdp(ctx), numbers, lambda cmd: (0, "x: [RANK 0] model: 136.69 M parameters\n"))
    assert {k: numbers[k] for k in ("parameters", "built", "fsdp_units", "fsdp_annotations", "nccl_kernels",
                                    "peak_mib_fsdp", "peak_mib_unsharded", "peak_ratio", "unsharded_built")} == {
        "parameters": 136.69e6, "built": "fsdp2", "fsdp_units": 3,
        "fsdp_annotations": {"FSDP::all_gather": 2, "FSDP::backward_prefetch": 1, "FSDP::post_backward_reduce": 1,
                             "FSDP::pre_forward": 1},
        "nccl_kernels": {"AllGather": 1, "ReduceScatter": 1}, "peak_mib_fsdp": 36000.0, "peak_mib_unsharded": 40000.0,
        "peak_ratio": 0.9, "unsharded_built": "none"}


ONE_RANK_FSDP = [e for e in FSDP_EVENTS if "all_gather" not in e["name"]]  # FSDP2 gathers nothing on a group of 1


def test_one_rank_of_fsdp2_passes_without_an_all_gather(checks, tmp_path):
    ctx = checks.Ctx(tmp_path)
    _fsdp_run(ctx, "fsdp2", 36000.0, ONE_RANK_FSDP)  # what the H100 run wrote: no FSDP::all_gather range
    numbers: dict = {}
    checks.run_fsdp(ctx, checks.plan_fsdp(ctx), numbers, lambda cmd: (0, "x: [RANK 0] model: 136.69 M parameters\n"))
    assert numbers["fsdp_annotations"] == {"FSDP::backward_prefetch": 1, "FSDP::post_backward_reduce": 1,
                                           "FSDP::pre_forward": 1}


@pytest.mark.parametrize(("built", "events", "world", "log", "error"), [
    ("ddp", FSDP_EVENTS, 1, "model: 136.69 M parameters", "parallelism.json says built 'ddp', not fsdp2"),
    ("fsdp2", [e for e in ONE_RANK_FSDP if "post_backward" not in e["name"]], 1, "model: 136.69 M parameters",
     "the trace names ['FSDP::backward_prefetch', 'FSDP::pre_forward'], "
     "not ['FSDP::post_backward_reduce', 'FSDP::pre_forward']"),
    ("fsdp2", ONE_RANK_FSDP, 2, "model: 136.69 M parameters",
     "the trace names ['FSDP::backward_prefetch', 'FSDP::post_backward_reduce', 'FSDP::pre_forward'], "
     "not ['FSDP::all_gather', 'FSDP::post_backward_reduce', 'FSDP::pre_forward']"),
    ("fsdp2", FSDP_EVENTS, 1, "model: 1.73 M parameters",
     "the plan says 136686080 parameters, the run built 1730000.0"),
])
def test_the_fsdp_check_fails_naming_what_is_wrong(checks, tmp_path, built, events, world, log, error):
    ctx = checks.Ctx(tmp_path)
    _fsdp_run(ctx, built, 36000.0, events, world)
    with pytest.raises(checks.CheckFailed) as failed:
        checks.run_fsdp(ctx, checks.plan_fsdp(ctx), {}, lambda cmd: (0, log))
    assert str(failed.value) == error


def test_only_picks_checks_by_number_and_the_scale_stretches_budgets_and_timeouts(gc, tmp_path):
    picked = gc.select(gc.CHECKS, "5,2", 1.5)
    assert [c.name for c in picked] == [gc.CHECKS[1].name, gc.CHECKS[4].name]  # in the plan's order
    ctx = gc.Ctx(tmp_path)
    assert [c.budget_s for c in picked] == [gc.CHECKS[1].budget_s * 1.5, gc.CHECKS[4].budget_s * 1.5]
    assert [c.timeout_s for c in picked[1].plan(ctx)] == [c.timeout_s * 1.5 for c in gc.CHECKS[4].plan(ctx)]
    assert gc.select(gc.CHECKS, None, 1.0) == list(gc.CHECKS)
    for only, scale, message in [("13", 1.0, "no check numbered 13"), ("2", 0.0, "must be > 0")]:
        with pytest.raises(ValueError, match=message):
            gc.select(gc.CHECKS, only, scale)


def test_a_check_past_the_scaled_limit_is_skipped_saying_so(gc, tmp_path):
    checks = [gc.Check("long", 10, lambda ctx: [], lambda ctx, cmds, n, sh: None)]
    (result,) = gc.run_checks(checks, gc.Ctx(tmp_path), limit_s=5)
    assert not result.passed and result.error == "skipped: its 10 s would pass the run's 5 s limit"


def test_the_dry_run_of_a_scaled_rerun_states_its_budget_and_limit(gc, tmp_path, capsys):
    ctx = gc.Ctx(tmp_path.resolve())
    flags = " ".join(a for c in gc.CHECKS for cmd in c.plan(ctx) for a in (*cmd.args, *(cmd.via[1] if cmd.via else ()))
                     if a.startswith("-"))
    assert gc.main(["--dry-run", "--out", str(tmp_path), "--only", "2,5", "--budget-scale", "2"],
                   help_of=lambda tool: flags) == 0
    out = capsys.readouterr().out
    total = 2 * (gc.CHECKS[1].budget_s + gc.CHECKS[4].budget_s)
    assert out.startswith(f"gpu_check plan: 2 checks, budget {total:.0f} s (limit 960 s)")
    assert f"(timeout {2 * gc.CHECKS[4].plan(ctx)[0].timeout_s:.0f} s)" in out
