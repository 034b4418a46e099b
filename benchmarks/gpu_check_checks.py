"""The checks of ``benchmarks/gpu_check.py``, in the order they run, and the models they train.

Two workloads: the demo's tiny ModernBERT (1.7 M parameters, launch-bound on a GPU: it idled 94-96% of each step
on an H100) where only the code path matters (hang, the Nsight run), and :data:`BASE`, a ModernBERT-base sized
model (hidden 768, 22 layers, 137 M parameters) in bf16 with 32 x 1024 tokens a step, which is meant to keep the
GPU busy, for every number a user would read: MFU, overhead, the profiler's slowdown, trace sizes, analyze against
HTA, the memory views against the allocator, FSDP2 against the unsharded run.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpu_check_core import (
    Check,
    CheckFailed,
    Cmd,
    Ctx,
    Model,
    Shell,
    Workload,
    expect,
    last_json,
    meta_params,
    read_json,
    succeeded,
    trace_stats,
    train_args,
)

HTA_TOLERANCE_PP = 0.5
MFU_TOLERANCE = 0.10
"""Our FLOP count (the Trainer's 6 x non-embedding parameters x tokens) against 6 x all parameters x tokens."""
OVERHEAD_TARGET = 1.01
IDLE_LIMIT_PCT = 20.0
MEMORY_TOLERANCE = 0.10

TINY = Workload()
BASE = Workload(hidden=768, layers=22, seq=1024, batch=32, bf16=True)
# The always-on callbacks' cost where it shows: a fast step (124.9 M parameters, a quarter of BASE's tokens per step),
# where host time of ours can delay the next forward's launch (issue 41).
FAST = Workload(hidden=768, layers=20, seq=512, batch=16, bf16=True)
ORDINARY_STEP_TARGET_MS = 0.1  # the always-on set's direct cost on an ordinary (not logging) step
MEAN_TARGET_PCT = 1.0  # ... and averaged over all steps, logging steps included, as a share of the step
"""ModernBERT-base's width and depth (its MLP is narrower, 1152, and it has 12 heads): 136.7 M parameters."""
SYNC_MLP = Model("MLP 512-2048-512, the snippet's own", lambda: meta_params(_sync_mlp))
OOM_LINEAR = Model("Linear 1024 x 1024, the snippet's own", lambda: meta_params(_oom_linear))
TEST_MODELS = Model("the gpu-marked tests' own tiny models")
SCHEDULE = ("--profiler-wait-steps", "2", "--profiler-warmup-steps", "1", "--profiler-active-steps", "2")
"""A short window (steps 4-5) for the runs that need one but not the defaults' (steps 8-10)."""


def _sync_mlp() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))


def _oom_linear() -> Any:
    import torch

    return torch.nn.Linear(1024, 1024)


def expect_parameters(seen: float | None, model: Model, n: dict[str, Any], rounding: float = 0.5) -> None:
    """The model a command built has the plan's parameter count (``seen`` rounded to within ``rounding``)."""
    planned = model.params()
    n["parameters"] = seen
    expect(seen is not None and planned is not None and abs(seen - planned) <= rounding,
           f"the plan says {planned} parameters, the run built {seen}")


# ---- readers, pure ---------------------------------------------------------------------------------------------


def mfu_against_analytic(summary: dict[str, Any], params: int) -> dict[str, Any]:
    """Our FLOPs per token, as ``timing_summary.json``'s MFU implies them, against the analytic 6 x parameters.

    MFU = FLOPs / (ranks x mean seconds per rank over the counted steps x peak), so the FLOPs it counted are
    ``mfu / 100 x ranks x mean(total_s) x peak``; over the ranks' tokens that is FLOPs per token.

    Raises:
        CheckFailed: The summary has no MFU, peak or tokens.
    """
    ranks = summary.get("per_rank") or []
    mfu, peak = summary.get("mfu_pct"), summary.get("peak_tflops")
    tokens = sum(r.get("tokens") or 0 for r in ranks)
    if not (mfu and peak and tokens):
        raise CheckFailed(f"no MFU to compare: mfu_pct {mfu}, peak_tflops {peak}, tokens {tokens}")
    mean_s = sum(r["total_s"] for r in ranks) / len(ranks)
    ours = mfu / 100 * len(ranks) * mean_s * peak * 1e12 / tokens
    analytic = 6.0 * params
    steps = sum(r["steps"] for r in ranks)
    return {"mfu_pct": mfu, "tokens_per_step": tokens / steps, "ours_gflop_per_token": ours / 1e9,
            "analytic_gflop_per_token": analytic / 1e9, "ratio": ours / analytic}


RATIO_LINE = re.compile(r"median step-time ratio \([^)]*\): ([\d.]+) \(95% interval ([\d.]+)-([\d.]+)")
MEDIANS_LINE = re.compile(r"median step time: none ([\d.]+) ms, \S+ ([\d.]+) ms")
DIRECT_LINE = re.compile(r"direct cost, rank 0: ([\d.]+) ms per step = ([\d.]+)%")
ORDINARY_LINE = re.compile(r"ordinary step \(median of per-step sums\): ([\d.]+) ms")
LOGGING_LINE = re.compile(r"logging step \(median\): ([\d.]+) ms")


def parse_overhead(output: str) -> dict[str, Any]:
    """The figures of ``bench_callback_overhead.py``'s output: the A/B ratio and its interval, the median steps,
    rank 0's direct cost.

    Raises:
        CheckFailed: A line is missing.
    """
    ratio, medians, direct = RATIO_LINE.search(output), MEDIANS_LINE.search(output), DIRECT_LINE.search(output)
    expect(ratio and medians and direct, "the bench printed no ratio, median or direct-cost line")
    assert ratio and medians and direct
    ordinary, logging = ORDINARY_LINE.search(output), LOGGING_LINE.search(output)
    return {"ab_ratio": float(ratio[1]), "ab_low": float(ratio[2]), "ab_high": float(ratio[3]),
            "step_ms_none": float(medians[1]), "step_ms_all": float(medians[2]),
            "direct_ms_per_step": float(direct[1]), "direct_pct": float(direct[2]),
            "ordinary_step_ms": float(ordinary[1]) if ordinary else None,
            "logging_step_ms": float(logging[1]) if logging else None}


def memory_against_allocator(modules: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``--memory-tracker``'s peak of its step, by category, against the allocator's peak over the same step (the
    memory logger's ``peak_allocated_mb`` at that step, reset at every sample: run it with ``--memory-log-steps 1``).

    Raises:
        CheckFailed: No logged sample at the tracker's step, or no peak.
    """
    step, peak = modules.get("step"), modules.get("peak") or {}
    at = [r for r in rows if r.get("step") == step and r.get("peak_allocated_mb") is not None]
    expect(at, f"no memory sample with peak_allocated_mb at the tracker's step {step}")
    expect(peak.get("Total"), f"the tracker's peak has no Total: {peak}")
    mib = 2**20
    tracked, allocator = peak["Total"] / mib, float(at[0]["peak_allocated_mb"])
    return {"tracker_step": step, "tracker_peak_mib": round(tracked, 1), "allocator_peak_mib": round(allocator, 1),
            "difference_pct": round((tracked - allocator) / allocator * 100, 2),
            "by_category_mib": {k: round(v / mib, 1) for k, v in peak.items() if k != "Total" and v}}


def logged_parameters(output: str) -> float | None:
    """The parameter count the training script logged (``model: 136.69 M parameters``)."""
    found = re.findall(r"model: ([\d.]+) M parameters", output)
    return float(found[-1]) * 1e6 if found else None


def demo_trace(ctx: Ctx) -> Path:
    traces = sorted((ctx.traces / "demo").glob("*.pt.trace.json.gz"))
    expect(traces, f"no trace in {ctx.traces / 'demo'} (check 2 writes it)")
    return traces[0]


# ---- the checks ------------------------------------------------------------------------------------------------


def plan_environment(ctx: Ctx) -> list[Cmd]:
    return [Cmd("snippet", ("env_snippet",), 15)]


def run_environment(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n.update(last_json(succeeded(sh, cmds[0])))
    expect(n["cuda_available"], "torch.cuda.is_available() is False")
    missing = [m for m in ("hf_distprof", "datasets", "orjson", "msgspec", "pynvml") if not n["modules"].get(m)]
    expect(not missing, f"not importable: {missing} (install the wheels: DEVELOPING.md)")
    # The GPU's clocks as the step timer samples them on logging steps (the evidence for a slower machine).
    health = n.get("gpu_health") or {}
    expect(health.get("sm_clock_mhz", 0) > 0, f"NVML read no SM clock on this GPU: {health!r}")
    absent = [tool for tool in ("python", "accelerate") if not n["on_path"][tool]]
    expect(not absent, f"the launch scripts call {absent}, not on PATH")


def plan_demo(ctx: Ctx) -> list[Cmd]:
    env = {"NPROC": "1", "MAX_STEPS": "40", "OUTPUT_DIR": str(ctx.traces), "TRAIN_OUTPUT": str(ctx.train),
           "MIXED_PRECISION": "bf16", "SKIP_PREFLIGHT": "1"}
    return [Cmd("demo", ("--profiler-run-name", "demo", "--nvtx", *BASE.train_flags()), 70, env)]


def run_demo(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    out = succeeded(sh, cmds[0])
    expect_parameters(logged_parameters(out), BASE.model, n, rounding=5e3)  # logged in M with 2 decimals
    trace = demo_trace(ctx)
    n["trace"] = trace.name
    n.update({k: v for k, v in trace_stats(trace).items() if k not in ("fsdp_annotations", "nccl_kernels")})
    expect(n["kernels"] > 0, f"no CUDA kernel in {trace.name}")
    summary = read_json(ctx.traces / "demo" / "timing_summary.json")
    rank0 = summary["per_rank"][0]
    n.update({k: summary.get(k) for k in ("step_mean_s", "tokens_per_s", "mfu_pct", "peak_tflops")})
    # cpu_wait_s: None when the phases are timed on CUDA events rather than the host clock.
    n["phases_s"] = {k: rank0.get(k) for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "cpu_wait_s")}
    expect(all((rank0.get(k) or 0) > 0 for k in ("forward_s", "backward_s", "optimizer_s")),
           f"device phases missing or zero: {n['phases_s']}")


def run_mfu(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    summary = read_json(ctx.traces / "demo" / "timing_summary.json")
    params = BASE.model.params()
    assert params is not None
    n.update(mfu_against_analytic(summary, params))
    expect(n["tokens_per_step"] == BASE.tokens_per_step,
           f"{n['tokens_per_step']} tokens a step counted, {BASE.tokens_per_step} trained")
    expect(abs(n["ratio"] - 1) <= MFU_TOLERANCE, f"our FLOPs per token are {n['ratio']:.3f} x 6 x parameters")


def plan_analyze(ctx: Ctx) -> list[Cmd]:
    run = str(ctx.traces / "demo")
    return [Cmd("analyze", (run, "--report", str(ctx.out / "report"), "--no-progress"), 15),
            Cmd("snippet", ("hta_snippet", "{trace}", str(ctx.out / "hta_traces"), str(ctx.out / "hta.json")), 15)]


def run_analyze(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    from hf_distprof.core.names import COMPACT_SUFFIX

    began = time.monotonic()
    succeeded(sh, cmds[0])
    n["analyze_s"] = round(time.monotonic() - began, 2)  # the whole command: interpreter, imports, report
    trace = demo_trace(ctx)
    steps = trace_stats(trace)["profiler_steps"] or 1
    compact = trace.with_name(trace.name + COMPACT_SUFFIX)
    n["trace_mb_per_step"] = round(trace.stat().st_size / steps / 1e6, 2)
    n["compact_mb_per_step"] = round(compact.stat().st_size / steps / 1e6, 2) if compact.is_file() else None
    result = read_json(ctx.out / "report" / "analysis.json")
    expect(result["ranks"], f"no rank analysed; errors: {result.get('errors')}")
    rank = result["ranks"][0]
    gpu = rank.get("gpu_total") or {}
    ours = {k: gpu.get(k) for k in ("idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct")}
    n.update(device=rank.get("device"), n_kernels=gpu.get("n_kernels"), ours=ours,
             findings=[f.get("kind") for f in result.get("findings", [])])
    expect(rank.get("device") == "gpu" and gpu, f"not analysed as a GPU trace (device {rank.get('device')!r})")
    rc, out = sh(cmds[1].fill(trace=str(trace)))
    if rc == 3:
        n["hta"] = "not installed: no comparison (holistictraceanalysis==0.5.0, DEVELOPING.md)"
    else:
        expect(rc == 0, "HTA failed:\n" + "\n".join(out.splitlines()[-15:]))
        hta = n["hta"] = read_json(ctx.out / "hta.json")
        diffs = {k: abs(ours[k] - hta[k]) for k in hta if hta[k] is not None and ours.get(k) is not None}
        n["largest_difference_pp"] = max(diffs.values(), default=None)
        expect(diffs and max(diffs.values()) <= HTA_TOLERANCE_PP, f"HTA and ours differ by more than 0.5 pp: {diffs}")
    expect(compact.is_file(), f"no compact file beside {trace.name}")
    idle = ours["idle_pct"]
    expect(idle is not None and idle < IDLE_LIMIT_PCT,
           f"the GPU idles {idle}% of the traced steps: not a busy workload (limit {IDLE_LIMIT_PCT:.0f}%)")


def plan_overhead(ctx: Ctx) -> list[Cmd]:
    return [Cmd("bench-overhead", ("--device", "cuda", *FAST.bench_flags(), "--pairs", "4", "--steps", "30"), 70)]


def run_overhead(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n["bench"] = ("1 CUDA process, a fast step, 4 A/B pairs of 30 steps (5 left out of each), the always-on callbacks "
                  "at their defaults against none")
    n.update(parse_overhead(succeeded(sh, cmds[0])))
    n["targets"] = {"ordinary_step_ms": ORDINARY_STEP_TARGET_MS, "mean_pct": MEAN_TARGET_PCT,
                    "ab_ratio": OVERHEAD_TARGET}
    slowdown = read_json(ctx.traces / "demo" / "timing_summary.json").get("profiler_slowdown") or {}
    n["profiler_slowdown"] = {k: slowdown.get(k) for k in (
        "ratio", "median_step_s_inside", "median_step_s_before", "median_step_s_after", "threshold_ratio")}
    expect(slowdown.get("ratio"), "no profiler_slowdown ratio in the demo's timing_summary.json")
    expect(n["ab_ratio"] <= OVERHEAD_TARGET, f"the always-on callbacks slow the step {n['ab_ratio']:.4f}x "
                                             f"(target <= {OVERHEAD_TARGET})")
    expect(n["ordinary_step_ms"] is not None and n["ordinary_step_ms"] <= ORDINARY_STEP_TARGET_MS,
           f"the always-on callbacks cost {n['ordinary_step_ms']} ms of an ordinary step (target <= "
           f"{ORDINARY_STEP_TARGET_MS} ms)")
    expect(n["direct_pct"] <= MEAN_TARGET_PCT, f"the always-on callbacks cost {n['direct_pct']}% of the step over all "
                                               f"steps (target <= {MEAN_TARGET_PCT}%)")


def plan_sync(ctx: Ctx) -> list[Cmd]:
    return [Cmd("snippet", ("sync_snippet", str(ctx.out / "sync")), 25)]


def run_sync(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n.update(last_json(succeeded(sh, cmds[0])))
    expect_parameters(n["parameters"], SYNC_MLP, n)
    timed = (ctx.out / "sync" / "sync" / "timing_rank0.jsonl").read_text().splitlines()
    memory = (ctx.out / "sync" / "sync" / "memory_rank0.jsonl").read_text().splitlines()
    n.update(timing_rows=len(timed), memory_rows=len(memory))
    expect(len(timed) == n["steps"], f"{len(timed)} timing rows for {n['steps']} steps")


def plan_memory(ctx: Ctx) -> list[Cmd]:
    args = train_args(ctx, "memory", 8, "--memory-snapshot", "--memory-tracker", "--enable-memory-logging",
                      "--memory-log-steps", "1", *SCHEDULE, *BASE.train_flags())
    return [Cmd("train", args, 30), Cmd("memory-viz", ("{snapshot}", "-o", str(ctx.out / "memory_snapshot.html")), 10)]


def run_memory(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    succeeded(sh, cmds[0])
    run = ctx.traces / "memory"
    pickles = sorted(run.glob("*_memory_snapshot.pickle"))
    n["snapshots"] = [p.name for p in pickles]
    expect(pickles, "no memory snapshot written")
    snapshot = pickle.loads(pickles[0].read_bytes())  # our own file, from this run
    n["segments"], n["trace_events"] = len(snapshot["segments"]), sum(map(len, snapshot["device_traces"]))
    n["snapshot_mb"] = round(pickles[0].stat().st_size / 1e6, 1)
    succeeded(sh, cmds[1].fill(snapshot=str(pickles[0])))
    n["html_mb"] = round((ctx.out / "memory_snapshot.html").stat().st_size / 1e6, 1)
    rows = [json.loads(line) for line in (run / "memory_rank0.jsonl").read_text().splitlines() if line.strip()]
    n.update(memory_against_allocator(read_json(run / "rank0_memory_modules.json"), rows))
    expect(abs(n["difference_pct"]) <= MEMORY_TOLERANCE * 100,
           f"the tracker's peak is {n['difference_pct']}% off the allocator's")


def plan_oom(ctx: Ctx) -> list[Cmd]:
    return [Cmd("snippet", ("oom_snippet", str(ctx.out / "oom")), 30)]


def run_oom(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    expect_parameters(last_json(succeeded(sh, cmds[0])).get("parameters"), OOM_LINEAR, n)
    oom = sorted((ctx.out / "oom").glob("*/*_oom_step*_memory_snapshot.pickle"))
    n["oom_snapshots"] = [p.name for p in oom]
    expect(oom, "the provoked out-of-memory error left no snapshot")


def plan_fsdp(ctx: Ctx) -> list[Cmd]:
    args = train_args(ctx, "fsdp", 12, "--strategy", "fsdp", "--enable-profiling", "--enable-memory-logging",
                      *SCHEDULE, *BASE.train_flags())
    return [Cmd("launch", args, 50, {"NPROC": "1", "SKIP_PREFLIGHT": "1", "MIXED_PRECISION": "bf16"})]


def run_fsdp(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    expect_parameters(logged_parameters(succeeded(sh, cmds[0])), BASE.model, n, rounding=5e3)
    run = ctx.traces / "fsdp"
    report = read_json(run / "parallelism.json")
    n.update({k: report.get(k) for k in ("built", "distributed_type", "backend", "world_size", "warning")})
    n["fsdp_units"] = len(report.get("fsdp_units") or [])
    traces = sorted(run.glob("*.pt.trace.json.gz"))
    expect(traces, f"no trace in {run}")
    stats = trace_stats(traces[0])
    # One rank: FSDP2 issues no collective (no NCCL kernel); its annotations name each kind of communication.
    n["fsdp_annotations"], n["nccl_kernels"] = stats["fsdp_annotations"], stats["nccl_kernels"]
    fsdp = read_json(run / "memory_summary.json")["per_rank"][0].get("peak_allocated_mb")
    unsharded = read_json(ctx.traces / "demo" / "memory_summary.json")["per_rank"][0].get("peak_allocated_mb")
    n["unsharded_built"] = read_json(ctx.traces / "demo" / "parallelism.json").get("built")
    n.update(peak_mib_fsdp=fsdp, peak_mib_unsharded=unsharded,
             peak_ratio=round(fsdp / unsharded, 3) if fsdp and unsharded else None)
    expect(report.get("built") == "fsdp2", f"parallelism.json says built {report.get('built')!r}, not fsdp2")
    # FSDP2 skips the all-gather on a group of one (the parameters are whole already: `FSDPParamGroup.unshard`
    # returns before its `FSDP::all_gather` range), so one rank names its forward and its gradient reduction.
    kinds = {"FSDP::pre_forward", "FSDP::post_backward_reduce"}
    kinds |= {"FSDP::all_gather"} if n["world_size"] != 1 else set()
    expect(kinds <= set(n["fsdp_annotations"]), f"the trace names {sorted(n['fsdp_annotations'])}, not {sorted(kinds)}")
    expect(n["peak_ratio"], f"no peak memory to compare: fsdp {fsdp}, unsharded {unsharded}")


def plan_hang(ctx: Ctx) -> list[Cmd]:
    args = train_args(ctx, "hang", 50, "--hang-timeout", "4", "--hang-abort", "--flight-recorder-entries", "2000")
    # Rank 0's collator blocks from its 6th batch on: a hung data loader, on an NCCL group of one.
    torchrun = ("torchrun", ("--standalone", "--nproc-per-node", "1"))
    return [Cmd("train", args, 35, {"HF_DISTPROF_SIMULATE_HANG": "0:6"}, torchrun),
            Cmd("hang-report", (str(ctx.traces / "hang"),), 5)]


def run_hang(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n["training_exit_status"], _ = sh(cmds[0])
    run = ctx.traces / "hang"
    n["dumps"] = sorted(p.name for p in run.glob("hang_rank*")) + sorted(p.name for p in run.glob("flight_rec*"))
    expect(n["training_exit_status"] != 0, "the hung run was not ended by --hang-abort")
    expect(list(run.glob("flight_recorder_rank0_*.pkl")), f"no flight_recorder_rank0_*.pkl in {run}")
    report = succeeded(sh, cmds[1])
    n["report"] = report.splitlines()[1:]
    expect("flight recorder" in report, "hang-report did not read the flight recorder")


def plan_nvtx(ctx: Ctx) -> list[Cmd]:
    report = str(ctx.out / "nsys" / "nvtx")
    nsys = ("--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--force-overwrite=true", "-o", report)
    args = train_args(ctx, "nsys", 8, "--nvtx", "--nsys-window", "--enable-step-timing", *SCHEDULE)
    return [Cmd("train", args, 25, via=("nsys", nsys)),
            Cmd("nsys-stats", ("--report", "nvtx_sum", "--format", "csv", "--force-export=true", report + ".nsys-rep"),
                10)]


def run_nvtx(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    # The demo ran with --nvtx: its record_function phases, which share the NVTX ranges' names, are on the GPU.
    n["demo_phases_on_gpu"] = trace_stats(demo_trace(ctx))["phases_on_gpu"]
    expect(n["demo_phases_on_gpu"], "no hf_distprof/ phase on the demo trace's GPU timeline")
    if shutil.which("nsys") is None:
        n["nsys"] = "not installed: NVTX ranges not observed by a tool; the --nvtx demo trained and labelled"
        return
    (ctx.out / "nsys").mkdir(parents=True, exist_ok=True)
    succeeded(sh, cmds[0])
    rows = [line for line in succeeded(sh, cmds[1]).splitlines() if "hf_distprof/" in line]
    n["nsys_ranges"] = rows
    expect(rows, "nsys recorded no hf_distprof/ NVTX range")


def plan_pytest(ctx: Ctx) -> list[Cmd]:
    return [Cmd("pytest", ("-m", "gpu", "tests/unit", "-q", "-p", "no:cacheprovider",
                           "--junit-xml", str(ctx.out / "pytest_gpu.xml")), 55)]


def run_pytest(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    rc, out = sh(cmds[0])
    xml = ctx.out / "pytest_gpu.xml"
    expect(xml.is_file(), f"pytest exited {rc} without a report:\n" + "\n".join(out.splitlines()[-15:]))
    root = ET.parse(xml).getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    if suite is None:
        raise CheckFailed(f"no testsuite in {xml}")
    n.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    n["failed"] = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None
                   or c.find("error") is not None]
    expect(rc == 0 and n["tests"] > n["skipped"], f"pytest -m gpu exited {rc}: {n}")


def no_commands(ctx: Ctx) -> list[Cmd]:
    return []


CHECKS: list[Check] = [
    Check("environment", 15, plan_environment, run_environment, "versions, GPU, its clocks and throttle reasons "
          "(NVML, as the step timer samples them), our package importable"),
    Check("demo on 1 GPU", 75, plan_demo, run_demo, "40 steps of the demo: kernels, device phases, the logged "
          "parameter count", (BASE.model,)),
    Check("mfu", 2, no_commands, run_mfu, "the demo's MFU as FLOPs per token within 10% of 6 x parameters",
          (BASE.model,)),
    Check("analyze and HTA", 30, plan_analyze, run_analyze, "the demo's trace: GPU idle < 20%, HTA within 0.5 pp, "
          "analyze time, trace and compact MB per step", (BASE.model,)),
    Check("overhead", 70, plan_overhead, run_overhead, f"always-on callbacks on a fast step: ordinary step <= "
          f"{ORDINARY_STEP_TARGET_MS} ms, mean over all steps <= {MEAN_TARGET_PCT}% of the step, A/B <= "
          f"{OVERHEAD_TARGET}; the demo's profiler slowdown", (FAST.model, BASE.model)),
    Check("no host sync", 25, plan_sync, run_sync, "step timer and memory logger under sync debug 'error'",
          (SYNC_MLP,)),
    Check("memory views", 40, plan_memory, run_memory, "--memory-snapshot renders; --memory-tracker's peak within "
          "10% of the allocator's", (BASE.model,)),
    Check("oom snapshot", 30, plan_oom, run_oom, "an out-of-memory error leaves a snapshot", (OOM_LINEAR,)),
    Check("fsdp2", 50, plan_fsdp, run_fsdp, "--strategy fsdp on 1 GPU: fsdp2, peak memory against the demo's, "
          "FSDP's communication by kind", (BASE.model,)),
    Check("hang and flight recorder", 40, plan_hang, run_hang, "NCCL group of 1, forced hang, hang-report",
          (TINY.model,)),
    Check("nvtx", 35, plan_nvtx, run_nvtx, "the demo's phases on the GPU; an Nsight run only if nsys is installed",
          (BASE.model, TINY.model)),
    Check("gpu tests", 55, plan_pytest, run_pytest, "pytest -m gpu", (TEST_MODELS,)),
]
