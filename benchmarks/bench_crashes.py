"""Does a profiled run end the way it would have ended without hf_distprof? Many short runs, every rank's end counted.

Run from the repository root (it takes a while: about 15-40 s a run on 2 CPU cores)::

    python benchmarks/bench_crashes.py                      # 20 rounds of the grid below
    python benchmarks/bench_crashes.py --rounds 2 --cases p2_default base_p2 --keep /tmp/crashes

Each run trains on CPU ranks (gloo, ``torchrun``) for 30 optimizer steps, either a user's plain GPT-2 ``Trainer``
script that ends as most do, by returning (``tests/integration/plain_trainer.py`` with ``PLAIN_EXIT=natural``: no
``destroy_process_group``, the interpreter's own teardown), or the demo's ``python_scripts/train_modernBERT.py``.
The grid (``CASES``): 2 and 4 ranks; one rank slower than the others (a collator that sleeps, as in the runs that
first lost a rank); the default window, ``--profile-ranks auto``, on demand, on anomaly; memory logging alone and
with profiling; compact files on and off (off: their writer is replaced by a no-op in the rank, as if the profiler
never wrote them); and the same scripts without any hf_distprof flag, the base rate.

Every rank runs under a small parent (this file, ``--rank``) that records how the training process ended: its exit
status, or the signal that killed it; a rank the launcher stopped after another died shows SIGTERM. A run that has
not ended after ``--timeout`` seconds is killed and counted as hung. For each run that lost a rank the harness keeps
its ``rank{R}_crash.txt`` files (the stacks of every thread, hf_distprof's crash evidence) and each rank's stderr
under ``--keep``. One line per run, a table per case, and ``results.jsonl`` under ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLAIN = REPO / "tests" / "integration" / "plain_trainer.py"
DEMO = REPO / "python_scripts" / "train_modernBERT.py"
STEPS = 30

PLAIN_ARGS = ["--use_cpu", "true", "--report_to", "none", "--disable_tqdm", "true", "--save_strategy", "no",
              "--max_steps", str(STEPS), "--per_device_train_batch_size", "32", "--logging_steps", "5"]
PROFILE = ["--enable-profiling"]
CASES: dict[str, dict[str, Any]] = {
    # name: script, ranks, hf_distprof flags (none: the base rate), environment. The slow rank's collator sleeps.
    "p2_default": {"script": "plain", "ranks": 2, "flags": PROFILE, "env": {"PLAIN_COLLATOR_SLEEP": "0:0.05"}},
    "p2_default_nocompact": {"script": "plain", "ranks": 2, "flags": PROFILE, "compact": False,
                             "env": {"PLAIN_COLLATOR_SLEEP": "0:0.05"}},
    "p4_auto": {"script": "plain", "ranks": 4, "flags": [*PROFILE, "--profile-ranks", "auto"],
                "env": {"PLAIN_COLLATOR_SLEEP": "2:0.15"}},
    "p4_auto_nocompact": {"script": "plain", "ranks": 4, "flags": [*PROFILE, "--profile-ranks", "auto"],
                          "compact": False, "env": {"PLAIN_COLLATOR_SLEEP": "2:0.15"}},
    "p2_on_demand": {"script": "plain", "ranks": 2, "flags": [*PROFILE, "--profile-on-demand"],
                     "env": {"PLAIN_COLLATOR_SLEEP": "1:0.05", "PLAIN_PROFILE_NOW": "14:{run}/PROFILE_NOW"}},
    "p4_on_anomaly": {"script": "plain", "ranks": 4, "flags": [*PROFILE, "--profile-on-anomaly"],
                      "env": {"PLAIN_COLLATOR_SLEEP": "1:0.4:100:14"}},
    "p2_memory": {"script": "plain", "ranks": 2, "flags": ["--enable-memory-logging", "--memory-log-steps", "5"],
                  "env": {"PLAIN_COLLATOR_SLEEP": "0:0.05"}},
    "p2_profile_memory": {"script": "plain", "ranks": 2,
                          "flags": [*PROFILE, "--enable-memory-logging", "--memory-log-steps", "5"], "env": {}},
    "demo2": {"script": "demo", "ranks": 2,
              "flags": [*PROFILE, "--enable-memory-logging", "--memory-log-steps", "5"], "env": {}},
    "demo2_auto_anomaly": {"script": "demo", "ranks": 2,
                           "flags": [*PROFILE, "--profile-ranks", "auto", "--profile-on-anomaly"], "env": {}},
    "base_p2": {"script": "plain", "ranks": 2, "flags": [], "env": {"PLAIN_COLLATOR_SLEEP": "0:0.05"}},
    "base_p4": {"script": "plain", "ranks": 4, "flags": [], "env": {"PLAIN_COLLATOR_SLEEP": "2:0.15"}},
    "base_demo2": {"script": "demo", "ranks": 2, "flags": [], "env": {}},
}
SIGNALS = {int(s): s.name for s in signal.Signals}

# The training process each rank's parent starts: the script under runpy (so that compact files can be switched off
# the same way in both scripts), with its own argv.
BOOT = """import runpy, sys
if sys.argv[1] == "nocompact":
    from hf_distprof.callbacks.profiler import compact_export
    compact_export.CompactExports.submit = lambda self, trace: None
sys.argv = sys.argv[2:]
sys.path[0] = __import__("os").path.dirname(sys.argv[0])
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def rank_parent(status_dir: Path, compact: str, command: list[str]) -> int:
    """``--rank``: run one rank's training process, forward SIGTERM/SIGINT to it, record how it ended."""
    rank = os.environ.get("RANK", "?")
    with open(status_dir / f"rank{rank}.stderr", "w") as err:
        child = subprocess.Popen([sys.executable, "-c", BOOT, compact, *command], stderr=err)
        stopped: list[int] = []

        def forward(signum: int, frame: Any) -> None:
            stopped.append(signum)
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = child.wait()
    (status_dir / f"rank{rank}.json").write_text(json.dumps({"rank": int(rank), "code": code,
                                                             "stopped_by_launcher": bool(stopped)}))
    return code if code >= 0 else 128 - code


def run_once(case: str, folder: Path, port: int, timeout: float) -> dict[str, Any]:
    """One run of ``case`` in ``folder``: how each rank ended."""
    spec = CASES[case]
    status = folder / "status"
    status.mkdir(parents=True)
    prof = folder / "prof"
    if spec["script"] == "plain":
        script = [str(PLAIN), *PLAIN_ARGS, "--output_dir", str(folder / "out")]
        env = {"PLAIN_EXIT": "natural", **({"PLAIN_CALLBACKS": "1"} if spec["flags"] else {})}
    else:
        script = [str(DEMO), "--max-steps", str(STEPS), "--output-dir", str(folder / "out"), "--logging-steps", "5"]
        env = {}
    if spec["flags"]:
        script += [*spec["flags"], "--profiler-output-dir", str(prof), "--profiler-run-name", "r"]
    env.update({k: v.format(run=prof / "r") for k, v in spec["env"].items()})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(spec["ranks"]), "--master_port",
           str(port), str(Path(__file__).resolve()), "--rank", str(status),
           "compact" if spec.get("compact", True) else "nocompact", *script]
    t0 = time.perf_counter()
    with open(folder / "launcher.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env})
        try:
            job = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            job = None
    ranks = {}
    for r in range(spec["ranks"]):
        f = status / f"rank{r}.json"
        ranks[r] = json.loads(f.read_text()) if f.exists() else {"rank": r, "code": None, "stopped_by_launcher": False}
    crash_files = sorted(p.name for p in (prof / "r").glob("rank*_crash.txt")) if (prof / "r").is_dir() else []
    return {"case": case, "job": job, "seconds": round(time.perf_counter() - t0, 1), "ranks": ranks,
            "crash_files": crash_files, "load": round(os.getloadavg()[0], 1)}


def lost(result: dict[str, Any]) -> list[str]:
    """How the run's ranks that did not end well ended: ``rank 2: SIGSEGV`` (a launcher's SIGTERM after another rank
    died is said as such); empty for a run that ended well everywhere."""
    if result["job"] is None:
        return ["hung (killed after the timeout)"]
    out = []
    for r, end in result["ranks"].items():
        code = end["code"]
        if code == 0:
            continue
        what = "no status" if code is None else SIGNALS.get(-code, f"signal {-code}") if code < 0 else f"exit {code}"
        out.append(f"rank {r}: {what}{' (stopped by the launcher)' if end['stopped_by_launcher'] else ''}")
    return out


def keep(result: dict[str, Any], folder: Path, keep_dir: Path, k: int) -> None:
    """Copy a lost run's crash files, stderrs and launcher log under ``keep_dir``."""
    dest = keep_dir / f"{result['case']}-{k}"
    dest.mkdir(parents=True, exist_ok=True)
    for f in [*(folder / "prof" / "r").glob("rank*_crash.txt"), *(folder / "status").glob("*.stderr"),
              folder / "launcher.log"]:
        if f.exists():
            shutil.copy(f, dest / f.name)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_parent(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    sys.path.insert(0, str(REPO))
    from tests.integration.launch import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="runs of each case (default 20)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as hung")
    parser.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "hf_distprof_crashes",
                        help="folder for lost runs' evidence and results.jsonl")
    args = parser.parse_args()
    args.keep.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, open(args.keep / "results.jsonl", "a") as out:
        for k in range(args.rounds):
            for case in args.cases:  # round-robin: a slow patch of the host spreads over every case
                folder = Path(tmp) / f"{case}-{k}"
                result = run_once(case, folder, free_port(), args.timeout)
                bad = lost(result)
                if bad:
                    keep(result, folder, args.keep, k)
                results.append(result)
                out.write(json.dumps(result) + "\n")
                out.flush()
                print(f"{case:<22} {k:>3} {'; '.join(bad) or 'ok':<40} crash files {len(result['crash_files'])} "
                      f"{result['seconds']:.0f} s load {result['load']}", flush=True)
                shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{'case':<22} {'runs':>4} {'ok':>4}  lost")
    for case in args.cases:
        mine = [r for r in results if r["case"] == case]
        ends = Counter(x for r in mine for x in lost(r))
        print(f"{case:<22} {len(mine):>4} {sum(not lost(r) for r in mine):>4}  "
              f"{', '.join(f'{n}x {w}' for w, n in ends.items()) or '-'}")
    profiled = [r for r in results if CASES[r["case"]]["flags"]]
    base = [r for r in results if not CASES[r["case"]]["flags"]]
    print(f"\nwith hf_distprof: {sum(bool(lost(r)) for r in profiled)} of {len(profiled)} runs lost a rank; "
          f"without: {sum(bool(lost(r)) for r in base)} of {len(base)}. Evidence: {args.keep}")
    return 1 if any(lost(r) for r in profiled) else 0


if __name__ == "__main__":
    sys.exit(main())
