#!/usr/bin/env python
"""Where the always-on callbacks' cost comes from: each feature alone, each step-timer instrument taken out, and the
whole set, against none, in one run, on 2 CPU ranks (gloo).

    python benchmarks/bench_overhead_attribution.py              # 30 rounds of none, all, all@1: 12 steps each
    python benchmarks/bench_overhead_attribution.py --busy       # the same beside a busy core (a spinning process)
    python benchmarks/bench_overhead_attribution.py --variants every --rounds 10   # each feature, each instrument

``bench_callback_overhead.py`` measures the whole set against none (A/B) and the direct cost of our hooks. The
difference between the two (the A/B ratio less 1, less the direct cost's share of the step) is the *indirect* cost:
what our callbacks cause around them (a Python hook in the autograd engine, a thread woken, garbage left for the
collector, a cache disturbed) and never time themselves. This benchmark attributes it: one ``torchrun`` launch trains
the same tiny ModernBERT with the Trainer (random tokens, 8 x 128 per rank per step), each variant a ``train()``
call of ``--steps`` steps, every variant once per round, in orders where each variant follows each other one
equally often (:func:`balanced_orders`), so that a shared machine's drift, and whatever one call leaves to the next,
fall on all alike. Per round and variant: the median step time over
its steps (the first step and the ``--warmup`` after it left out) divided by the same round's ``none``; the figure
is the median over rounds, with a bootstrap 95% interval, and the direct cost of the variant's hooks, per step
(``bench_callback_overhead.DirectCost``). The same ratio of *mean* step times is printed beside it: a cost paid on
one step in ten (a logging step's gather, the memory logger's sample) moves a mean and hides from a median.

Many short calls rather than a few long ones: on a shared 2-core VM whose cores change speed by ~20% for seconds at
a time, a 30-step call (10 s) mixes speeds and every pair's ratio spreads by 5-10%, so 8 rounds resolve nothing
finer than +-5%; a 12-step call (4 s) mostly runs at one speed, the rounds that straddle a change fall to the tails,
and the median of 30 rounds resolves about +-1.5% in 6 minutes.

The variants (``--variants`` picks some; ``none`` is always run):

- ``none``: no hf_distprof callback (the reference);
- ``all``: the always-on set at its defaults: the profiler built and waiting for its window, the memory logger every
  10 steps, the step timer; ``all@1``: the memory logger every step;
- ``profiler``, ``memory``, ``memory@1``, ``timer``: each alone;
- ``timer-grad``, ``timer-runqueue``, ``timer-labels``, ``timer-loader``: the step timer with one instrument taken
  out: the per-parameter gradient hooks (the end of backward), the run-queue reads (the wait for a CPU), the phase
  ranges, the data-loader hook. Its cost in ``timer`` less its cost without the instrument is that instrument's.
- ``memory@1-tensorboard``, ``memory@1-peak``, ``memory@1-state``, ``memory@1-jsonl``: the memory logger at every
  step with one part taken out: rank 0's TensorBoard events of the samples, the peak-RSS reset at every sample, the
  model state's sizes at every optimizer step, the line per sample in ``memory_rank{R}.jsonl``.

The default is ``none,all,all@1`` (the always-on set's targets: the defaults, and memory every step); ``every`` is
all of them.

``--busy`` adds a process that spins on one core for the whole run: a user's data workers or a third rank.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_callback_overhead import (  # noqa: E402
    ONCE_PER_CALL,
    VOCAB,
    Workload,
    bootstrap_interval,
    busy_core,
    free_port,
    step_timer_direct_cost,
    train_once,
)

# variant -> (ProfilingArguments overrides, step-timer instrument taken out or "")
ALWAYS_ON = {"enable_profiling": True, "enable_memory_logging": True, "enable_step_timing": True}
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "all": (ALWAYS_ON, ""),
    "all@1": ({**ALWAYS_ON, "memory_log_steps": 1}, ""),
    "profiler": ({"enable_profiling": True, "enable_step_timing": False}, ""),
    "memory": ({"enable_memory_logging": True}, ""),
    "memory@1": ({"enable_memory_logging": True, "memory_log_steps": 1}, ""),
    "timer": ({"enable_step_timing": True}, ""),
    "timer-grad": ({"enable_step_timing": True}, "grad"),
    "timer-runqueue": ({"enable_step_timing": True}, "runqueue"),
    "timer-labels": ({"enable_step_timing": True}, "labels"),
    "timer-loader": ({"enable_step_timing": True}, "loader"),
    "memory@1-tensorboard": ({"enable_memory_logging": True, "memory_log_steps": 1}, "tensorboard"),
    "memory@1-peak": ({"enable_memory_logging": True, "memory_log_steps": 1}, "peak"),
    "memory@1-state": ({"enable_memory_logging": True, "memory_log_steps": 1}, "state"),
    "memory@1-jsonl": ({"enable_memory_logging": True, "memory_log_steps": 1}, "jsonl"),
}
DEFAULT_VARIANTS = "none,all,all@1"


@contextlib.contextmanager
def without(instrument: str) -> Iterator[None]:
    """The step timer or the memory logger built with one instrument taken out (patched for the duration of one
    ``train()`` call)."""

    from hf_distprof.callbacks import step_timer
    from hf_distprof.callbacks.memory import logger as memory, stats as memstats
    from hf_distprof.timing import cpu_wait, instrument as inst

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    if instrument == "grad":
        def no_grad_hooks(self: Any, params: Any) -> None:
            self._grad_handles = []

        patch(inst.ModelHooks, "_arm", no_grad_hooks)
    elif instrument == "runqueue":
        patch(cpu_wait.RunQueueClock, "raw", lambda self: None)  # the step timer's reads (read() goes through it)
    elif instrument == "labels":
        for name in ("enter", "exit", "fetch"):
            patch(inst.PhaseLabels, name, lambda self, *a: None)
    elif instrument == "loader":
        patch(step_timer, "instrument_loader", lambda loader, *a, **k: None)
    elif instrument == "tensorboard":  # rank 0's TensorBoard events of the memory samples
        patch(memory, "tensorboard", _WithoutScalars(memory.tensorboard))
    elif instrument == "peak":  # the peak RSS reset at every sample (/proc/self/clear_refs)
        patch(memstats, "_reset_peak_rss", lambda: None)
    elif instrument == "state":  # the model state's sizes at every optimizer step
        patch(memory, "model_state_memory", lambda *a, **k: dict.fromkeys(memory.MODEL_STATE_METRICS, 0.0))
    elif instrument == "jsonl":  # the line per sample in memory_rank{R}.jsonl
        begin = memory.MemoryLoggerCallback.on_train_begin

        def no_jsonl(self: Any, *args: Any, **kwargs: Any) -> None:
            begin(self, *args, **kwargs)
            if self._jsonl is not None:
                self._jsonl.close()
            self._jsonl = None

        patch(memory.MemoryLoggerCallback, "on_train_begin", no_jsonl)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` variants in which each variant comes right after each other one equally often (a Williams
    design: rows of a balanced Latin square, mirrored for odd ``n``). A plain rotation keeps every variant behind the
    same neighbour, so whatever a ``train()`` call leaves behind (its threads winding down, its garbage, a file being
    flushed) would fall on one variant only: in a rotation of none, all, all@1, memory@1 beside a busy core,
    ``memory@1`` (always after ``all@1``) read 0.973 in two runs, faster than no callback at all."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    rows = [[(v + shift) % n for v in first] for shift in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


class _WithoutScalars:
    """``hf_distprof.tensorboard`` with ``add_scalars`` and ``add_scalar_events`` doing nothing."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return (lambda *a, **k: None) if name in ("add_scalars", "add_scalar_events") else getattr(self._module, name)


def worker(rounds: int, steps: int, names: list[str], result: Path) -> None:
    """Every round of one launch; each rank writes its runs' step timestamps and direct costs to
    ``<result>.rank<R>``."""
    import torch
    import torch.distributed as dist
    from transformers import ModernBertForMaskedLM, TrainerCallback

    from hf_distprof import ProfilingArguments
    from hf_distprof.recipe.models import tiny_modernbert_config

    direct = step_timer_direct_cost()

    class StepClock(TrainerCallback):  # type: ignore[misc]
        """Per step: wall time, the process's CPU time (every thread: gloo's too) and the training thread's."""

        def __init__(self) -> None:
            self.stamps: list[float] = []
            self.cpu: list[float] = []
            self.main: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stamps.append(time.perf_counter())
            self.cpu.append(time.process_time())
            self.main.append(time.thread_time())

    work = Workload()
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(tiny_modernbert_config(vocab_size=VOCAB, hidden_size=work.hidden_size,
                                                         num_layers=work.layers, seq_len=work.seq_len))
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(steps * work.batch_size * 2 + 64):
        ids = torch.randint(5, VOCAB, (work.seq_len,), generator=g)
        labels = torch.where(torch.rand(work.seq_len, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    out = Path(tempfile.mkdtemp(prefix="bench_attr_"))
    runs: list[dict[str, Any]] = []
    orders = balanced_orders(len(names))
    for r in range(rounds):
        for name in (names[i] for i in orders[r % len(orders)]):
            clock = StepClock()
            overrides, instrument = VARIANTS.get(name, ({}, ""))
            with without(instrument) if instrument else contextlib.nullcontext():
                prof = None if name == "none" else ProfilingArguments(
                    profiler_skip_first=10**6, profiler_output_dir=str(out / "prof"), **overrides)
                train_once(direct, prof, model, data, work, out, steps, clock)
            runs.append({"round": r, "variant": name, "stamps": clock.stamps, "cpu": clock.cpu, "main": clock.main,
                         "direct_s": direct.seconds})
    Path(f"{result}.rank{dist.get_rank() if dist.is_initialized() else 0}").write_text(json.dumps(runs))


def launch(rounds: int, steps: int, names: list[str], busy: bool, warmup: int) -> dict[int, list[dict[str, Any]]]:
    with busy_core(busy), tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", __file__, "--worker", "--rounds", str(rounds), "--steps",
               str(steps), "--variants", ",".join(names), "--result", str(result)]
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the benchmark launch failed:\n{proc.stderr[-4000:]}")
        per_rank = {rank: json.loads(Path(f"{result}.rank{rank}").read_text()) for rank in (0, 1)}
    for runs in per_rank.values():
        for run in runs:
            for key, out in (("stamps", "step_s"), ("cpu", "cpu_s"), ("main", "main_s")):
                run[out] = [b - a for a, b in itertools.pairwise(run[key])][warmup:]
    return per_rank


def direct_per_step(run: dict[str, Any]) -> float:
    """Seconds of our hooks per step in one run (what runs once per train() call left out)."""
    every = {n: s for n, s in run["direct_s"].items() if n.rsplit(".", 1)[-1] not in ONCE_PER_CALL}
    return sum(every.values()) / (len(run["stamps"]) or 1)


def _ratios(per_rank: dict[int, list[dict[str, Any]]], name: str, key: str,
            stat: Callable[[list[float]], float] = statistics.median) -> list[float]:
    """Per round: the variant's median (or ``stat``) per-step figure over the same round's ``none``, mean over the
    ranks."""
    out = []
    for rnd in sorted({r["round"] for r in per_rank[0]}):
        per = []
        for runs in per_rank.values():
            got = {r["variant"]: stat(r[key]) for r in runs if r["round"] == rnd}
            if name in got and got.get("none"):
                per.append(got[name] / got["none"])
        if per:
            out.append(sum(per) / len(per))
    return out


def report(per_rank: dict[int, list[dict[str, Any]]], rounds: int, names: list[str]) -> None:
    """One line per variant: the ratio to ``none`` of the wall step time, of the process's CPU time per step (every
    thread) and of the training thread's (medians over rounds, 95% intervals), the direct cost of each rank, and the
    indirect cost: a ratio's excess less the direct cost's share of ``none``'s step."""
    step_none = statistics.median(statistics.median(r["step_s"]) for r in per_rank[0] if r["variant"] == "none")
    cpu_none = statistics.median(statistics.median(r["cpu_s"]) for r in per_rank[0] if r["variant"] == "none")
    print(f"none: median step {step_none * 1e3:.1f} ms wall, {cpu_none * 1e3:.1f} ms of CPU (rank 0's process) over "
          f"{rounds} rounds")
    print(f"{'variant':<16}{'wall A/B (95%)':>26}{'CPU A/B (95%)':>26}{'mean-step A/B (95%)':>26}{'main A/B':>10}"
          f"{'direct ms r0/r1':>17}{'direct %':>10}{'indirect % wall/CPU':>21}")
    tops: dict[str, str] = {}
    for name in names:
        if name == "none":
            continue
        direct = [statistics.median(direct_per_step(r) for r in per_rank[rank] if r["variant"] == name)
                  for rank in sorted(per_rank)]
        direct_pct = 100.0 * max(direct) / step_none
        cells, excess = [], []
        for key in ("step_s", "cpu_s"):
            ratios = _ratios(per_rank, name, key)
            low, high = bootstrap_interval(ratios)
            ratio = statistics.median(ratios)
            cells.append(f"{ratio:.4f} ({low:.3f}-{high:.3f})")
            base = step_none if key == "step_s" else cpu_none
            excess.append(100.0 * (ratio - 1.0) - 100.0 * max(direct) / base)
        means = _ratios(per_rank, name, "step_s", statistics.fmean)
        low, high = bootstrap_interval(means)
        cells.append(f"{statistics.median(means):.4f} ({low:.3f}-{high:.3f})")
        main = statistics.median(_ratios(per_rank, name, "main_s"))
        direct_ms = f"{direct[0] * 1e3:.2f}/{direct[-1] * 1e3:.2f}"
        tops[name] = _top_hooks([r for r in per_rank[0] if r["variant"] == name])
        print(f"{name:<16}{cells[0]:>26}{cells[1]:>26}{cells[2]:>26}{main:>10.4f}{direct_ms:>17}{direct_pct:>9.2f}%"
              f"{f'{excess[0]:.2f}/{excess[1]:.2f}':>21}")
    print("direct cost by hook, rank 0, ms per step:")
    for name, top in tops.items():
        print(f"  {name}: {top}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="rounds: every variant once per round (default 30)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per train() call (default 12)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help=f"comma-separated, from none, {', '.join(VARIANTS)}; every: all of them "
                             f"(default {DEFAULT_VARIANTS})")
    parser.add_argument("--warmup", type=int, default=2,
                        help="steps left out at the start of every train() call, after its first (default 2)")
    parser.add_argument("--busy", action="store_true", help="a process spinning on one core beside the ranks")
    parser.add_argument("--save", type=Path, help="also write every run's per-step figures, per rank, to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    asked = list(VARIANTS) if args.variants == "every" else args.variants.split(",")
    names = list(dict.fromkeys(["none", *asked]))
    unknown = [n for n in names if n != "none" and n not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from none, {', '.join(VARIANTS)}")
    if args.warmup < 0 or args.steps <= args.warmup + 2 or args.rounds < 1:
        parser.error(f"--warmup must be >= 0, --steps > --warmup + 2 (here {args.warmup + 2}) and --rounds >= 1")
    if args.worker:
        try:
            worker(args.rounds, args.steps, names, args.result)
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        return 0
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds x {len(names)} variants x {args.steps} steps, 2 CPU ranks (gloo), "
          f"{'beside a busy core' if args.busy else 'no busy core added'}; load average {load:.1f}", flush=True)
    per_rank = launch(args.rounds, args.steps, names, args.busy, args.warmup)
    if args.save is not None:
        args.save.write_text(json.dumps(per_rank))
    report(per_rank, args.rounds, names)
    return 0


def _top_hooks(runs: list[dict[str, Any]], n: int = 5) -> str:
    """Rank 0's costliest hooks of one variant, ms per step (mean over its runs, once-per-call hooks left out)."""
    totals: dict[str, float] = {}
    for r in runs:
        steps = len(r["stamps"]) or 1
        for hook, sec in r["direct_s"].items():
            if hook.rsplit(".", 1)[-1] not in ONCE_PER_CALL:
                totals[hook] = totals.get(hook, 0.0) + sec / steps / len(runs)
    return ", ".join(f"{h} {sec * 1e3:.2f}" for h, sec in sorted(totals.items(), key=lambda kv: -kv[1])[:n])


if __name__ == "__main__":
    sys.exit(main())
