"""Whose fault, over many runs: does the live step timer and ``analyze`` name rank 1 for the right cause?

Run from the repository root::

    python benchmarks/bench_whose_fault.py              # 5 runs of each case
    python benchmarks/bench_whose_fault.py --runs 10 --cases clean shared_core

Each run trains a user's plain GPT-2 Trainer script on 2 CPU ranks (gloo) at the default profiling schedule, 30 steps
(``tests/integration/whose_fault.py``): ``clean``; ``shared_core`` (each rank pinned to its own core, two busy
processes on rank 1's); ``more_work`` (rank 1's collator repeats its batch: twice the samples); ``slow_collator``
(rank 1's collator sleeps 50 ms per batch). Per run: the rank the live verdict names at train end and its cause, the
ranks ``analyze``'s findings name and the cause of its slow-rank finding. A case passes when every run names rank 1
live and offline for the expected cause; a clean run passes when it names no rank, or names one for a machine cause
(never advice about the code or the data). Exit status 1 when a run does not pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.launch import free_port  # noqa: E402
from tests.integration.whose_fault import CASES, outcome, right_cause, train  # noqa: E402

MACHINE = {"cpu_wait", "slower_machine"}


def passes(case: str, got: dict) -> bool:
    """Whether one run's answer is right for its case."""
    if case == "clean":
        return (not got["offline_ranks"] and got["live_rank"] is None) or (
            got["live_cause"] in MACHINE and got["offline_cause"] in MACHINE)
    return got["live_rank"] == 1 and got["offline_ranks"] == [1] and right_cause(case, got)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    failed = 0
    print(f"{'case':<14} {'run':>3} {'live rank':>9} {'live cause':<12} {'offline ranks':<13} {'offline cause':<14} "
          f"{'pass':<4} load")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            ok = 0
            for k in range(args.runs):
                folder = Path(tmp) / f"{case}{k}"
                folder.mkdir()
                t0 = time.perf_counter()
                proc = train(folder, case, free_port())
                if proc.returncode != 0:
                    print(f"{case:<14} {k:>3} training failed ({proc.returncode}): {proc.stderr[-500:]}")
                    failed += 1
                    continue
                got = outcome(folder)
                good = passes(case, got)
                ok += good
                failed += not good
                print(f"{case:<14} {k:>3} {str(got['live_rank']):>9} {str(got['live_cause']):<12} "
                      f"{str(got['offline_ranks']):<13} {str(got['offline_cause']):<14} {'yes' if good else 'NO':<4} "
                      f"{os.getloadavg()[0]:.1f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            print(f"{case}: {ok} of {args.runs} right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
