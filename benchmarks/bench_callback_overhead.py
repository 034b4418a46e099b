#!/usr/bin/env python
"""What the always-on callbacks cost: the same 2-rank CPU DDP training with none, then with all of them.

    python benchmarks/bench_callback_overhead.py                 # 8 A/B pairs of 40 steps
    python benchmarks/bench_callback_overhead.py --pairs 4 --steps 30
    python benchmarks/bench_callback_overhead.py --callbacks timer          # B = a subset of them

One ``torchrun --nproc_per_node=2`` launch of this file in worker mode: a tiny ModernBERT (hidden 128,
4 layers, vocab 8192, ~1.7 M parameters) built from its config, trained by the HF Trainer on random
tokens (8 x 128 per rank per step), gloo. The worker alternates ``trainer.train()`` calls of ``--steps``
steps on the same model: variant A with no hf_distprof callback, variant B with every always-on one (the
profiler built and stepped but outside its active window, the memory logger at every step, the step
timer on every step). Both variants carry one ``on_step_end`` timestamp on rank 0, the measurement
itself, and the Trainer logs every 10 steps in both.

The order is A B, B A, A B, ... so that drift of a shared machine hits both variants alike, and the
variants alternate every few seconds inside the same processes rather than across process launches.
The figure is the median over pairs of (median step time of B) / (median step time of A), the first
steps of every ``train()`` call excluded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WARMUP = 5  # steps excluded from each run's median (allocation, DDP bucket rebuild)


# The flag that switches each always-on callback on in variant B (--callbacks picks a subset).
CALLBACK_FLAGS: dict[str, str] = {
    "profiler": "enable_profiling",
    "memory": "enable_memory_logging",
    "timer": "enable_step_timing",
}


def variant_b_flags(names: str) -> dict[str, bool]:
    """``"memory,timer"`` -> the ProfilingArguments switches for exactly those callbacks."""
    chosen = set(names.split(","))
    return {flag: name in chosen for name, flag in CALLBACK_FLAGS.items()}


def worker(pairs: int, steps: int, names: str, result: Path) -> None:
    """All pairs of one launch; rank 0 writes the per-step wall times of every train() call to ``result``."""
    import torch
    import torch.distributed as dist
    from transformers import (
        ModernBertForMaskedLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from hf_distprof import ProfilingArguments, build_callbacks
    from hf_distprof.models import tiny_modernbert_config

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stamps.append(time.perf_counter())

    torch.manual_seed(0)
    seq, vocab = 128, 8192
    config = tiny_modernbert_config(vocab_size=vocab, seq_len=seq)
    model = ModernBertForMaskedLM(config)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(steps * 8 * 2 + 64):
        ids = torch.randint(5, vocab, (seq,), generator=g)
        labels = torch.where(torch.rand(seq, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    out = Path(tempfile.mkdtemp(prefix="bench_cb_"))
    runs: list[dict[str, Any]] = []
    for pair in range(pairs):
        for variant in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            clock = StepClock()
            callbacks: list[Any] = []
            if variant == "B":
                prof = ProfilingArguments(
                    profiler_skip_first=10**6,  # the profiler is built and stepped, never recording
                    memory_log_steps=1,
                    profiler_output_dir=str(out / "prof"),
                    **variant_b_flags(names),
                )
                callbacks = build_callbacks(prof)
            args = TrainingArguments(
                output_dir=str(out / "out"),
                use_cpu=True,
                max_steps=steps,
                per_device_train_batch_size=8,
                logging_steps=10,
                report_to="none",
                save_strategy="no",
                disable_tqdm=True,
                seed=0,
                ddp_find_unused_parameters=False,
                dataloader_num_workers=0,
            )
            trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, clock])
            with contextlib.redirect_stdout(io.StringIO()):  # the step timer's table, every train() call
                trainer.train()
            runs.append({"pair": pair, "variant": variant, "stamps": clock.stamps})
    if dist.get_rank() == 0:
        result.write_text(json.dumps(runs))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(pairs: int, steps: int, names: str) -> list[dict[str, Any]]:
    """One 2-rank launch running every pair; returns rank 0's runs with their per-step wall times."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            __file__,
            "--worker",
            "--pairs",
            str(pairs),
            "--steps",
            str(steps),
            "--callbacks",
            names,
            "--result",
            str(result),
        ]
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the benchmark launch failed:\n{proc.stderr[-4000:]}")
        runs = json.loads(result.read_text())
    for run in runs:
        run["step_s"] = [b - a for a, b in itertools.pairwise(run["stamps"])][WARMUP:]
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=8, help="A/B pairs (default 8)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per train() call (default 40)")
    parser.add_argument(
        "--callbacks",
        default=",".join(CALLBACK_FLAGS),
        help="variant B's callbacks, comma-separated (default: profiler,memory,timer)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        try:
            worker(args.pairs, args.steps, args.callbacks, args.result)
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        return 0
    if args.steps <= WARMUP + 2 or args.pairs < 1:
        parser.error(f"--steps must be > {WARMUP + 2} and --pairs >= 1")
    unknown = set(args.callbacks.split(",")) - set(CALLBACK_FLAGS)
    if unknown:
        parser.error(f"--callbacks: unknown {sorted(unknown)}; choose from {', '.join(CALLBACK_FLAGS)}")
    label = "all" if set(args.callbacks.split(",")) == set(CALLBACK_FLAGS) else args.callbacks

    print(
        f"{args.pairs} A/B pairs of {args.steps} steps, 2 CPU ranks (gloo), B = {label}; "
        "median step time in ms"
    )
    runs = launch(args.pairs, args.steps, args.callbacks)
    ratios: list[float] = []
    medians: dict[str, list[float]] = {"A": [], "B": []}
    for pair in range(args.pairs):
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
    print(
        f"median step-time ratio ({label} / none): {statistics.median(ratios):.4f} "
        f"(min {min(ratios):.4f}, max {max(ratios):.4f}; target <= 1.01)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
