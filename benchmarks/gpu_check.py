#!/usr/bin/env python
"""Every CUDA path of hf_distprof, checked on one GPU in under 8 minutes: one command, one report.

    python benchmarks/gpu_check.py --dry-run --out gpu_check_out    # any machine: the plan, every flag checked
    python benchmarks/gpu_check.py --out gpu_check_out              # on the GPU machine, from the repository root

Each check runs its commands as subprocesses with timeouts (the budgets add up to well under 8 minutes, so a retry
fits in the same slot) and reads numbers back from the files they write; a failed check does not stop the next.
``<out>/gpu_check.json`` holds one record per check (name, passed, numbers, seconds, error), ``gpu_check.md`` the
same as a table, both rewritten after every check; each command's output is in ``<out>/logs/``. ``--dry-run``
checks, for real, that every script exists, every flag is in its command's help, every test hook variable is read
by its script and every ``hf_distprof`` name the inline programs import exists. Without CUDA the run exits 2.
DEVELOPING.md ("Running the GPU check") says which wheels to bring to a GPU machine without network.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TRAIN, BENCH = "python_scripts/train_modernBERT.py", "benchmarks/bench_callback_overhead.py"
TRAIN_CODE = "hf_distprof/recipe/train_mlm.py"  # what TRAIN runs: the test hooks are read there
DEMO, LAUNCH = "local_scripts/train_lambda_with_profiling.sh", "local_scripts/train_lambda.sh"
TOTAL_LIMIT_S = 480.0
"""The whole run must fit in 8 minutes; a check whose budget would pass that is skipped, saying so."""
HTA_TOLERANCE_PP = 0.5


# ---- commands -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A program the checks call: how to start it, the command whose output lists its flags (None: no flags),
    the repository files it needs, and, for a launcher, whether it takes a script (torchrun) or a command (nsys)."""

    argv: tuple[str, ...]
    help_argv: tuple[str, ...] | None
    sources: tuple[str, ...] = ()
    takes_script: bool = False


def _cli(sub: str) -> Tool:
    return Tool((PY, "-m", "hf_distprof.cli.main", sub), (PY, "-m", "hf_distprof.cli.main", sub, "-h"))


TRAIN_HELP = (PY, TRAIN, "--help")  # the demo and the launcher pass their arguments on to the training script
TOOLS: dict[str, Tool] = {
    "train": Tool((PY, TRAIN), TRAIN_HELP, (TRAIN, TRAIN_CODE)),
    "demo": Tool(("bash", DEMO), TRAIN_HELP, (DEMO, LAUNCH, TRAIN, TRAIN_CODE)),
    "launch": Tool(("bash", LAUNCH), TRAIN_HELP, (LAUNCH, TRAIN, TRAIN_CODE, "local_scripts/accelerate/fsdp2.yaml")),
    "torchrun": Tool((PY, "-m", "torch.distributed.run"), (PY, "-m", "torch.distributed.run", "--help"),
                     takes_script=True),
    "analyze": _cli("analyze"),
    "hang-report": _cli("hang-report"),
    "bench-overhead": Tool((PY, BENCH), (PY, BENCH, "--help"), (BENCH,)),
    "memory-viz": Tool((PY, "-m", "torch.cuda._memory_viz", "trace_plot"),
                       (PY, "-m", "torch.cuda._memory_viz", "trace_plot", "--help")),
    "pytest": Tool((PY, "-m", "pytest"), (PY, "-m", "pytest", "--help")),
    "nsys": Tool(("nsys", "profile"), ("nsys", "profile", "--help")),
    "nsys-stats": Tool(("nsys", "stats"), ("nsys", "stats", "--help")),
    "snippet": Tool((PY, "-c"), None),  # its first argument names one of SNIPPETS
}


@dataclass(frozen=True)
class Cmd:
    """One command a check runs: a tool and its arguments, optionally under a launcher (torchrun, nsys).

    ``{name}`` in an argument stands for a value known only once earlier commands ran (:meth:`fill`).
    """

    tool: str
    args: tuple[str, ...]
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    via: tuple[str, tuple[str, ...]] | None = None

    def argv(self, shown: bool = False) -> list[str]:
        """The full command line; ``shown``: a snippet by its name instead of its code."""
        tool = TOOLS[self.tool]
        args = self.args
        if self.tool == "snippet":
            args = (f"<{args[0]}>" if shown else SNIPPETS[args[0]], *args[1:])
        if self.via is None:
            return [*tool.argv, *args]
        launcher = TOOLS[self.via[0]]
        return [*launcher.argv, *self.via[1], *(tool.argv[1:] if launcher.takes_script else tool.argv), *args]

    def display(self) -> str:
        """The command as the plan and the logs show it."""
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items() if k not in BASE_ENV)
        return f"{env}{shlex.join(self.argv(shown=True))}  (timeout {self.timeout_s:.0f} s)"

    def fill(self, **values: str) -> Cmd:
        """This command with its ``{name}`` placeholders filled in."""
        return replace(self, args=tuple(a.format(**values) if "{" in a else a for a in self.args))


Shell = Callable[[Cmd], tuple[int, str]]


class CheckFailed(Exception):
    """A check's expectation did not hold; the message says which and with what value."""


def expect(condition: Any, message: str) -> None:
    """Raise :class:`CheckFailed` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(message)


def run_cmd(cmd: Cmd, log: Path) -> tuple[int, str]:
    """Run ``cmd`` from the repository root, its output into ``log``; its exit status and output.

    Raises:
        CheckFailed: It ran past its timeout (it and its children were killed).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"$ {cmd.display()}\n")
        fh.flush()
        proc = subprocess.Popen(cmd.argv(), cwd=REPO, env={**os.environ, **cmd.env}, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=cmd.timeout_s)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"timed out after {cmd.timeout_s:.0f} s (output: {log})") from None
        finally:
            # Its own session: a launcher's ranks left behind go too, and hold no GPU memory into the next check.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode, log.read_text(encoding="utf-8", errors="replace")


def succeeded(sh: Shell, cmd: Cmd) -> str:
    """Run ``cmd``; its output when it exits 0, else :class:`CheckFailed` with the output's last lines."""
    rc, out = sh(cmd)
    tail = "\n".join(out.splitlines()[-15:])
    expect(rc == 0, f"{cmd.tool} exited with status {rc}:\n{tail}")
    return out


# ---- the checks -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    """Where a run writes. ``traces``: every training run's ``--profiler-output-dir`` (each names its run folder);
    ``train``: their ``--output-dir``, one folder so that the demo tokenizer is trained once."""

    out: Path

    @property
    def traces(self) -> Path:
        return self.out / "traces"

    @property
    def train(self) -> Path:
        return self.out / "train"


@dataclass(frozen=True)
class Check:
    """One numbered check: its commands (``plan``) and ``run(ctx, cmds, numbers, sh)``, which runs them through
    ``sh``, reads what they wrote into ``numbers`` and raises :class:`CheckFailed` when an expectation fails (the
    numbers gathered so far are kept)."""

    name: str
    budget_s: float
    plan: Callable[[Ctx], list[Cmd]]
    run: Callable[[Ctx, list[Cmd], dict[str, Any], Shell], None]
    what: str = ""


@dataclass
class Result:
    """One record of ``gpu_check.json``."""

    name: str
    passed: bool
    numbers: dict[str, Any]
    seconds: float
    error: str | None


def train_args(ctx: Ctx, run: str, steps: int, *extra: str) -> tuple[str, ...]:
    """The training script's flags shared by the checks: run folder ``<out>/traces/<run>``, no TensorBoard."""
    return ("--output-dir", str(ctx.train), "--profiler-output-dir", str(ctx.traces), "--profiler-run-name", run,
            "--max-steps", str(steps), "--logging-steps", "5", "--report-to", "none", *extra)


def trace_stats(path: Path) -> dict[str, Any]:
    """Kernel and copy counts of one trace, and the step-phase ranges found on its GPU timeline."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    phases = {e.get("name") for e in events if e.get("cat") == "gpu_user_annotation"}
    return {"kernels": cats["kernel"], "gpu_memcpy": cats["gpu_memcpy"],
            "phases_on_gpu": sorted(p for p in phases if str(p).startswith("hf_distprof/"))}


def last_json(output: str) -> Any:
    """The last line of a snippet's output that is a JSON object (what it prints last; warnings may follow)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    expect(lines, "the program printed no JSON result")
    return json.loads(lines[-1])


def read_json(path: Path) -> Any:
    """A JSON file a run should have written (:class:`CheckFailed` naming it when missing)."""
    expect(path.is_file(), f"{path} was not written")
    return json.loads(path.read_text(encoding="utf-8"))


def plan_environment(ctx: Ctx) -> list[Cmd]:
    return [Cmd("snippet", ("env_snippet",), 15)]


def run_environment(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n.update(last_json(succeeded(sh, cmds[0])))
    expect(n["cuda_available"], "torch.cuda.is_available() is False")
    missing = [m for m in ("hf_distprof", "datasets", "orjson", "msgspec") if not n["modules"].get(m)]
    expect(not missing, f"not importable: {missing} (install the wheels: DEVELOPING.md)")
    absent = [tool for tool in ("python", "accelerate") if not n["on_path"][tool]]
    expect(not absent, f"the launch scripts call {absent}, not on PATH")


def plan_demo(ctx: Ctx) -> list[Cmd]:
    env = {"NPROC": "1", "MAX_STEPS": "30", "OUTPUT_DIR": str(ctx.traces), "TRAIN_OUTPUT": str(ctx.train)}
    return [Cmd("demo", ("--profiler-run-name", "demo", "--nvtx"), 60, env)]


def run_demo(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    succeeded(sh, cmds[0])
    run = ctx.traces / "demo"
    traces = sorted(run.glob("*.pt.trace.json.gz"))
    n["traces"] = [t.name for t in traces]
    expect(traces, f"no trace in {run}")
    n.update(trace_stats(traces[0]))
    expect(n["kernels"] > 0, f"no CUDA kernel in {traces[0].name}")
    summary = read_json(run / "timing_summary.json")
    rank0 = summary["per_rank"][0]
    n.update({k: summary.get(k) for k in ("step_mean_s", "tokens_per_s", "mfu_pct", "peak_tflops")})
    # cpu_wait_s: None when the phases are timed on CUDA events rather than the host clock.
    n["phases_s"] = {k: rank0.get(k) for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "cpu_wait_s")}
    expect(all((rank0.get(k) or 0) > 0 for k in ("forward_s", "backward_s", "optimizer_s")),
           f"device phases missing or zero: {n['phases_s']}")
    expect(summary.get("peak_tflops") and (summary.get("mfu_pct") or 0) > 0,
           f"no MFU: peak_tflops {summary.get('peak_tflops')}, mfu_pct {summary.get('mfu_pct')}")


def plan_analyze(ctx: Ctx) -> list[Cmd]:
    run = str(ctx.traces / "demo")
    return [Cmd("analyze", (run, "--report", str(ctx.out / "report"), "--no-progress"), 20),
            Cmd("snippet", ("hta_snippet", "{trace}", str(ctx.out / "hta_traces"), str(ctx.out / "hta.json")), 25)]


def run_analyze(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    succeeded(sh, cmds[0])
    result = read_json(ctx.out / "report" / "analysis.json")
    expect(result["ranks"], f"no rank analysed; errors: {result.get('errors')}")
    rank = result["ranks"][0]
    gpu = rank.get("gpu_total") or {}
    ours = {k: gpu.get(k) for k in ("idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct")}
    n.update(device=rank.get("device"), n_kernels=gpu.get("n_kernels"), ours=ours,
             findings=[f.get("kind") for f in result.get("findings", [])])
    expect(rank.get("device") == "gpu" and gpu, f"not analysed as a GPU trace (device {rank.get('device')!r})")
    trace = sorted((ctx.traces / "demo").glob("*.pt.trace.json.gz"))[0]
    rc, out = sh(cmds[1].fill(trace=str(trace)))
    if rc == 3:
        n["hta"] = "not installed: no comparison (holistictraceanalysis==0.5.0, DEVELOPING.md)"
        return
    expect(rc == 0, "HTA failed:\n" + "\n".join(out.splitlines()[-15:]))
    hta = n["hta"] = read_json(ctx.out / "hta.json")
    diffs = {k: abs(ours[k] - hta[k]) for k in hta if hta[k] is not None and ours.get(k) is not None}
    n["largest_difference_pp"] = max(diffs.values(), default=None)
    expect(diffs and max(diffs.values()) <= HTA_TOLERANCE_PP, f"HTA and ours differ by more than 0.5 pp: {diffs}")


def plan_overhead(ctx: Ctx) -> list[Cmd]:
    return [Cmd("bench-overhead", ("--pairs", "2", "--steps", "10"), 35)]


def run_overhead(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    out = succeeded(sh, cmds[0])
    # The bench trains 2 CPU ranks on gloo (it has no GPU mode): this is the callbacks' host-side cost.
    n["bench"] = "2 CPU ranks (gloo), 2 A/B pairs of 10 steps"
    found = re.search(r"median step-time ratio \([^)]*\): ([\d.]+) \(95% interval ([\d.]+)-([\d.]+)", out)
    expect(found, "no 'median step-time ratio' line in the bench's output")
    n["ab_ratio"], n["ab_low"], n["ab_high"] = (float(x) for x in found.groups())  # type: ignore[union-attr]
    slowdown = read_json(ctx.traces / "demo" / "timing_summary.json").get("profiler_slowdown") or {}
    n["profiler_slowdown_gpu"] = {k: slowdown.get(k) for k in (
        "ratio", "median_step_s_inside", "median_step_s_before", "median_step_s_after", "threshold_ratio")}
    expect(slowdown.get("ratio"), "no profiler_slowdown ratio in the demo's timing_summary.json")


def plan_sync(ctx: Ctx) -> list[Cmd]:
    return [Cmd("snippet", ("sync_snippet", str(ctx.out / "sync")), 25)]


def run_sync(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    n.update(last_json(succeeded(sh, cmds[0])))
    timed = (ctx.out / "sync" / "sync" / "timing_rank0.jsonl").read_text().splitlines()
    memory = (ctx.out / "sync" / "sync" / "memory_rank0.jsonl").read_text().splitlines()
    n.update(timing_rows=len(timed), memory_rows=len(memory))
    expect(len(timed) == n["steps"], f"{len(timed)} timing rows for {n['steps']} steps")


def plan_snapshot(ctx: Ctx) -> list[Cmd]:
    schedule = ("--profiler-wait-steps", "2", "--profiler-warmup-steps", "1", "--profiler-active-steps", "2")
    return [Cmd("train", train_args(ctx, "snapshot", 8, "--memory-snapshot", *schedule), 30),
            Cmd("memory-viz", ("{snapshot}", "-o", str(ctx.out / "memory_snapshot.html")), 8),
            Cmd("snippet", ("oom_snippet", str(ctx.out / "oom")), 17)]


def run_snapshot(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    import pickle

    succeeded(sh, cmds[0])
    pickles = sorted((ctx.traces / "snapshot").glob("*_memory_snapshot.pickle"))
    n["snapshots"] = [p.name for p in pickles]
    expect(pickles, "no memory snapshot written")
    snapshot = pickle.loads(pickles[0].read_bytes())  # our own file, from this run
    n["segments"], n["trace_events"] = len(snapshot["segments"]), sum(map(len, snapshot["device_traces"]))
    succeeded(sh, cmds[1].fill(snapshot=str(pickles[0])))
    n["html_bytes"] = (ctx.out / "memory_snapshot.html").stat().st_size
    succeeded(sh, cmds[2])
    oom = sorted((ctx.out / "oom").glob("*/*_oom_step*_memory_snapshot.pickle"))
    n["oom_snapshots"] = [p.name for p in oom]
    expect(oom, "the provoked out-of-memory error left no snapshot")


def plan_fsdp(ctx: Ctx) -> list[Cmd]:
    args = train_args(ctx, "fsdp", 10, "--strategy", "fsdp", "--enable-step-timing")
    return [Cmd("launch", args, 40, {"NPROC": "1", "SKIP_PREFLIGHT": "1"})]


def run_fsdp(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    succeeded(sh, cmds[0])
    report = read_json(ctx.traces / "fsdp" / "parallelism.json")
    n.update({k: report.get(k) for k in ("built", "distributed_type", "backend", "world_size", "warning")})
    n["fsdp_units"] = len(report.get("fsdp_units") or [])
    expect(report.get("built") == "fsdp2", f"parallelism.json says built {report.get('built')!r}, not fsdp2")


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
    args = train_args(ctx, "nsys", 12, "--nvtx", "--nsys-window", "--enable-step-timing",
                      "--profiler-wait-steps", "2", "--profiler-warmup-steps", "1", "--profiler-active-steps", "3")
    return [Cmd("train", args, 35, via=("nsys", nsys)),
            Cmd("nsys-stats", ("--report", "nvtx_sum", "--format", "csv", "--force-export=true", report + ".nsys-rep"),
                10)]


def run_nvtx(ctx: Ctx, cmds: list[Cmd], n: dict[str, Any], sh: Shell) -> None:
    # The demo ran with --nvtx: its record_function phases, which share the NVTX ranges' names, are on the GPU.
    demo = sorted((ctx.traces / "demo").glob("*.pt.trace.json.gz"))
    expect(demo, "needs the demo's trace (check 2)")
    n["demo_phases_on_gpu"] = trace_stats(demo[0])["phases_on_gpu"]
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
    expect(suite is not None, f"no testsuite in {xml}")
    assert suite is not None
    n.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    n["failed"] = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None
                   or c.find("error") is not None]
    expect(rc == 0 and n["tests"] > n["skipped"], f"pytest -m gpu exited {rc}: {n}")


CHECKS: list[Check] = [
    Check("environment", 15, plan_environment, run_environment, "versions, GPU, our package importable"),
    Check("demo on 1 GPU", 60, plan_demo, run_demo, "traces with kernels, device phases, MFU"),
    Check("analyze and HTA", 45, plan_analyze, run_analyze, "GPU breakdown; HTA within 0.5 pp"),
    Check("overhead", 35, plan_overhead, run_overhead, "callback A/B (bench) and profiler slowdown on GPU"),
    Check("no host sync", 25, plan_sync, run_sync, "step timer and memory logger under sync debug 'error'"),
    Check("memory snapshot", 55, plan_snapshot, run_snapshot, "--memory-snapshot renders; OOM leaves one"),
    Check("fsdp2", 40, plan_fsdp, run_fsdp, "--strategy fsdp on 1 GPU: parallelism.json says fsdp2"),
    Check("hang and flight recorder", 40, plan_hang, run_hang, "NCCL group of 1, forced hang, hang-report"),
    Check("nvtx", 45, plan_nvtx, run_nvtx, "--nvtx phases; nsys only if installed"),
    Check("gpu tests", 55, plan_pytest, run_pytest, "pytest -m gpu"),
]


# ---- inline programs (run with the machine's interpreter, from the repository root) ----------------------------

ENV_SNIPPET = """
import importlib, json, os, platform, shutil, subprocess, sys
import torch
from hf_distprof.timing.report import peak_tflops_for_device
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(), "driver": None}
if info["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                devices=torch.cuda.device_count(), nccl=".".join(map(str, torch.cuda.nccl.version())),
                known_peak_tflops=peak_tflops_for_device(p.name))
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=10)
    info["driver"] = (q.stdout.split() or [None])[0]
extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
extra = [p for p in extra if p != os.getcwd()]
info["modules"] = {}
for name in ("hf_distprof", "transformers", "accelerate", "datasets", "orjson", "msgspec", "hta", "numpy", "pandas",
             "pyarrow", "pytest"):
    try:
        m = importlib.import_module(name)
    except Exception:
        info["modules"][name] = None
        continue
    # A package from the wheels folder that shadows the machine's own shows here.
    shadow = any(str(getattr(m, "__file__", "")).startswith(p) for p in extra)
    info["modules"][name] = str(getattr(m, "__version__", "?")) + (" (PYTHONPATH)" if shadow else "")
info["on_path"] = {t: shutil.which(t) for t in ("python", "accelerate", "nvidia-smi", "nsys")}
same = os.path.realpath(info["on_path"]["python"] or "") == os.path.realpath(sys.executable)
info["path_python_is_this_one"] = same  # the launch scripts call `python`
print(json.dumps(info))
"""

SYNC_SNIPPET = """
import json, sys
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments
from hf_distprof import ProfilingArguments, build_callbacks
out, steps, every = sys.argv[1], 20, 5
prof = ProfilingArguments(enable_step_timing=True, enable_memory_logging=True, memory_log_steps=2,
                          profiler_output_dir=out, profiler_run_name="sync")
callbacks = build_callbacks(prof)
args = TrainingArguments(output_dir=out, logging_steps=every, report_to=[])
state, control = TrainerState(max_steps=steps, logging_steps=every), TrainerControl()
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # no host sync of its own

def hook(name, **kw):
    for cb in callbacks:
        getattr(cb, name)(args, state, control, model=model, optimizer=opt, **kw)

hook("on_train_begin")
checked = 0
for step in range(1, steps + 1):
    logging = step % every == 0
    # Step 1 sets up CUDA and cuBLAS; on logging steps the Trainer itself waits for the device (loss.item()).
    torch.cuda.set_sync_debug_mode("default" if step == 1 else "error")
    hook("on_step_begin")
    loss = model(torch.randn(64, 512, device="cuda")).square().mean()
    loss.backward()
    hook("on_pre_optimizer_step")
    opt.step()
    hook("on_optimizer_step")
    opt.zero_grad()
    state.global_step, control.should_log = step, logging
    if logging:
        torch.cuda.set_sync_debug_mode("default")
    checked += step > 1 and not logging
    hook("on_step_end")
    if logging:
        hook("on_log", logs={"loss": loss.item()})
        control.should_log = False
torch.cuda.set_sync_debug_mode("default")
hook("on_train_end")
print(json.dumps({"steps": steps, "steps_under_sync_error_mode": checked}))
"""

OOM_SNIPPET = """
import sys
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments
from hf_distprof import ProfilingArguments
from hf_distprof.callbacks.memory.views import MemoryViewsCallback
out = sys.argv[1]
cb = MemoryViewsCallback(ProfilingArguments(memory_snapshot=True, profiler_output_dir=out, profiler_run_name="oom",
                                            profiler_wait_steps=1, profiler_warmup_steps=0, profiler_active_steps=2))
args, state, control = TrainingArguments(output_dir=out, report_to=[]), TrainerState(max_steps=8), TrainerControl()
model = torch.nn.Linear(1024, 1024).cuda()
cb.on_train_begin(args, state, control, model=model)
try:
    for step in range(1, 9):
        cb.on_step_begin(args, state, control, model=model)
        if step == 5:
            torch.empty(2**50, dtype=torch.uint8, device="cuda")  # 1 PiB: no GPU has it
        model(torch.randn(32, 1024, device="cuda")).sum().backward()
        cb.on_optimizer_step(args, state, control, model=model)
        state.global_step = step
        cb.on_step_end(args, state, control, model=model)
except torch.OutOfMemoryError:
    cb.close(5)
    print("out of memory at step 5, as provoked")
    sys.exit(0)
sys.exit("no out-of-memory error was raised")
"""

HTA_SNIPPET = """
import gzip, json, math, sys
from pathlib import Path
try:
    from hta.trace_analysis import TraceAnalysis
except ImportError:
    sys.exit(3)
trace, folder, result = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
doc = json.loads(gzip.decompress(trace.read_bytes()))
doc.setdefault("distributedInfo", {}).setdefault("rank", 0)  # HTA takes the rank from here
# A folder of its own (HTA reads every .json/.gz file there as a trace); indented, as Kineto writes it.
folder.mkdir(parents=True, exist_ok=True)
(folder / "rank-0.json.gz").write_bytes(gzip.compress(json.dumps(doc, indent=2).encode()))
ta = TraceAnalysis(trace_dir=str(folder))
tb = ta.get_temporal_breakdown(visualize=False)
out = {ours: float(tb[theirs].iloc[0]) for ours, theirs in (
    ("idle_pct", "idle_time_pctg"), ("compute_pct", "compute_time_pctg"), ("non_compute_pct", "non_compute_time_pctg"))}
try:
    overlap = float(ta.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0])
    out["comm_comp_overlap_pct"] = None if math.isnan(overlap) else overlap
except Exception:  # one rank: no communication kernel to overlap
    out["comm_comp_overlap_pct"] = None
result.write_text(json.dumps(out))
"""

SNIPPETS = {"env_snippet": ENV_SNIPPET, "sync_snippet": SYNC_SNIPPET, "oom_snippet": OOM_SNIPPET,
            "hta_snippet": HTA_SNIPPET}
# No network on the GPU machine: nothing may wait for the Hub. `python` in the launch scripts is this interpreter.
BASE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")}
OWN_PATHS = ("traces", "report", "hta_traces", "sync", "oom", "nsys", "logs", "hta.json", "memory_snapshot.html",
             "pytest_gpu.xml")
"""What a real run clears first in ``--out``: a run name already taken would get a -1 suffix, and a file left by
an earlier run must not pass for this one's. ``train/`` stays (the demo tokenizer, trained once)."""


# ---- the dry run ----------------------------------------------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_text(tool: Tool) -> str:
    """What ``tool``'s help command prints (RuntimeError when it fails)."""
    assert tool.help_argv is not None
    proc = subprocess.run(tool.help_argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **BASE_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"`{shlex.join(tool.help_argv)}` exited with status {proc.returncode}: {proc.stderr[-500:]}")
    return proc.stdout + proc.stderr


def installed(tool: Tool) -> bool:
    """Whether the tool's program is on this machine."""
    return shutil.which(tool.argv[0]) is not None


def snippet_problems(name: str) -> list[str]:
    """What is wrong with one inline program: unknown, not Python, or importing an ``hf_distprof`` name that is gone."""
    if name not in SNIPPETS:
        return [f"no snippet named {name!r}"]
    try:
        tree = ast.parse(SNIPPETS[name])
    except SyntaxError as err:
        return [f"{name}: {err}"]
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and str(n.module).startswith("hf_distprof")]
    return [f"{name}: {node.module} has no {alias.name}" for node in imports for alias in node.names
            if not hasattr(importlib.import_module(node.module or ""), alias.name)]


HelpOf = Callable[[Tool], str]


def validate(checks: Sequence[Check], ctx: Ctx, help_of: HelpOf = help_text) -> tuple[list[str], list[str]]:
    """Check every command of the plan against this machine and the repository, without running any.

    Args:
        checks: The checks.
        ctx: Where the run would write.
        help_of: The help text of a tool (tests pass a fake).

    Returns:
        The problems, each naming its check, and notes on what could not be checked here.
    """
    plans = [check.plan(ctx) for check in checks]
    used = {TOOLS[n] for cmds in plans for c in cmds for n in (c.tool, *(c.via[:1] if c.via else ())) if n in TOOLS}
    problems: list[str] = []
    notes: set[str] = set()
    accepted: dict[tuple[str, ...] | None, set[str]] = {}

    def fetch(tool: Tool) -> None:
        try:
            accepted[tool.help_argv] = set(FLAG.findall(help_of(tool)))
        except Exception as err:  # noqa: BLE001 - a problem of the plan, reported with the others
            problems.append(f"cannot list the flags of `{shlex.join(tool.argv)}`: {err}")

    with ThreadPoolExecutor(max_workers=4) as pool:  # the help commands mostly wait for imports
        list(pool.map(fetch, {t.help_argv: t for t in used if t.help_argv and installed(t)}.values()))
    for i, (check, cmds) in enumerate(zip(checks, plans), 1):
        where = f"check {i} ({check.name})"
        for cmd in cmds:
            for name, args in [(cmd.tool, cmd.args), *([cmd.via] if cmd.via else [])]:
                tool = TOOLS.get(name)
                if tool is None:
                    problems.append(f"{where}: no tool {name!r}")
                    continue
                problems += [f"{where}: {src} does not exist" for src in tool.sources if not (REPO / src).is_file()]
                if not installed(tool):
                    notes.add(f"{where}: {tool.argv[0]} is not installed here; its flags are not checked")
                elif tool.help_argv in accepted:
                    flags = [a.split("=", 1)[0] for a in args if FLAG.fullmatch(a.split("=", 1)[0])]
                    problems += [f"{where}: {flag} is not a flag of `{shlex.join(tool.argv)}` (not in its help)"
                                 for flag in flags if flag not in accepted[tool.help_argv]]
            texts = [(REPO / s).read_text(encoding="utf-8") for s in TOOLS[cmd.tool].sources if (REPO / s).is_file()]
            problems += [f"{where}: no script of {cmd.tool} reads {key}" for key in cmd.env
                         if texts and not any(key in text for text in texts)]
            problems += [f"{where}: {p}" for p in snippet_problems(cmd.args[0])] if cmd.tool == "snippet" else []
    return problems, sorted(notes)


def dry_run(checks: Sequence[Check], ctx: Ctx, help_of: HelpOf = help_text) -> int:
    """Print the numbered plan and validate it: 0 when every script, command and flag exists, else 1."""
    total = sum(c.budget_s for c in checks)
    print(f"gpu_check plan: {len(checks)} checks, budget {total:.0f} s (limit {TOTAL_LIMIT_S:.0f} s), out {ctx.out}")
    for i, check in enumerate(checks, 1):
        print(f"{i:2d}. {check.name} ({check.budget_s:.0f} s): {check.what}")
        for cmd in check.plan(ctx):
            print(f"      {cmd.display()}")
    problems, notes = validate(checks, ctx, help_of)
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print(f"dry run: {sum(len(c.plan(ctx)) for c in checks)} commands checked, {len(problems)} problem(s)")
    return 1 if problems else 0


# ---- the real run ---------------------------------------------------------------------------------------------


def shell_for(out: Path, number: int, name: str) -> Shell:
    """How check ``number`` runs its commands: offline, each into its own ``<out>/logs/NN_<check>_K.log``."""
    counter, slug = itertools.count(1), re.sub(r"\W+", "_", name)
    return lambda cmd: run_cmd(replace(cmd, env={**BASE_ENV, **cmd.env}),
                               out / "logs" / f"{number:02d}_{slug}_{next(counter)}.log")


def run_checks(checks: Sequence[Check], ctx: Ctx) -> list[Result]:
    """Run every check in order, each past the failures of the others, writing the results after each one."""
    results: list[Result] = []
    start = time.monotonic()
    for i, check in enumerate(checks, 1):
        numbers: dict[str, Any] = {}
        passed, error, began = False, None, time.monotonic()
        print(f"[{i}/{len(checks)}] {check.name} (budget {check.budget_s:.0f} s)", flush=True)
        if began - start + check.budget_s > TOTAL_LIMIT_S:
            error = f"skipped: its {check.budget_s:.0f} s would pass the run's {TOTAL_LIMIT_S:.0f} s limit"
        else:
            try:
                check.run(ctx, check.plan(ctx), numbers, shell_for(ctx.out, i, check.name))
                passed = True
            except CheckFailed as err:
                error = str(err)
            except Exception as err:  # noqa: BLE001 - a file or field missing: this check fails, the next one runs
                error = f"{type(err).__name__}: {err}"
        results.append(Result(check.name, passed, numbers, round(time.monotonic() - began, 2), error))
        print(f"    {'ok' if passed else 'FAILED'} in {results[-1].seconds:.1f} s" + (f": {error}" if error else ""),
              flush=True)
        write_results(results, ctx.out)
    return results


def _value(value: Any, limit: int = 160) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def render_md(results: Sequence[Result]) -> str:
    """The results as a Markdown table (long values shortened; ``gpu_check.json`` has them whole)."""
    lines = ["# GPU check", "", f"{sum(r.passed for r in results)} of {len(results)} checks passed.", "",
             "| # | check | passed | seconds | numbers | error |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        numbers = "; ".join(f"{k}: {_value(v)}" for k, v in r.numbers.items())
        lines.append(f"| {i} | {r.name} | {'yes' if r.passed else 'NO'} | {r.seconds:.1f} | {_cell(numbers)} "
                     f"| {_cell(r.error or '')} |")
    return "\n".join(lines) + "\n"


def write_results(results: Sequence[Result], out: Path) -> None:
    """Write ``gpu_check.json`` (one record per check) and ``gpu_check.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    records = [asdict(r) for r in results]
    (out / "gpu_check.json").write_text(json.dumps(records, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(render_md(results), encoding="utf-8")


def main(argv: Sequence[str] | None = None, checks: Sequence[Check] = CHECKS, help_of: HelpOf = help_text) -> int:
    """Run the GPU check.

    Args:
        argv: Command-line arguments (``sys.argv[1:]`` when None).
        checks: The checks (tests pass their own).
        help_of: The help text of a tool, for the dry run (tests pass a fake).

    Returns:
        0 when every check passed (or the dry run found nothing wrong), 1 when one failed, 2 without CUDA.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json, gpu_check.md, logs")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and check its commands and flags")
    args = parser.parse_args(argv)
    ctx = Ctx(args.out.resolve())
    if args.dry_run:
        return dry_run(checks, ctx, help_of)
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False); "
              "run it on a machine with one CUDA GPU, or pass --dry-run", file=sys.stderr)
        return 2
    for name in OWN_PATHS:
        path = ctx.out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    results = run_checks(checks, ctx)
    failed = [r.name for r in results if not r.passed]
    print(f"gpu_check: {len(results) - len(failed)} of {len(results)} passed; {ctx.out / 'gpu_check.md'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
