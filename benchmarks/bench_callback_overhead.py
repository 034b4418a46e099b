#!/usr/bin/env python
"""What the always-on callbacks cost: the same 2-rank CPU DDP training with none, then with all of them.

    python benchmarks/bench_callback_overhead.py                 # 5 pairs of runs, 60 steps each
    python benchmarks/bench_callback_overhead.py --pairs 3 --steps 40

Each run is ``torchrun --nproc_per_node=2`` of this file in worker mode: a tiny ModernBERT (hidden 128,
4 layers, vocab 8192, ~1.7 M parameters) built from its config, trained by the HF Trainer on random
tokens (8 x 128 per rank per step), gloo. Variant A has no hf_distprof callback; variant B has every
always-on one: the profiler outside its active window (it never records), the memory logger at every
step, the step timer on every step. Both variants carry one ``on_step_end`` timestamp on rank 0, the
measurement itself; the Trainer logs every 10 steps in both.

Runs alternate A, B, B, A, ... so that drift of the machine hits both variants alike. The figure is the
median over pairs of (median step time of B) / (median step time of A), the first steps excluded.
"""

from __future__ import annotations

import argparse
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


def worker(variant: str, steps: int, result: Path) -> None:
    """One training run; rank 0 writes its per-step wall times to ``result``."""
    import torch
    import torch.distributed as dist
    from transformers import (
        ModernBertConfig,
        ModernBertForMaskedLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from hf_distprof import ProfilingArguments, build_callbacks

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stamps.append(time.perf_counter())

    torch.manual_seed(0)
    seq, vocab = 128, 8192
    config = ModernBertConfig(vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                              intermediate_size=256, max_position_embeddings=seq, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    model = ModernBertForMaskedLM(config)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(steps * 8 * 2 + 64):
        ids = torch.randint(5, vocab, (seq,), generator=g)
        labels = torch.where(torch.rand(seq, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    out = Path(tempfile.mkdtemp(prefix="bench_cb_"))
    clock = StepClock()
    callbacks: list[Any] = []
    if variant == "B":
        prof = ProfilingArguments(
            enable_profiling=True, profiler_skip_first=10**6,  # built and stepped, never recording
            enable_memory_logging=True, memory_log_steps=1, enable_step_timing=True,
            profiler_output_dir=str(out / "prof"),
        )
        callbacks = build_callbacks(prof)
    args = TrainingArguments(
        output_dir=str(out / "out"), use_cpu=True, max_steps=steps, per_device_train_batch_size=8,
        logging_steps=10, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        ddp_find_unused_parameters=False, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, clock])
    trainer.train()
    if dist.get_rank() == 0:
        result.write_text(json.dumps({"variant": variant, "stamps": clock.stamps}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(variant: str, steps: int) -> list[float]:
    """Launch one 2-rank run; returns its per-step wall times (rank 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", __file__, "--worker", variant, "--steps", str(steps),
               "--result", str(result)]
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"variant {variant} failed:\n{proc.stderr[-4000:]}")
        stamps = json.loads(result.read_text())["stamps"]
    return [b - a for a, b in itertools.pairwise(stamps)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs of runs (default 5)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    parser.add_argument("--worker", choices=("A", "B"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        try:
            worker(args.worker, args.steps, args.result)
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        return 0
    if args.steps <= WARMUP + 2 or args.pairs < 1:
        parser.error(f"--steps must be > {WARMUP + 2} and --pairs >= 1")

    ratios: list[float] = []
    medians: dict[str, list[float]] = {"A": [], "B": []}
    print(f"{args.pairs} A/B pairs, {args.steps} steps per run, 2 CPU ranks (gloo); step times in ms (median)")
    for pair in range(args.pairs):
        order = ("A", "B") if pair % 2 == 0 else ("B", "A")
        got = {}
        for variant in order:
            steps = one_run(variant, args.steps)[WARMUP:]
            got[variant] = statistics.median(steps)
            medians[variant].append(got[variant])
        ratios.append(got["B"] / got["A"])
        print(f"pair {pair + 1} ({''.join(order)}): none {got['A'] * 1e3:7.1f}   all callbacks "
              f"{got['B'] * 1e3:7.1f}   ratio {ratios[-1]:.4f}", flush=True)
    print(f"median step time: none {statistics.median(medians['A']) * 1e3:.1f} ms, "
          f"all callbacks {statistics.median(medians['B']) * 1e3:.1f} ms")
    print(f"median step-time ratio (all callbacks / none): {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}; target <= 1.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
