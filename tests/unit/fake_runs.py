"""Synthetic run folders (what the step timer and the memory logger write), for compare and scaling tests.

Also a script: ``python fake_runs.py NPROC OUTPUT_DIR STEPS BATCH`` writes one run of NPROC ranks into
``OUTPUT_DIR/run`` whose step time grows with NPROC (:func:`scaled_step_s`): the stand-in training command of
the scaling CLI's tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def record(step: int, *, data: float = 0.01, load: float = 0.005, fwd: float = 0.2, bwd: float = 0.4,
           compute: float = 0.35, opt: float = 0.01, samples: int = 8, tokens: int = 1024,
           step_s: float | None = None) -> dict[str, Any]:
    """One ``timing_rank{R}.jsonl`` line; ``step_s`` defaults to data + forward + backward + optimizer."""
    step_s = data + fwd + bwd + opt if step_s is None else step_s
    pre = load + fwd + compute
    return {"step": step, "data_s": data, "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt, "step_s": step_s,
            "data_load_s": load, "backward_compute_s": compute, "micro_batches": 1, "samples": samples,
            "tokens": tokens, "pre_sync_s": pre, "wait_s": max(0.0, step_s - pre - opt)}


def jitter(step: int, phase: int = 0, scale: float = 0.001) -> float:
    """A deterministic, zero-median wiggle of +-5 ``scale`` per step: step-to-step noise without randomness."""
    return ((step * 37 + phase) % 11 - 5) * scale


def write_run(folder: Path, steps: dict[int, list[dict[str, Any]]], summary: dict[str, Any] | None = None,
              memory: dict[int, list[dict[str, Any]]] | None = None,
              memory_summary: dict[str, Any] | None = None) -> Path:
    """Write the files of one run folder; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, records in steps.items():
        (folder / f"timing_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for rank, records in (memory or {}).items():
        (folder / f"memory_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (folder / "timing_summary.json").write_text(json.dumps(summary))
    if memory_summary is not None:
        (folder / "memory_summary.json").write_text(json.dumps(memory_summary))
    return folder


def clean_run(folder: Path, ranks: int = 2, steps: int = 30, phase: int = 0, factor: float = 1.0,
              **changes: Any) -> Path:
    """A balanced run with step-to-step noise on forward, backward and loading.

    ``phase`` shifts the noise pattern (another run of the same distribution); ``factor`` multiplies every phase
    (a uniformly slower machine); ``changes`` maps ``"<field>_rank<R>"`` (or ``"<field>"`` for every rank) to
    seconds added to that :func:`record` field.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    for rank in range(ranks):
        rows = []
        for step in range(1, steps + 1):
            fields = {"fwd": 0.2 + jitter(step, phase + rank), "compute": 0.35 + jitter(step, phase + rank + 3),
                      "load": 0.005 + jitter(step, phase, 0.0002)}
            fields["bwd"] = fields["compute"] + 0.05
            for key, delta in changes.items():
                name, _, who = key.partition("_rank")
                if not who or int(who) == rank:
                    fields[name] = fields.get(name, {"data": 0.01, "opt": 0.01}.get(name, 0.0)) + delta
            fields = {"data": 0.01, "opt": 0.01, **fields}
            rows.append(record(step, **{k: v * factor for k, v in fields.items()}))
        out[rank] = rows
    return write_run(folder, out, summary={"warmup_steps_excluded": 1})


def scaled_step_s(nproc: int) -> float:
    """The fake training command's step time at ``nproc`` processes: 0.1 s, +25% per extra process."""
    return 0.1 * (1.0 + 0.25 * (nproc - 1))


def main(argv: list[str]) -> int:
    nproc, output_dir, steps, batch = int(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    out = {r: [record(s, samples=batch, tokens=batch * 128, step_s=scaled_step_s(nproc)) for s in range(1, steps + 1)]
           for r in range(nproc)}
    write_run(output_dir / "run", out, summary={"warmup_steps_excluded": 1})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
