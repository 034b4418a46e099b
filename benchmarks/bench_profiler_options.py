#!/usr/bin/env python
"""What each torch.profiler option costs the steps it traces, measured side by side in one process.

    python benchmarks/bench_profiler_options.py              # every option, 6 traced steps each
    python benchmarks/bench_profiler_options.py --active 10 --rounds 2

A tiny ModernBERT (hidden 128, 4 layers, vocab 8192, ~1.7 M parameters, batch 8 x 128, AdamW; or with
``--model gpt2`` a 3-layer GPT-2, n_embd 128) trains on random tokens in one process on the CPU. For each
variant (no option, ``record_shapes``, ``profile_memory``, ``with_stack``, ``with_flops``, all of them)
it runs ``--before`` untraced steps, then a profiler window of 1 warmup + ``--active`` recorded steps
(exported to a temporary file, as the callback does), then ``--after`` untraced steps. Per variant it
prints the median traced step over the median untraced step before it (``inside``), the same for the
steps after the profiler stopped (``after``), how the traced steps grow (last / first), and the trace
size. Variants run in rounds, in rotated order, so that drift of a shared machine hits them alike; the
figure is the median over rounds.

The profiler's cost on the CPU grows with the number of ops it records: these ratios are for this
tiny model (short ops), about the worst case; a model with larger ops pays less per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

VARIANTS: dict[str, dict[str, bool]] = {
    "none": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
    "with_flops": {"with_flops": True},
    "all": {"record_shapes": True, "profile_memory": True, "with_stack": True, "with_flops": True},
}


def one_variant(model, opt, batch, options: dict[str, bool], before: int, active: int, after: int) -> dict:
    """Step times before, inside and after one profiler window with ``options``."""
    from torch.profiler import ProfilerActivity, profile, schedule

    def step() -> float:
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    pre = [step() for _ in range(before)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json.gz"
        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
            **options,
        )
        inside = []
        with prof:
            for i in range(1 + active):
                t = step()
                if i >= 1:
                    inside.append(t)
                prof.step()
        size = out.stat().st_size if out.exists() else 0
    post = [step() for _ in range(after)]
    ref = statistics.median(pre)
    return {
        "inside": statistics.median(inside) / ref,
        "after": statistics.median(post) / ref if post else None,
        "growth": inside[-1] / inside[0],
        "trace_kb": size / 1e3,
        "median_untraced_s": ref,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--active", type=int, default=6, help="Recorded steps per window (default 6).")
    parser.add_argument("--before", type=int, default=6, help="Untraced steps before each window.")
    parser.add_argument("--after", type=int, default=6, help="Untraced steps after each window.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds over all variants (default 3).")
    parser.add_argument("--model", choices=("modernbert", "gpt2"), default="modernbert",
                        help="The tiny ModernBERT (default) or a 3-layer GPT-2 (n_embd 128), the model of issue 9.")
    parser.add_argument("--json", type=Path, help="Also write the results here.")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from transformers import ModernBertForMaskedLM

    from hf_distprof.recipe.models import tiny_modernbert_config

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=128, n_embd=128, n_layer=3, n_head=4))
    else:
        model = ModernBertForMaskedLM(tiny_modernbert_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, 8192, (8, 128))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    for _ in range(5):  # allocator and optimizer state warm-up
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    names = list(VARIANTS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            results[name].append(one_variant(model, opt, batch, VARIANTS[name], args.before, args.active, args.after))

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in results[name])

    print(f"{'option':<16}{'inside':>8}{'after':>8}{'growth':>8}{'trace kB':>10}  (x untraced step; median of "
          f"{args.rounds} rounds, {args.active} traced steps, untraced step {med('none', 'median_untraced_s'):.3f} s)")
    table = {}
    for name in names:
        table[name] = {k: med(name, k) for k in ("inside", "after", "growth", "trace_kb")}
        row = table[name]
        print(f"{name:<16}{row['inside']:>7.2f}x{row['after']:>7.2f}x{row['growth']:>7.2f}x{row['trace_kb']:>10.0f}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
