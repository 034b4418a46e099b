#!/usr/bin/env python
"""What the always-on callbacks cost: the same training with none, then with all of them, alternated in one run.

    python benchmarks/bench_callback_overhead.py                 # 8 A/B pairs of 40 steps, 2 CPU ranks
    python benchmarks/bench_callback_overhead.py --pairs 4 --steps 30
    python benchmarks/bench_callback_overhead.py --callbacks timer          # B = a subset of them
    python benchmarks/bench_callback_overhead.py --device cuda --hidden-size 768 --layers 22 \
        --seq-len 1024 --batch-size 32 --bf16 --pairs 3 --steps 20      # one GPU, a 137 M-parameter model

On CPU (the default), one ``torchrun --nproc_per_node=2`` launch of this file in worker mode: a tiny ModernBERT
(hidden 128, 4 layers, vocab 8192, ~1.7 M parameters) built from its config, trained by the HF Trainer on random
tokens (8 x 128 per rank per step), gloo. ``--device cuda`` runs the worker in this one process on the GPU
instead (``--processes 1`` does that on CPU too), with the model shape, batch and precision the flags give: the
callbacks' cost with CUDA events and asynchronous gathers, on a GPU that runs behind the host. The worker
alternates ``trainer.train()`` calls of ``--steps`` steps on the same model: variant A with no hf_distprof
callback, variant B with every always-on one (the profiler built and stepped but outside its active window, the
memory logger every ``--memory-log-steps`` steps (10, hf_distprof's default), the step timer on every step). Both
variants carry one ``on_step_end`` timestamp on rank 0, the measurement itself, and the Trainer logs every 10 steps
in both. On a GPU these are host times: the host runs ahead of the GPU by at most its launch queue and waits for it
at every logging step (``loss.item()``), so while the GPU is the bottleneck they keep its pace, and host work of
ours shows only where it delays a launch.

The order is A B, B A, A B, ... so that drift of a shared machine hits both variants alike, and the
variants alternate every few seconds inside the same processes rather than across process launches.
The figure is the median over pairs of (median step time of B) / (median step time of A), the first
steps of every ``train()`` call excluded, with a bootstrap 95% interval over the pairs: on a shared
2-core VM whose cores change speed by ~20% for seconds at a time, the pairs spread by 5-10% and the
interval says what the run can resolve.

Variant B also times its own hf_distprof code directly (its *direct cost*): every callback hook, and
the step timer's model hooks, data-loader hook and phase labels, each with two ``perf_counter()``
calls, an outer call counted once. That figure is not blurred by the machine's speed changes, though
it leaves out indirect costs (a writer thread, cache effects), which only the A/B ratio sees. Rank 0
does more than the others (TensorBoard), and the step waits for the slowest rank, so both ranks'
direct costs are printed, as milliseconds per step and as a share of B's median step time.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import io
import itertools
import functools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WARMUP = 5  # steps excluded from each run's median (allocation, DDP bucket rebuild)
ONCE_PER_CALL = ("on_init_end", "on_train_begin", "on_train_end")  # hooks that run once per train() call


# The flags that switch each always-on callback on in variant B (--callbacks picks a subset); "capture" is the
# profiler's on-demand and anomaly watch, with its capture agreements (every 1-5 steps), and needs "profiler".
CALLBACK_FLAGS: dict[str, tuple[str, ...]] = {
    "profiler": ("enable_profiling",),
    "memory": ("enable_memory_logging",),
    "timer": ("enable_step_timing",),
    "capture": ("profile_on_demand", "profile_on_anomaly"),
}
DEFAULT_CALLBACKS = "profiler,memory,timer"
FLOOR = "floor"  # --callbacks floor: variant B is the least the step timer's stamps can cost (floor_callback)
VOCAB = 8192


@dataclass(frozen=True)
class Workload:
    """What every ``train()`` call trains: a ModernBERT built from its config (the demo's tiny one by default, vocab
    8192) on random tokens, ``batch_size`` sequences of ``seq_len`` per process and step."""

    device: str = "cpu"
    processes: int = 2
    hidden_size: int = 128
    layers: int = 4
    seq_len: int = 128
    batch_size: int = 8
    bf16: bool = False
    logging_steps: int = 10
    memory_log_steps: int = 10

    def describe(self) -> str:
        """One line for the output: where it runs and what it trains."""
        where = (f"{self.processes} CPU ranks (gloo)" if self.processes > 1 else "1 CPU process") \
            if self.device == "cpu" else "1 CUDA process"
        return (f"{where}, ModernBERT hidden {self.hidden_size} x {self.layers} layers, batch {self.batch_size} x "
                f"{self.seq_len} tokens{', bf16' if self.bf16 else ''}")

    def training_arguments(self, out: Path) -> dict[str, Any]:
        """The ``TrainingArguments`` of every ``train()`` call, variant A and B alike (the step clock ends each)."""
        return {"output_dir": str(out / "out"), "use_cpu": self.device == "cpu", "bf16": self.bf16,
                "max_steps": LONG_RUN_STEPS, "per_device_train_batch_size": self.batch_size,
                "logging_steps": self.logging_steps,
                "report_to": "none", "save_strategy": "no", "disable_tqdm": True, "seed": 0,
                "ddp_find_unused_parameters": False, "dataloader_num_workers": 0}


LONG_RUN_STEPS = 2 * 10**6
"""Every ``train()`` call's ``max_steps``, past the waiting profiler's first window (``--profiler-skip-first 10**6``);
the step clock ends training after the steps asked for."""


class DirectCost:
    """Seconds spent inside timed functions, per name; a timed call made inside another counts once.

    Every timed call is also kept as ``(name, start, seconds)`` in :attr:`calls`, so that the report can put each
    call in the optimizer step it ran in and tell ordinary steps from logging steps.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: list[tuple[str, float, float]] = []
        self.enabled = False
        self._depth = 0

    def reset(self) -> None:
        self.seconds = {}
        self.calls = []

    def add(self, name: str, start: float, seconds: float) -> None:
        """Count ``seconds`` spent from ``start`` under ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls.append((name, start, seconds))

    def wrap(self, fn: Any, name: str) -> Any:
        """``fn`` timed under ``name`` while :attr:`enabled` is set."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled or self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, start, time.perf_counter() - start)
                self._depth -= 1

        return timed

    def instrument_class(self, cls: type, prefix: str) -> None:
        """Time every public plain method of ``cls`` (properties and private helpers are left alone)."""
        for attr, value in list(vars(cls).items()):
            if not attr.startswith("_") and callable(value) and not isinstance(value, (staticmethod, classmethod)):
                setattr(cls, attr, self.wrap(value, f"{prefix}.{attr}"))

    def instrument_callback(self, callback: Any) -> None:
        """Time each ``on_*`` hook of one callback instance."""
        for attr in dir(type(callback)):
            if attr.startswith("on_"):
                setattr(callback, attr, self.wrap(getattr(callback, attr), f"{type(callback).__name__}.{attr}"))

    def instrument_model_hooks(self, hooks_cls: Any) -> None:
        """Time the step timer's forward and gradient hooks (``ModelHooks``) as ``model hooks``: their own Python,
        beyond the recorder and label calls inside them, which count under their own names."""
        original = hooks_cls.__init__
        direct = self

        def init(hooks: Any, model: Any, *args: Any, **kwargs: Any) -> None:
            original(hooks, model, *args, **kwargs)
            for registry in (model._forward_pre_hooks, model._forward_hooks):
                for key, hook in list(registry.items()):
                    if "ModelHooks" in getattr(hook, "__qualname__", ""):
                        registry[key] = direct.wrap(hook, "model hooks")
            hooks._grad_hook = direct.wrap(hooks._grad_hook, "model hooks")
            hooks._arm(hooks._params)

        hooks_cls.__init__ = init


def bootstrap_interval(ratios: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``ratios`` (pairs resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def variant_b_flags(names: str) -> dict[str, bool]:
    """``"memory,timer"`` -> the ProfilingArguments switches for exactly those callbacks."""
    chosen = set(names.split(","))
    return {flag: name in chosen for name, flags in CALLBACK_FLAGS.items() for flag in flags}


def worker(pairs: int, steps: int, names: str, result: Path, work: Workload) -> None:
    """All pairs of one launch; each rank writes the per-step wall times of every train() call to
    ``<result>.rank<R>``."""
    import torch
    import torch.distributed as dist
    from transformers import (
        ModernBertForMaskedLM,
        TrainerCallback,
    )

    from hf_distprof import ProfilingArguments
    from hf_distprof.recipe.models import tiny_modernbert_config

    direct = step_timer_direct_cost()

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stamps.append(time.perf_counter())

    torch.manual_seed(0)
    seq = work.seq_len
    config = tiny_modernbert_config(vocab_size=VOCAB, hidden_size=work.hidden_size, num_layers=work.layers,
                                    seq_len=seq)
    model = ModernBertForMaskedLM(config)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(steps * work.batch_size * 2 + 64):
        ids = torch.randint(5, VOCAB, (seq,), generator=g)
        labels = torch.where(torch.rand(seq, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    out = Path(tempfile.mkdtemp(prefix="bench_cb_"))
    runs: list[dict[str, Any]] = []
    for pair in range(pairs):
        for variant in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            clock = StepClock()
            prof: Any = None
            if variant == "B" and names == FLOOR:
                prof = FLOOR
            elif variant == "B":
                prof = ProfilingArguments(
                    profiler_skip_first=10**6,  # the profiler is built and stepped, never recording (within the run)
                    memory_log_steps=work.memory_log_steps,
                    profiler_output_dir=str(out / "prof"),
                    **variant_b_flags(names),
                )
            train_once(direct, prof, model, data, work, out, steps, clock)
            runs.append({"pair": pair, "variant": variant, "stamps": clock.stamps, "direct_s": direct.seconds,
                         "calls": direct.calls})
    Path(f"{result}.rank{dist.get_rank() if dist.is_initialized() else 0}").write_text(json.dumps(runs))


def train_once(direct: DirectCost, prof: Any, model: Any, data: Any, work: Workload, out: Path, steps: int,
               clock: Any) -> None:
    """One ``train()`` call of ``steps`` steps: with our callbacks built from ``prof`` (each hook timed by ``direct``),
    the floor's when it is :data:`FLOOR`, or none when it is None; ``clock`` (a callback) records the steps."""
    from transformers import Trainer, TrainingArguments

    from hf_distprof import build_callbacks

    callbacks = [floor_callback(direct)] if prof == FLOOR else build_callbacks(prof) if prof is not None else []
    for callback in callbacks:
        direct.instrument_callback(callback)
    from transformers import TrainerCallback

    class StopAfter(TrainerCallback):  # type: ignore[misc]
        """Ends training after ``steps`` steps: the run's max_steps lies past the waiting profiler's window, as in a
        long run (a run that ends before the window starts no profiler)."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step >= steps:
                control.should_training_stop = True

    args = TrainingArguments(**work.training_arguments(out))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, clock, StopAfter()])
    direct.reset()
    direct.enabled = prof is not None
    with contextlib.redirect_stdout(io.StringIO()):  # the step timer's table, every train() call
        trainer.train()
    direct.enabled = False


def floor_callback(direct: DirectCost) -> Any:
    """Variant B of ``--callbacks floor``: what stamping the step timer's phases costs at the least on this machine.

    At each point where the step timer hooks in (the data loader's ``next()``, the model's forward pre- and post-hook,
    one gradient hook, the four step hooks) one clock read appended to a list, and at the five where it reads the run
    queue on CPU (before and after ``next()``, the forward's start, the last gradient, before the optimizer) one
    ``pread`` of ``/proc/thread-self/schedstat``: no phases, no step structure, no logging step. The model hooks and the
    loader's proxy are timed as the step timer's are (``model hooks``, ``data loader hook``)."""
    from transformers import TrainerCallback

    from hf_distprof.timing.instrument import instrument_loader

    stamps: list[Any] = []
    clock = time.perf_counter
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:  # not Linux: the clock reads alone
        fd = -1

    def run_queue() -> Any:
        return os.pread(fd, 128, 0) if fd >= 0 else None

    def pre_forward(_module: Any, _args: Any, _kwargs: Any) -> None:
        stamps.append(clock())
        stamps.append(run_queue())

    def post_forward(_module: Any, _args: Any, _kwargs: Any, _output: Any) -> None:
        stamps.append(clock())

    def grad_ready(_param: Any) -> None:
        stamps.append(clock())
        stamps.append(run_queue())

    class FloorCallback(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None,
                           **kwargs: Any) -> None:
            stamps.clear()
            # The first parameter (a transformer's embeddings) gets its gradient last: one gradient call per backward.
            first = next(p for p in model.parameters() if p.requires_grad)
            timed = direct.wrap
            self.handles = [
                model.register_forward_pre_hook(timed(pre_forward, "model hooks"), with_kwargs=True, prepend=True),
                model.register_forward_hook(direct.wrap(post_forward, "model hooks"), with_kwargs=True),
                first.register_post_accumulate_grad_hook(direct.wrap(grad_ready, "model hooks")),
            ]
            self.undo = instrument_loader(train_dataloader, lambda s: stamps.append(run_queue()),
                                          lambda: stamps.append(run_queue()))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            for handle in self.handles:
                handle.remove()
            if self.undo is not None:
                self.undo()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(clock())

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(clock())
            stamps.append(run_queue())

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(clock())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(clock())

    return FloorCallback()


def step_timer_direct_cost() -> DirectCost:
    """A :class:`DirectCost` that also times the step timer's code running inside the Trainer's step rather than in
    a callback hook. The data loader hook's own cost is its on_fetch call (the phase label) and the recorder's data
    sink; the next() it wraps is the loader's time, not ours."""
    from hf_distprof.timing.instrument import ModelHooks, PhaseLabels, _TimedIterator
    from hf_distprof.timing.recorder import StepRecorder

    direct = DirectCost()
    direct.instrument_class(StepRecorder, "StepRecorder")
    direct.instrument_class(PhaseLabels, "PhaseLabels")
    direct.instrument_model_hooks(ModelHooks)
    _TimedIterator.__next__ = _untimed_next(direct, _TimedIterator.__next__)  # type: ignore[method-assign]
    return direct


def _untimed_next(direct: DirectCost, inner_next: Any) -> Any:
    """``_TimedIterator.__next__`` with the loader's own ``next()`` taken out of the direct cost."""

    @functools.wraps(inner_next)
    def timed_next(self: Any) -> Any:
        if not direct.enabled or direct._depth:
            return inner_next(self)
        inner = self._inner

        class Untimed:  # the wrapped iterator, its next() paused out of the timing
            def __next__(_self: Any) -> Any:
                direct._depth -= 1
                paused = time.perf_counter()
                try:
                    return next(inner)
                finally:
                    nonlocal excluded
                    excluded += time.perf_counter() - paused
                    direct._depth += 1

        excluded = 0.0
        self._inner = Untimed()
        direct._depth += 1
        start = time.perf_counter()
        try:
            return inner_next(self)
        finally:
            spent = time.perf_counter() - start - excluded
            direct._depth -= 1
            self._inner = inner
            direct.add("data loader hook", start, spent)

    return timed_next


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


@contextlib.contextmanager
def busy_core(on: bool = True) -> Iterator[None]:
    """A process spinning on one core for the duration (a user's data workers or a third rank), when ``on``."""
    import multiprocessing

    stop = multiprocessing.Event()
    spinner = multiprocessing.Process(target=_spin, args=(stop,), daemon=True) if on else None
    if spinner is not None:
        spinner.start()
    try:
        yield
    finally:
        if spinner is not None:
            stop.set()
            spinner.join(timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(pairs: int, steps: int, names: str, work: Workload) -> dict[int, list[dict[str, Any]]]:
    """Run every pair: 2 CPU ranks under torchrun, or this one process (``work.processes == 1``, every CUDA run).

    Returns:
        Each rank's runs with their per-step wall times (``step_s``, the first :data:`WARMUP` steps left out).
    """
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        if work.processes == 1:
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            worker(pairs, steps, names, result, work)
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={work.processes}",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, "--worker",
                   *worker_flags(pairs, steps, names, work), "--result", str(result)]
            env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"the benchmark launch failed:\n{proc.stderr[-4000:]}")
        per_rank = {rank: json.loads(Path(f"{result}.rank{rank}").read_text()) for rank in range(work.processes)}
    for runs in per_rank.values():
        for run in runs:
            run["step_s"] = [b - a for a, b in itertools.pairwise(run["stamps"])][WARMUP:]
    return per_rank


def worker_flags(pairs: int, steps: int, names: str, work: Workload) -> list[str]:
    """The command-line flags that give a torchrun worker the same pairs, callbacks and workload."""
    return ["--pairs", str(pairs), "--steps", str(steps), "--callbacks", names, "--device", work.device,
            "--processes", str(work.processes), "--hidden-size", str(work.hidden_size), "--layers", str(work.layers),
            "--seq-len", str(work.seq_len), "--batch-size", str(work.batch_size), *(["--bf16"] if work.bf16 else []),
            "--logging-steps", str(work.logging_steps), "--memory-log-steps", str(work.memory_log_steps)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs (default 8)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per train() call (default 40)")
    parser.add_argument(
        "--callbacks",
        default=DEFAULT_CALLBACKS,
        help=f"variant B's callbacks, comma-separated, from {', '.join(CALLBACK_FLAGS)} (default: "
             f"{DEFAULT_CALLBACKS}; capture needs profiler); or {FLOOR}: the least the step timer's stamps can cost "
             "(a clock read at each of its hook points, a run-queue read at each of its five, nothing else)",
    )
    shape = Workload()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default): 2 ranks on gloo; cuda: one process on the current GPU")
    parser.add_argument("--processes", type=int, choices=(1, 2), default=None,
                        help="processes: 2 on cpu (default there), 1 (the only choice on cuda)")
    parser.add_argument("--hidden-size", type=int, default=shape.hidden_size,
                        help=f"the model's hidden size, a multiple of 8 (default {shape.hidden_size})")
    parser.add_argument("--layers", type=int, default=shape.layers, help=f"encoder layers (default {shape.layers})")
    parser.add_argument("--seq-len", type=int, default=shape.seq_len, help=f"tokens per sequence (default "
                                                                             f"{shape.seq_len})")
    parser.add_argument("--batch-size", type=int, default=shape.batch_size,
                        help=f"sequences per process and step (default {shape.batch_size})")
    parser.add_argument("--bf16", action="store_true", help="train in bf16 mixed precision (the Trainer's --bf16)")
    parser.add_argument("--logging-steps", type=int, default=shape.logging_steps,
                        help=f"the Trainer's logging interval (default {shape.logging_steps}, as in the demo)")
    parser.add_argument("--memory-log-steps", type=int, default=shape.memory_log_steps,
                        help=f"variant B's --memory-log-steps (default {shape.memory_log_steps}, hf_distprof's "
                             "default; 1 samples memory at every step)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser


def parse_workload(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Workload:
    """The workload the flags ask for; a bad combination exits with status 2 naming the flag."""
    processes = args.processes or (2 if args.device == "cpu" else 1)
    if args.device == "cuda" and processes != 1:
        parser.error("--processes 2 with --device cuda: the GPU mode runs one process on one GPU")
    if args.device == "cuda" and not args.worker:
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device cuda: no CUDA device here (torch {torch.__version__})")
    if args.hidden_size % 8 or min(args.hidden_size, args.layers, args.seq_len, args.batch_size) < 1:
        parser.error("--hidden-size must be a positive multiple of 8 (4 attention heads of an even width); "
                     "--layers, --seq-len and --batch-size positive")
    if min(args.logging_steps, args.memory_log_steps) < 1:
        parser.error("--logging-steps and --memory-log-steps must be >= 1")
    return Workload(args.device, processes, args.hidden_size, args.layers, args.seq_len, args.batch_size, args.bf16,
                    args.logging_steps, args.memory_log_steps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    work = parse_workload(parser, args)
    if args.worker:
        try:
            worker(args.pairs, args.steps, args.callbacks, args.result, work)
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        return 0
    if args.steps <= WARMUP + 2 or args.pairs < 1:
        parser.error(f"--steps must be > {WARMUP + 2} and --pairs >= 1")
    unknown = set(args.callbacks.split(",")) - set(CALLBACK_FLAGS)
    if unknown and args.callbacks != FLOOR:
        parser.error(f"--callbacks: unknown {sorted(unknown)}; choose from {', '.join(CALLBACK_FLAGS)}, or {FLOOR} "
                     "alone")
    if "capture" in args.callbacks.split(",") and "profiler" not in args.callbacks.split(","):
        parser.error("--callbacks: capture needs profiler")
    label = "all" if set(args.callbacks.split(",")) == set(DEFAULT_CALLBACKS.split(",")) else args.callbacks

    print(f"{args.pairs} A/B pairs of {args.steps} steps, {work.describe()}, B = {label}; median step time in ms",
          flush=True)
    per_rank = launch(args.pairs, args.steps, args.callbacks, work)
    report(per_rank, args.pairs, label, work.logging_steps, targets(work))
    return 0


def targets(work: Workload) -> tuple[float, str] | None:
    """The always-on set's targets for this workload (issue 41): the ordinary step's direct cost in ms and the mean's;
    None where none is set (2 CPU ranks)."""
    if work.device == "cuda":
        return 0.1, "1% of the step"
    if work.processes == 1:
        return (0.08 if work.memory_log_steps == 1 else 0.05), "0.3 ms"
    return None


def report(per_rank: dict[int, list[dict[str, Any]]], pairs: int, label: str, logging_steps: int = 10,
           targets: tuple[float, str] | None = None) -> None:
    """Print each pair, the median ratio with its interval, and each rank's direct cost: the mean over all steps, the
    ordinary step's (per feature, the costliest names) and the logging step's."""
    runs = per_rank[0]
    ratios: list[float] = []
    medians: dict[str, list[float]] = {"A": [], "B": []}
    for pair in range(pairs):
        got = {r["variant"]: statistics.median(r["step_s"]) for r in runs if r["pair"] == pair}
        order = "".join(r["variant"] for r in runs if r["pair"] == pair)
        for variant, value in got.items():
            medians[variant].append(value)
        ratios.append(got["B"] / got["A"])
        print(
            f"pair {pair + 1} ({order}): none {got['A'] * 1e3:7.1f}   "
            f"{label} {got['B'] * 1e3:7.1f}   ratio {ratios[-1]:.4f}"
        )
    print(
        f"median step time: none {statistics.median(medians['A']) * 1e3:.1f} ms, "
        f"{label} {statistics.median(medians['B']) * 1e3:.1f} ms"
    )
    low, high = bootstrap_interval(ratios)
    print(
        f"median step-time ratio ({label} / none): {statistics.median(ratios):.4f} "
        f"(95% interval {low:.4f}-{high:.4f}; pairs min {min(ratios):.4f}, max {max(ratios):.4f}; target <= 1.01)"
    )
    step_b = statistics.median(medians["B"])
    for rank, rank_runs in per_rank.items():
        costs = direct_costs([r for r in rank_runs if r["variant"] == "B"], logging_steps)
        top = ", ".join(f"{name} {sec * 1e3:.3f}" for name, sec in costs.top_ordinary[:4])
        print(
            f"direct cost, rank {rank}: {costs.mean * 1e3:.3f} ms per step = {costs.mean / step_b * 100:.2f}% of "
            f"{label}'s median step (the mean over all steps); once per train() call: {costs.once * 1e3:.1f} ms"
        )
        features = ", ".join(f"{feature} {sec * 1e3:.3f}" for feature, sec in costs.by_feature.items()
                             if sec or feature != "floor")
        print(f"  ordinary step (median of per-step sums): {costs.ordinary * 1e3:.3f} ms ({features}; their mean "
              f"{costs.ordinary_mean * 1e3:.3f}); most: {top}")
        top_log = ", ".join(f"{name} {sec * 1e3:.3f}" for name, sec in costs.top_logging[:6])
        print(f"  logging step (median): {costs.logging * 1e3:.3f} ms over {costs.logging_steps} logging steps, "
              f"{costs.ordinary_steps} ordinary ones; most: {top_log}")
        top_after = ", ".join(f"{name} {sec * 1e3:.3f}" for name, sec in costs.top_after[:3])
        print(f"  the step after a logging step (median): {costs.after_logging * 1e3:.3f} ms; most: {top_after}")
        if rank == 0 and targets:
            print(f"  targets: ordinary step <= {targets[0]:g} ms, mean <= {targets[1]}")


# Each always-on feature's timed names: the callback's hooks, and for the step timer the code it runs inside the
# Trainer's step (recorder, phase labels, data loader hook, model hooks).
FEATURES = {"timer": ("StepTimerCallback.", "StepRecorder.", "PhaseLabels.", "data loader hook", "model hooks"),
            "memory": ("MemoryLoggerCallback.",), "profiler": ("ProfilerCallback.",), "floor": ("FloorCallback.",)}


@dataclass
class Costs:
    """Direct costs of one rank's B runs, in seconds: per ordinary step and per logging step (medians over the steps
    of the per-step sums), the mean over all steps, the ordinary step's median per feature and its costliest names."""

    ordinary: float
    logging: float
    mean: float
    once: float
    by_feature: dict[str, float]
    top_ordinary: list[tuple[str, float]]
    ordinary_steps: int
    logging_steps: int
    top_logging: list[tuple[str, float]]
    ordinary_mean: float
    after_logging: float
    top_after: list[tuple[str, float]]


def step_of(name: str, start: float, stamps: list[float]) -> int:
    """The 1-based optimizer step a timed call ran in: the step whose ``on_step_end`` stamp (taken after our hooks)
    comes first after it; ``on_log``, which the Trainer calls after the logging step's ``on_step_end``, is that
    step's."""
    step = bisect.bisect_left(stamps, start) + 1
    return step - 1 if name.endswith(".on_log") else step


def direct_costs(b_runs: list[dict[str, Any]], logging_steps: int) -> Costs:
    """Each B run's timed calls put in their steps (the first :data:`WARMUP` left out), ordinary and logging steps
    apart; what runs once per ``train()`` call counts apart."""
    ordinary: list[float] = []
    logging: list[float] = []
    after: list[float] = []
    per_name: dict[str, list[float]] = {}
    per_name_logging: dict[str, list[float]] = {}
    per_name_after: dict[str, list[float]] = {}
    feature_sums: dict[str, list[float]] = {f: [] for f in FEATURES}
    means: list[float] = []
    once: list[float] = []
    for r in b_runs:
        stamps = r["stamps"]
        steps = range(WARMUP + 1, len(stamps) + 1)
        by_step: dict[int, dict[str, float]] = {s: {} for s in steps}
        spent_once = 0.0
        for name, start, seconds in r["calls"]:
            if name.rsplit(".", 1)[-1] in ONCE_PER_CALL:
                spent_once += seconds
                continue
            step = step_of(name, start, stamps)
            if step in by_step:
                by_step[step][name] = by_step[step].get(name, 0.0) + seconds
        once.append(spent_once)
        means.append(sum(sum(c.values()) for c in by_step.values()) / max(1, len(by_step)))
        for step, calls in by_step.items():
            if step % logging_steps == 0:
                logging.append(sum(calls.values()))
                for name in {n for c in by_step.values() for n in c}:
                    per_name_logging.setdefault(name, []).append(calls.get(name, 0.0))
                continue
            if step % logging_steps == 1:  # an ordinary step, where what a logging step left may be done
                after.append(sum(calls.values()))
                for name in {n for c in by_step.values() for n in c}:
                    per_name_after.setdefault(name, []).append(calls.get(name, 0.0))
            ordinary.append(sum(calls.values()))
            for feature, prefixes in FEATURES.items():
                feature_sums[feature].append(sum(v for n, v in calls.items() if n.startswith(prefixes)))
            for name in {n for c in by_step.values() for n in c}:
                per_name.setdefault(name, []).append(calls.get(name, 0.0))

    def median(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    def costliest(names: dict[str, list[float]]) -> list[tuple[str, float]]:
        return sorted(((n, median(v)) for n, v in names.items()), key=lambda kv: -kv[1])

    return Costs(median(ordinary), median(logging), median(means), median(once),
                 {f: median(v) for f, v in feature_sums.items()}, costliest(per_name), len(ordinary), len(logging),
                 costliest(per_name_logging), statistics.mean(ordinary) if ordinary else 0.0, median(after),
                 costliest(per_name_after))


if __name__ == "__main__":
    sys.exit(main())
