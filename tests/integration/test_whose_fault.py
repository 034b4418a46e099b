"""Whose fault, on a user's plain Trainer script (2 CPU ranks, gloo, the default profiling schedule): rank 1 whose core
a busy process shares is named as its machine (waiting for a CPU), never its code; rank 1 given twice the samples
per step as more work, 2.0x; rank 1 whose collator sleeps 50 ms as its input pipeline. The live step timer and
``analyze`` name the same rank for the same cause. (``benchmarks/bench_whose_fault.py`` runs each case many times.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from .launch import free_port
from .whose_fault import EXPECTED, outcome, right_cause, train

pytestmark = pytest.mark.integration


@pytest.mark.flaky(reruns=1, reason=(
    "a statistical scenario: 2 ranks on 2 shared cores, judged over 24 untraced steps of ~15-60 ms; the causes are "
    "3-30x their noise here, but a CI host busy in bursts can hold either rank back for seconds. The rerun trains "
    "anew"))
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_rank_1_is_named_live_and_offline_for_its_cause(case: str, tmp_path: Path) -> None:
    proc = train(tmp_path, case, free_port())
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = outcome(tmp_path)
    # On failure, what the step timer said (its last lines) tells a burst of load from a wrong judgement.
    said_live = [line for line in proc.stderr.splitlines() if "hf_distprof" in line][-3:]
    assert got["live_rank"] == 1 and got["offline_ranks"] == [1], (got, said_live)
    assert right_cause(case, got), got
    both = got["live_cause"] != EXPECTED[case]
    if both:
        # A busy host (CI's) whose other process sat on rank 1's core: rank 1 waited for a CPU beyond what its work
        # explains; both causes were measured, both are said, neither advice says "not your code".
        assert got["title"] == ("Rank 1 holds the others back: its machine (it waits for a CPU) and more work (2.0x "
                                "the tokens of its peers)")
    if case == "more_work":
        assert got["work_ratio"] == 2.0 and "token-balanced batches" in got["action"]
        assert both or got["title"] == "Rank 1 holds the others back: more work (2.0x the tokens of its peers)"
    if case == "shared_core":
        # Outside the user's code: said so, and the advice is about the machine, never the code or the data.
        assert got["title"].endswith("its machine, not your code (it waits for a CPU)")
        assert got["action"].startswith("Rank 1: move or stop the other process on its cores")
        assert "dataloader" not in got["action"] and "batches" not in got["action"]
    if case == "slow_collator":
        assert got["title"] == "Rank 1 holds the others back: its data loading"
    # The live warning says the same cause (the log ends with its last form).
    warnings = [line for line in proc.stderr.splitlines() if "Imbalance before the gradient sync" in line]
    assert warnings, proc.stderr[-2000:]
    said = {"cpu_wait": "not your code: it waited", "more_work": "it processes 2.00x the tokens",
            "input": "its data loading takes"}[EXPECTED[case]]
    if both:
        said = "for a CPU"
        assert "it also does 2.00x the tokens of its peers" in warnings[-1], warnings[-1]
    assert said in warnings[-1], warnings[-1]
