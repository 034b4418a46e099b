"""The parts of ``benchmarks/gpu_check.py`` that its checks are built from: the programs they call (:data:`TOOLS`),
one command (:class:`Cmd`), one check (:class:`Check`) with the models it trains (:class:`Model`), and the readers of
what the commands wrote.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_check_snippets import SNIPPETS

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TRAIN, BENCH = "python_scripts/train_modernBERT.py", "benchmarks/bench_callback_overhead.py"
TRAIN_CODE = "hf_distprof/recipe/train_mlm.py"  # what TRAIN runs: the test hooks are read there
DEMO, LAUNCH = "local_scripts/train_lambda_with_profiling.sh", "local_scripts/train_lambda.sh"
# No network on the GPU machine: nothing may wait for the Hub. `python` in the launch scripts is this interpreter.
BASE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")}


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
class Model:
    """A model a check trains, as the plan names it, and how to count its parameters without building its weights.

    ``count`` None: no one model (the ``gpu``-marked tests build their own).
    """

    name: str
    count: Callable[[], int] | None = None

    def params(self) -> int | None:
        """Its parameter count (built on the meta device: no memory, no download)."""
        return None if self.count is None else self.count()

    def describe(self) -> str:
        """``name (136.7 M parameters)``, as the plan prints it."""
        n = self.params()
        return self.name if n is None else f"{self.name} ({millions(n)} parameters)"


def millions(n: float) -> str:
    """``136686080`` -> ``136.7 M``; under 10 M with two decimals (``1.73 M``)."""
    return f"{n / 1e6:.1f} M" if n >= 1e7 else f"{n / 1e6:.2f} M"


def meta_params(build: Callable[[], Any]) -> int:
    """The parameters of the module ``build()`` returns, built on the meta device."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


@functools.cache
def modernbert_params(hidden: int, layers: int, seq: int) -> int:
    """The demo script's ModernBERT at this size, with the demo tokenizer's 8192 tokens."""
    from transformers import ModernBertForMaskedLM

    from hf_distprof.recipe.models import tiny_modernbert_config

    return meta_params(lambda: ModernBertForMaskedLM(
        tiny_modernbert_config(vocab_size=8192, hidden_size=hidden, num_layers=layers, seq_len=seq)))


@dataclass(frozen=True)
class Workload:
    """What a training check gives the demo script: its ModernBERT at one size (``--tiny-hidden-size``,
    ``--tiny-num-layers``; 4 heads, an MLP twice as wide, the demo tokenizer's 8192 tokens) and the batch
    (``--max-seq-length``, ``--per-device-train-batch-size``, ``--bf16``)."""

    hidden: int = 128
    layers: int = 4
    seq: int = 128
    batch: int = 8
    bf16: bool = False

    @property
    def model(self) -> Model:
        name = (f"ModernBERT (hidden {self.hidden}, {self.layers} layers, 4 heads, vocab 8192), batch {self.batch} x "
                f"{self.seq} tokens{', bf16' if self.bf16 else ''}")
        return Model(name, functools.partial(modernbert_params, self.hidden, self.layers, self.seq))

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def train_flags(self) -> tuple[str, ...]:
        """The training script's flags for this workload, every step a full batch: the demo corpus is small (the
        standard library's docstrings; Python 3.11's make 212 k tokens with the demo tokenizer, 206 sequences of
        1024), and an epoch of batches of 32 would end in a short one. Four data-loader workers prepare the batches
        (the MLM collator's masking): on the first H100 run the main process did it, 40 ms of a 265 ms step, and
        the GPU idled 23% of the traced steps; with the workers 8.9%. Not persistent ones: with
        ``--dataloader-persistent-workers`` (and pinned memory, the default on CUDA) the launched runs trained and
        then hung at exit until their timeouts (most likely torch's exit handler, which joins each persistent worker
        with a 5 s timeout: pytorch/pytorch#81794)."""
        return ("--tiny-hidden-size", str(self.hidden), "--tiny-num-layers", str(self.layers), "--max-seq-length",
                str(self.seq), "--per-device-train-batch-size", str(self.batch), "--dataloader-drop-last",
                "--dataloader-num-workers", "4",
                *(("--bf16",) if self.bf16 else ()))

    def bench_flags(self) -> tuple[str, ...]:
        """``bench_callback_overhead.py``'s flags for the same model and batch."""
        return ("--hidden-size", str(self.hidden), "--layers", str(self.layers), "--seq-len", str(self.seq),
                "--batch-size", str(self.batch), *(("--bf16",) if self.bf16 else ()))


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
    models: tuple[Model, ...] = ()


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


@functools.cache
def trace_stats(path: Path) -> dict[str, Any]:
    """What the checks read from one trace (read once per run, whatever asks): kernel and copy counts, the profiler
    steps it holds, the step-phase ranges on its GPU timeline, FSDP's annotations per kind (``FSDP::all_gather``,
    ...) and NCCL kernels per collective."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    cats = Counter(e.get("cat") for e in events)
    names = [str(e.get("name", "")) for e in events]
    phases = {n for e, n in zip(events, names) if e.get("cat") == "gpu_user_annotation"}
    nccl = Counter(m.group(1) for e, n in zip(events, names)
                   if e.get("cat") == "kernel" and (m := NCCL_KERNEL.match(n)))
    return {"kernels": cats["kernel"], "gpu_memcpy": cats["gpu_memcpy"],
            "profiler_steps": len({n for n in names if n.startswith("ProfilerStep#")}),
            "phases_on_gpu": sorted(p for p in phases if p.startswith("hf_distprof/")),
            "fsdp_annotations": dict(sorted(Counter(FSDP_UNIT.split(n, 1)[0] for e, n in zip(events, names)
                                                    if n.startswith("FSDP::") and e.get("ph") == "X").items())),
            "nccl_kernels": dict(sorted(nccl.items()))}


FSDP_UNIT = re.compile(r" \(| for ")
"""Where an FSDP range's name gives its unit: ``FSDP::all_gather (model.layers.0)``, ``FSDP::backward_prefetch for
model.layers.0``."""
NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def last_json(output: str) -> Any:
    """The last line of a snippet's output that is a JSON object (what it prints last; warnings may follow)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    expect(lines, "the program printed no JSON result")
    return json.loads(lines[-1])


def read_json(path: Path) -> Any:
    """A JSON file a run should have written (:class:`CheckFailed` naming it when missing)."""
    expect(path.is_file(), f"{path} was not written")
    return json.loads(path.read_text(encoding="utf-8"))

