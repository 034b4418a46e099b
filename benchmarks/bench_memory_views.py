#!/usr/bin/env python
"""What each memory view costs a step, measured side by side in one process.

    python benchmarks/bench_memory_views.py              # 6 rounds of 12 steps per variant
    python benchmarks/bench_memory_views.py --rounds 10 --steps 20

The tiny ModernBERT of the demo (hidden 128, 4 layers, vocab 8192, ~1.7 M parameters), built from its
config, trains on random tokens (batch 8 x 128) with AdamW, single process on CPU, the Trainer's hook
sequence called by hand (as ``tests/unit/fake_trainer.py`` does). Each round runs every variant for
``--steps`` steps, in an order that rotates from round to round, on the same model:

- ``baseline``: no callback;
- ``logger``: ``MemoryLoggerCallback`` sampling at every step (``--memory-log-steps 1``, with peak resets);
- ``stats``: ``MemoryViewsCallback`` with every step in its window: host memory at step start/end and
  around forward, one YAML entry per step (``--memory-snapshot`` asked on CPU, which only says it needs a
  GPU, so the stats are all that run);
- ``activations``: the same plus ``--track-activation-memory`` (a saved-tensors hook on every saved tensor);
- ``tracker``: ``--memory-tracker``: the one step it measures (a TorchDispatchMode over the whole step).

The figure per variant is the median over rounds of (its median step time) / (the baseline's median step
time in the same round); ``tracker`` is its one step over the baseline's median.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("baseline", "logger", "stats", "activations", "tracker")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    opts = parser.parse_args()

    import torch
    from transformers import ModernBertForMaskedLM, TrainerControl, TrainerState, TrainingArguments

    from hf_distprof import MemoryLoggerCallback, MemoryViewsCallback, ProfilingArguments
    from hf_distprof.recipe.models import tiny_modernbert_config

    logging.disable(logging.WARNING)  # "--memory-snapshot needs a GPU", once per callback
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ModernBertForMaskedLM(tiny_modernbert_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, 8192, (8, 128))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    tmp = Path(tempfile.mkdtemp(prefix="bench_mem_"))
    train_args = TrainingArguments(output_dir=str(tmp / "out"), use_cpu=True, report_to=[])

    def callbacks(variant: str, round_: int) -> list[Any]:
        common = dict(profiler_output_dir=str(tmp / "prof"), profiler_run_name=f"{variant}{round_}",
                      profiler_wait_steps=0, profiler_warmup_steps=0)
        if variant == "logger":
            return [MemoryLoggerCallback(ProfilingArguments(enable_memory_logging=True, memory_log_steps=1,
                                                            **common))]
        if variant in ("stats", "activations"):
            return [MemoryViewsCallback(ProfilingArguments(
                memory_snapshot=True, track_activation_memory=variant == "activations",
                profiler_active_steps=10**6, **common))]
        if variant == "tracker":
            # Window = step 1; the tracker measures step 2.
            return [MemoryViewsCallback(ProfilingArguments(memory_tracker=True, profiler_active_steps=1, **common))]
        return []

    def run(variant: str, round_: int) -> list[float]:
        cbs = callbacks(variant, round_)
        state, control = TrainerState(), TrainerControl()
        state.max_steps = opts.steps
        for cb in cbs:
            cb.on_train_begin(train_args, state, control, model=model)
        times = []
        for step in range(1, opts.steps + 1):
            begin = time.perf_counter()
            for cb in cbs:
                cb.on_step_begin(train_args, state, control, model=model, optimizer=optimizer)
            model(**batch).loss.backward()
            optimizer.step()
            for cb in cbs:
                cb.on_optimizer_step(train_args, state, control, model=model, optimizer=optimizer)
            optimizer.zero_grad()
            state.global_step = step
            for cb in cbs:
                cb.on_step_end(train_args, state, control, model=model, optimizer=optimizer)
            times.append(time.perf_counter() - begin)
        for cb in cbs:
            cb.on_train_end(train_args, state, control, model=model)
        return times

    run("baseline", -1)  # warm-up: allocator, optimizer state
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "baseline"}
    baselines: list[float] = []
    for round_ in range(opts.rounds):
        order = VARIANTS[round_ % len(VARIANTS):] + VARIANTS[: round_ % len(VARIANTS)]
        medians: dict[str, float] = {}
        for variant in order:
            times = run(variant, round_)
            medians[variant] = times[1] if variant == "tracker" else statistics.median(times[1:])
        baselines.append(medians["baseline"])
        for variant in ratios:
            ratios[variant].append(medians[variant] / medians["baseline"])
    print(f"baseline step: {1000 * statistics.median(baselines):.0f} ms (median over rounds)")
    print(f"step time / baseline, median of {opts.rounds} rounds of {opts.steps} steps (min-max):")
    for variant, values in ratios.items():
        print(f"  {variant:<12} {statistics.median(values):6.3f}x  ({min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
