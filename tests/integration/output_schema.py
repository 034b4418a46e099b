"""The shape of what a run tells its user, for comparing two versions of the callbacks on the same run.

Every field of ``timing_rank{R}.jsonl`` and ``memory_rank{R}.jsonl`` (and their lines' steps), every key path of
``timing_summary.json`` and ``memory_summary.json``, every TensorBoard tag of ours with the steps it was written at,
and the end-of-run tables' header lines. Values that vary from run to run (seconds, bytes) are left out; what is
there, and where, is not. ``tests/data/demo_outputs_schema.json`` holds the shape the demo's short run had before
the always-on path was brought to the floor (issue 41), with what was added since on purpose: the tag
``timing/step_s`` (issue 42: the name the console and the other trackers give the mean step) and
``timing_summary.json``'s ``dataloader`` (the run's DataLoader settings, which the data advice reads);
``test_train_lambda.py`` compares today's against it.

To write the reference from a run (``--write``), from the repository root::

    python -m tests.integration.output_schema RUN_DIR TB_DIR STDOUT_FILE --write tests/data/demo_outputs_schema.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The always-on callbacks' tags; the end-of-run answer's (hf_distprof/...) name the run's own findings and what-if
# scenarios, which differ from run to run.
OUR_TAGS = ("timing/", "throughput/", "memory/", "analysis/", "mfu")


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (``a.b``, list items as ``a[]``)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            out |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            out |= key_paths(item, f"{prefix}[]")
    return out


# Per-line values that the same run gives again whatever the machine's speed: the batch's sizes, the model state's.
EXACT = ("step", "rank", "samples", "tokens", "micro_batches", "warmup", "traced", "params_mb", "grads_mb",
         "optimizer_state_mb", "model_state_mb")


def jsonl_shape(path: Path) -> dict[str, Any]:
    """A jsonl file's keys, the keys that are ever null, and its exact values line by line."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = sorted({k for line in lines for k in line})
    return {"keys": keys, "null": sorted({k for line in lines for k in keys if line.get(k) is None}),
            "exact": [{k: line[k] for k in EXACT if k in line} for line in lines]}


def tensorboard_shape(tb_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[int]] = {}
    for folder in sorted({p.parent for p in tb_dir.rglob("events.out.tfevents*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if tag.startswith(OUR_TAGS):
                out[tag] = sorted(set(out.get(tag, [])) | {e.step for e in acc.Scalars(tag)})
    # Text tags (the live warnings) are left out: whether one is said depends on the run's noise.
    return dict(sorted(out.items()))


def table_headers(stdout: str) -> list[str]:
    """The end-of-run tables' title-free header lines (the lines that name the columns)."""
    return [line.strip() for line in stdout.splitlines() if line.strip().startswith(("rank ", "rank  ", "| rank"))
            and ("host" in line or "step" in line)]


def shape(run_dir: Path, tb_dir: Path, stdout: str) -> dict[str, Any]:
    """The shape of one run (its folder, its TensorBoard folder, what it printed)."""
    out: dict[str, Any] = {}
    for name in sorted(p.name for p in run_dir.glob("*.jsonl")):
        out[name] = jsonl_shape(run_dir / name)
    for name in ("timing_summary.json", "memory_summary.json"):
        if (run_dir / name).exists():
            # Top-level keys and each rank's: what is inside a verdict depends on whether the run's noise raised one.
            paths = key_paths(json.loads((run_dir / name).read_text()))
            out[name] = sorted(p for p in paths if "." not in p or p.startswith("per_rank[]."))
    out["tensorboard"] = tensorboard_shape(tb_dir)
    out["tables"] = table_headers(stdout)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("tb_dir", type=Path)
    parser.add_argument("stdout", type=Path)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    found = shape(args.run_dir, args.tb_dir, args.stdout.read_text())
    text = json.dumps(found, indent=1) + "\n"
    if args.write:
        args.write.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
