"""The "whose fault" cases on a user's plain GPT-2 Trainer script (``plain_trainer.py``), 2 CPU ranks (gloo), the
default profiling schedule: rank 1's core shared with a busy process, rank 1 given twice the samples per step, rank
1's collator asleep 50 ms per batch, and the clean run. Shared by ``tests/integration/test_whose_fault.py`` (one run
of each) and ``benchmarks/bench_whose_fault.py`` (many).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLAIN = Path(__file__).with_name("plain_trainer.py")

CASES: dict[str, dict[str, str]] = {
    "clean": {},
    "shared_core": {"PLAIN_PIN": "1"},
    "more_work": {"PLAIN_MORE_WORK": "1:2"},
    "slow_collator": {"PLAIN_COLLATOR_SLEEP": "1:0.05"},
}
"""case -> the plain script's environment (test hooks: ``plain_trainer.py``)."""
EXPECTED = {"shared_core": "cpu_wait", "more_work": "more_work", "slow_collator": "input"}
"""case -> the cause rank 1 must be named for."""


def right_cause(case: str, got: dict[str, Any]) -> bool:
    """Whether live and ``analyze`` give rank 1 the case's cause, alike. With twice the samples, a busy host whose other
    process sat on rank 1's cores may make it wait for a CPU beyond what its work explains: then both are said
    (``cpu_wait`` with ``more_work_too``), which is right too."""
    if got["live_cause"] != got["offline_cause"]:
        return False
    both = case == "more_work" and got["live_cause"] == "cpu_wait" and got["more_work_too"] is True \
        and got["offline_more_work_too"] is True
    return both or got["live_cause"] == EXPECTED[case]
SPINNERS = 3
"""Busy processes pinned to rank 1's core in the ``shared_core`` case: rank 1 gets about a third of it."""


@contextmanager
def busy_core(case: str) -> Iterator[None]:
    """For ``shared_core``: processes spinning on the core rank 1 is pinned to (the second it may use)."""
    if case != "shared_core":
        yield
        return
    cpu = sorted(os.sched_getaffinity(0))[1 % len(os.sched_getaffinity(0))]
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(SPINNERS)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def train(folder: Path, case: str, port: int, steps: int = 30) -> subprocess.CompletedProcess[str]:
    """Train ``case`` into ``folder`` (its run folder: ``folder / "prof" / "r"``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(PLAIN), "--output_dir", str(folder / "out"), "--use_cpu", "true", "--report_to", "none",
           "--disable_tqdm", "true", "--save_strategy", "no", "--max_steps", str(steps),
           "--per_device_train_batch_size", "32", "--logging_steps", "5", "--enable-profiling",
           "--profiler-output-dir", str(folder / "prof"), "--profiler-run-name", "r"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PLAIN_CALLBACKS": "1", **CASES[case]}
    with busy_core(case):
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=folder)


def outcome(folder: Path) -> dict[str, Any]:
    """What the run said live (``timing_summary.json``) and what ``analyze`` says of it: the rank each names, the
    cause each gives, the box's advice."""
    from hf_distprof.analysis import AnalysisOptions, analyze_paths

    run = folder / "prof" / "r"
    summary = json.loads((run / "timing_summary.json").read_text())
    live = summary["imbalance_verdict"]
    cause = summary.get("slow_rank_cause") or {}
    result = analyze_paths([run], AnalysisOptions(workers=1))
    slow = next((f for f in result.findings if f.kind == "slow_rank"), None)
    named = sorted({r for f in result.findings if f.kind in ("slow_rank", "straggler", "imbalance") for r in f.ranks})
    return {
        "live_rank": live["rank"] if live["status"] == "raised" else None,
        "live_cause": cause.get("cause"),
        "more_work_too": cause.get("more_work_too"),
        "work_ratio": cause.get("work_ratio"),
        "offline_ranks": named,
        "offline_cause": slow.cause if slow is not None else None,
        "offline_more_work_too": slow.more_work_too if slow is not None else None,
        "action": slow.action if slow is not None else "",
        "title": slow.title if slow is not None else "",
    }
