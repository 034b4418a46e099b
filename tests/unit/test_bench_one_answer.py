"""benchmarks/bench_one_answer.py: what counts as one story, and the order of its runs. (The benchmark's runs are
never made here.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_one_answer.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_one_answer", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_one_answer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def outcome(bench, live, offline, named, straggler=None):
    return bench.Outcome(name="r", slowed=True, live=live, offline=offline, straggler=straggler or offline,
                         named=set(named), counted=[], box="", slowdown="-", step_ms=100.0)


def test_one_story_is_the_same_verdict_live_and_offline_and_findings_naming_only_its_rank(bench):
    assert outcome(bench, ("raised", 1), ("raised", 1), {1}).agree
    assert outcome(bench, ("quiet", 1), ("quiet", 1), set()).agree
    assert not outcome(bench, ("raised", 1), ("quiet", 1), set()).agree  # the box silent where the live one warned
    assert not outcome(bench, ("raised", 1), ("raised", 0), {0}).agree  # two different ranks
    assert not outcome(bench, ("raised", 1), ("raised", 1), {0, 1}).agree  # a finding blames the other rank too
    assert not outcome(bench, ("quiet", 1), ("quiet", 1), {1}).agree  # a finding names a rank no verdict raised
    assert not outcome(bench, ("raised", 1), ("raised", 1), {1}, straggler=("quiet", 1)).agree  # two verdicts differ
    assert outcome(bench, ("undecided", 1), ("undecided", 1), set(), straggler=("quiet", 1)).agree


def test_the_clean_run_that_measures_the_step_comes_first_and_the_rest_interleave(bench):
    order = bench.run_order(4, 3)
    assert order == ["clean0", "slow0", "clean1", "slow1", "slow2", "clean2", "slow3"]
    assert sorted(bench.run_order(20, 10)) == sorted([f"slow{i}" for i in range(20)] + [f"clean{i}" for i in range(10)])
