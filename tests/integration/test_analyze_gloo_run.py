"""A real 2-rank gloo DDP run with one slow rank, analysed end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "make_gloo_traces.py"


@pytest.mark.integration
def test_fresh_slow_rank_run_names_rank_1(tmp_path: Path) -> None:
    # 10 traced steps: last in 9 of 10 is still a straggler (p = 0.011); with 6, one step lost loses it (CI once).
    # This is the suite's first test. In CI (twice) and once here, the machine delayed rank 0 by about as much as
    # rank 1's 30 ms sleep for most of the 10 traced steps (rank 1 the slowest in 6 of 10, median lateness 22.9%;
    # here 5.1%), after a package install or a dropped page cache: then rank 1 is not measurably late and the
    # verdict is right to say so. So rank 1 sleeps 100 ms (about 1.7 steps of rank 0's own work), and the window
    # starts after 5 untraced steps, as the step timer's profiler does.
    env = {**os.environ, "GLOO_TRACES_OUT": str(tmp_path), "GLOO_TRACES_ACTIVE": "10", "GLOO_TRACES_WAIT": "5",
           "GLOO_TRACES_SLOW_MS": "100"}
    subprocess.run(
        [sys.executable, str(SCRIPT), "slow_rank1"], check=True, env=env, timeout=300, capture_output=True
    )
    files = sorted(p.name for p in (tmp_path / "slow_rank1").iterdir())
    assert files == ["rank-0.json.gz", "rank-1.json.gz"]
    result = analyze_paths([tmp_path / "slow_rank1"], AnalysisOptions(workers=2))
    assert not result.errors
    assert result.cross_rank is not None
    straggler = result.cross_rank.straggler_verdict
    assert [s.rank for s in result.cross_rank.stragglers] == [1], straggler.reason
    assert straggler.raised and straggler.rank == 1, straggler.reason
    # A slow forward on rank 1 is both a straggler (late at the collectives) and an imbalance (more busy time), and
    # rank 0 waits for it: one finding, the chain, first among the diagnosis's (the what-if replay's "what to fix
    # first" may open the list); no communication-bound finding blames rank 0's wait.
    diagnosed = [f for f in result.findings if f.kind != "what_to_fix_first"]
    assert (diagnosed[0].kind, diagnosed[0].ranks) == ("slow_rank", [1]), [(f.kind, f.ranks) for f in result.findings]
    assert "rank 0 waits" in diagnosed[0].evidence and "straggler verdict: " in diagnosed[0].evidence
    assert {"straggler", "imbalance"}.isdisjoint(f.kind for f in result.findings)
    # The imbalance verdict weighs busy time, which on a shared VM varies more from step to step than arrival
    # order does (CI once: straggler raised, imbalance not): it names rank 1 or, when the run's own noise drowns
    # the sleep, stays quiet at the noise gate. It never names rank 0. (Its detection on recorded traces of this
    # scenario is checked exactly in tests/unit/test_analysis_diagnosis.py.)
    imbalance = result.cross_rank.imbalance_verdict
    assert imbalance.rank == 1 and (imbalance.raised or imbalance.gate == "noise"), imbalance.reason
    assert imbalance.raised == ("imbalance verdict raised too" in diagnosed[0].evidence)
