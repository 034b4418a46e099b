"""The inline programs of ``benchmarks/gpu_check.py``: each runs as ``python -c`` with the GPU machine's interpreter,
from the repository root, and prints what its check reads back (the last JSON line of its output).

``gpu_check --dry-run`` parses each one and checks that every ``hf_distprof`` name it imports exists.
"""

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
    from hf_distprof.timing.gpu_health import of_device
    info["gpu_health"] = of_device(torch.device("cuda", 0))  # NVML: clocks, throttle reasons, power
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=10)
    info["driver"] = (q.stdout.split() or [None])[0]
extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
extra = [p for p in extra if p != os.getcwd()]
info["modules"] = {}
for name in ("hf_distprof", "transformers", "accelerate", "datasets", "orjson", "msgspec", "hta", "numpy", "pandas",
             "pyarrow", "pytest", "pynvml", "zlib_ng"):
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
print(json.dumps({"steps": steps, "steps_under_sync_error_mode": checked,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""

OOM_SNIPPET = """
import json, sys
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
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))
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
