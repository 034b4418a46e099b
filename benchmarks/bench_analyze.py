"""Benchmark ``hf-distprof analyze`` against Holistic Trace Analysis 0.5.0 and a bare JSON parse.

Run from the repository root (HTA is in the ``bench`` extra: ``pip install holistictraceanalysis==0.5.0``)::

    python benchmarks/bench_analyze.py                      # tiles to >= 50 MB per rank
    python benchmarks/bench_analyze.py --mb-per-rank 10     # quicker
    python benchmarks/bench_analyze.py --mb-per-rank 200 --compact --skip-hta --skip-bare   # compact files

What it does, side by side in one run:

1. Tiles the shared 8-rank DLRM traces (``../shared/traces/dlrm_8gpu_v100``) in time into a temp folder:
   copy k of a rank's step is shifted by k step spans, renamed ``ProfilerStep#(10+k)``, and its
   correlation ids offset, until each rank's JSON is at least ``--mb-per-rank`` MB (written gzipped).
2. Runs four contenders in rounds, each in a fresh subprocess whose whole process tree's RSS is sampled
   every 20 ms: HTA (load + temporal breakdown + comm/comp overlap + kernel breakdown), ours
   (``analyze_paths`` with the same number of worker processes), and two bare parses of every file on
   the same number of processes, discarding the result: gunzip + ``orjson.loads`` (the fastest parser
   to Python objects) and gunzip + simdjson (``pysimdjson``, the fastest parser there is: it builds
   simdjson's own document, no Python object per value).
3. Checks that HTA's and our per-rank temporal breakdown and overlap agree within 0.5 pp, and prints
   wall time, peak RSS of the process tree, and the ratios. On a shared machine absolute times move
   with the load, so each ratio is taken within one round (the contenders run back to back) and the
   median over rounds is reported, next to the best time of each contender.
4. With ``--compact``: writes every trace's compact file (``hf-distprof analyze --write-compact``, timed), then
   adds a contender that re-analyses from them, checks that its whole result (``AnalysisResult.to_dict()``) is
   the one from the JSON, and prints the speed-up (target: >= 4x, issue 38) and the JSON analysis's peak RSS
   (target at 200 MB per rank: under 1.5 GB). "Ours" always reads the JSON (``read_compact=False``).
5. Times ``hf-distprof analyze`` of the shared traces as they are (1 MB), ``--small-runs`` times (target: 0.35 s).
6. With ``--what-if-cost``: adds the same analysis without the what-if model (no per-rank timeline in the workers,
   no replay, scenarios or critical path: ``hf_distprof.analysis.whatif.model``), from JSON and, with ``--compact``,
   from the compact files, and prints what the model adds to each, in wall time and in CPU time of the process
   tree (target: at most 10%).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
DLRM = REPO / ".." / "shared" / "traces" / "dlrm_8gpu_v100"


def tile(src: Path, dst: Path, min_bytes: int) -> int:
    """Write ``src`` tiled in time into ``dst`` until its JSON is >= ``min_bytes``; return the JSON size."""
    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000
    max_corr = (
        max(
            (e.get("args", {}).get("correlation", 0) for e in timed if isinstance(e.get("args"), dict)),
            default=0,
        )
        + 1
    )
    meta = [e for e in events if e.get("ph") == "M"]
    # Indented like Kineto's own output; HTA also needs it, since it finds the rank with the regex
    # '"rank":\s+(\d+)', which a compact dump does not match.
    one = len(orjson.dumps(events, option=orjson.OPT_INDENT_2))
    copies = max(1, -(-min_bytes // one))
    out: list[dict] = list(meta)
    for k in range(copies):
        for e in timed:
            e2 = dict(e)
            e2["ts"] = e["ts"] + k * span
            args = e.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += k * max_corr
                e2["args"] = args
            if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                e2["id"] += k * max_corr
            if str(e2.get("name", "")).startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{10 + k}"
            out.append(e2)
    doc["traceEvents"] = out
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    dst.write_bytes(gzip.compress(raw, compresslevel=1))
    return len(raw)


HTA_CODE = """
import sys, json
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
kt, kb = ta.get_gpu_kernel_breakdown(visualize=False)
out = {int(r): {"idle_pct": float(i), "compute_pct": float(c), "non_compute_pct": float(n)}
       for r, i, c, n in zip(tb["rank"], tb["idle_time_pctg"], tb["compute_time_pctg"], tb["non_compute_time_pctg"])}
for r, o in zip(ov["rank"], ov["comp_comm_overlap_pctg"]):
    out[int(r)]["overlap_pct"] = float(o)
json.dump(out, open(sys.argv[2], "w"))
"""

OURS_CODE = """
import sys, json
from hf_distprof.analysis import AnalysisOptions, analyze_paths
if not WHAT_IF:  # the what-if model off: no timeline in the (forked) workers, no replay in this process
    import hf_distprof.analysis.whatif.model, hf_distprof.analysis.rank.analyze
    hf_distprof.analysis.rank.analyze.rank_timeline = lambda *args, **kwargs: None
    hf_distprof.analysis.whatif.model.what_if = lambda *args, **kwargs: None
if __name__ == "__main__":  # the worker processes are spawned and re-import this script
    res = analyze_paths([sys.argv[1]], AnalysisOptions(workers=int(sys.argv[3]), progress=False),
                        read_compact=READ_COMPACT)
    assert not res.errors, res.errors
    open(sys.argv[2] + ".full.json", "wb").write(res.to_json())
    out = {r.rank: {"idle_pct": r.gpu_total.idle_pct, "compute_pct": r.gpu_total.compute_pct,
                    "non_compute_pct": r.gpu_total.non_compute_pct,
                    "overlap_pct": r.gpu_total.comm_comp_overlap_pct}
           for r in res.ranks}
    json.dump(out, open(sys.argv[2], "w"))
"""

BARE_CODE = """
import sys, gzip, glob, orjson
from concurrent.futures import ProcessPoolExecutor
def parse(p):
    return len(orjson.loads(gzip.decompress(open(p, "rb").read()))["traceEvents"])
if __name__ == "__main__":
    files = sorted(glob.glob(sys.argv[1] + "/*.json.gz"))
    with ProcessPoolExecutor(int(sys.argv[3])) as pool:
        n = sum(pool.map(parse, files))
    open(sys.argv[2], "w").write(str(n))
"""

# simdjson validates the whole document and builds its tape; len() reads the array's size from the tape.
SIMDJSON_CODE = """
import sys, gzip, glob, simdjson
from concurrent.futures import ProcessPoolExecutor
def parse(p):
    doc = simdjson.Parser().parse(gzip.decompress(open(p, "rb").read()))
    return len(doc["traceEvents"])
if __name__ == "__main__":
    files = sorted(glob.glob(sys.argv[1] + "/*.json.gz"))
    with ProcessPoolExecutor(int(sys.argv[3])) as pool:
        n = sum(pool.map(parse, files))
    open(sys.argv[2], "w").write(str(n))
"""


def measure(code: str, trace_dir: Path, out: Path, workers: int) -> tuple[float, float, float]:
    """Run ``code`` in a subprocess; return (wall seconds, peak RSS of its process tree in MB, CPU seconds of its
    process tree: user + system of it and of the workers it waited for).

    CPU time moves far less with the machine's load than wall time does (another process taking a core stretches
    the wall clock, not the work), so it is what resolves a cost of a few % on a shared machine."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    script = out.with_name(f"run_{out.stem}.py")  # not "hta.py": that would shadow the hta package
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's install has its bytecode: see _compile_package
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(trace_dir), str(out), str(workers)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    root = psutil.Process(proc.pid)
    peak = 0
    # stderr goes to a pipe read only at the end; HTA logs a lot, so drain it in a thread to never block.
    import threading

    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    # The wall time is taken when the process exits (a thread waits on it), not when the sampling loop next wakes:
    # that rounded every run up by 0-20 ms, a few % of a compact re-analysis.
    ended: list[float] = []
    waiter = threading.Thread(target=lambda: (proc.wait(), ended.append(time.perf_counter())), daemon=True)
    waiter.start()
    while not ended:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        waiter.join(0.02)
    wall = ended[0] - t0
    reader.join()
    if proc.returncode != 0:
        tail = b"".join(err_chunks).decode(errors="replace")[-2000:]
        raise RuntimeError(f"{script.name} failed with exit status {proc.returncode}:\n{tail}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, peak / 2**20, cpu


def _small_set(runs: int) -> list[float]:
    """Wall seconds of ``hf-distprof analyze`` (the command a user types, text out) of the shared traces as they are,
    ``runs`` times after one untimed run."""
    cmd = [sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(DLRM)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    walls = []
    for k in range(runs + 1):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        if k:
            walls.append(time.perf_counter() - t0)
    return walls


def _compile_package() -> None:
    """Write the package's bytecode, as ``pip install`` does, before anything is timed.

    A development shell often sets ``PYTHONDONTWRITEBYTECODE`` (this machine's does): every contender's process would
    then compile the package's source again, ~0.08 s of the compact path's ~0.6 s, which no user pays."""
    import compileall

    compileall.compile_dir(str(REPO / "hf_distprof"), quiet=1)


def _tiled_set(folder: Path, mb_per_rank: float) -> None:
    """Tile every DLRM rank into ``folder`` (skipped when it already holds all ranks)."""
    sources = sorted(DLRM.glob("*.json.gz"))
    if all((folder / src.name).is_file() for src in sources):
        print(f"reusing the tiled set in {folder}")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for src in sources:
        tile(src, folder / src.name, int(mb_per_rank * 1e6))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb-per-rank", type=float, default=50.0)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--skip-bare", action="store_true", help="leave out the bare orjson and simdjson parses")
    parser.add_argument(
        "--compact", action="store_true", help="also re-analyse from compact files (written first) and compare"
    )
    parser.add_argument(
        "--what-if-cost", action="store_true",
        help="also analyse without the what-if model (from JSON and, with --compact, from compact files): its cost",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each runs every contender once")
    parser.add_argument("--small-runs", type=int, default=9,
                        help="times `hf-distprof analyze` of the shared 8-GPU set as it is is timed (0: not at all)")
    parser.add_argument(
        "--traces", type=Path, help="keep the tiled set in this folder and reuse it (default: a temp folder)"
    )
    args = parser.parse_args()
    if not DLRM.is_dir():
        raise SystemExit(f"reference traces not found at {DLRM.resolve()}")
    _compile_package()
    with tempfile.TemporaryDirectory(prefix="bench_analyze_") as tmp_name:
        tmp = Path(tmp_name)
        traces = args.traces or tmp / "traces"
        _tiled_set(traces, args.mb_per_rank)
        files = sorted(traces.glob("*.json.gz"))
        raw = sum(len(gzip.decompress(p.read_bytes())) for p in files)
        gz = sum(p.stat().st_size for p in files)
        print(f"tiled set: {len(files)} ranks, {raw / 1e6:.0f} MB JSON ({gz / 1e6:.0f} MB gzipped)")
        contenders = {} if args.skip_bare else {
            "bare orjson parse": (BARE_CODE, "bare.txt"),
            "bare simdjson parse": (SIMDJSON_CODE, "simdjson.txt"),
        }
        ours_code = OURS_CODE.replace("WHAT_IF", "True")
        contenders["hf-distprof analyze"] = (ours_code.replace("READ_COMPACT", "False"), "ours.json")
        if args.what_if_cost:
            bare = OURS_CODE.replace("WHAT_IF", "False")
            contenders["analyze, no what-if"] = (bare.replace("READ_COMPACT", "False"), "ours_no_whatif.json")
        if args.compact:
            t0 = time.perf_counter()
            cli = [sys.executable, "-m", "hf_distprof.cli.main", "analyze", str(traces), "--findings"]
            write = subprocess.run([*cli, "--no-compact", "--write-compact", "--workers", str(args.workers)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if write.returncode != 0:
                raise SystemExit(f"analyze --write-compact failed:\n{write.stderr[-2000:]}")
            compact_mb = sum(p.stat().st_size for p in traces.glob("*.compact.msgpack")) / 1e6
            print(f"compact files: {compact_mb:.1f} MB, written by analyze --write-compact in "
                  f"{time.perf_counter() - t0:.2f} s")
            contenders["analyze from compact"] = (ours_code.replace("READ_COMPACT", "True"), "compact.json")
            if args.what_if_cost:
                contenders["compact, no what-if"] = (bare.replace("READ_COMPACT", "True"), "compact_no_whatif.json")
        if not args.skip_hta:
            contenders["HTA 0.5.0"] = (HTA_CODE, "hta.json")
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
        loads = []
        for k in range(args.repeat):
            for name, (code, out_name) in contenders.items():
                runs[name].append(measure(code, traces, tmp / out_name, args.workers))
            loads.append(os.getloadavg()[0])
            print(
                f"round {k + 1}: "
                + ", ".join(f"{n} {w:.2f} s / {m:.0f} MB / {c:.2f} CPU s"
                            for n, r in runs.items() for w, m, c in r[-1:])
                + f" (load average {loads[-1]:.1f})",
                flush=True,
            )
        print(
            f"{args.repeat} round(s), {args.workers} worker process(es), load average "
            f"{min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores"
        )
        for name, r in runs.items():
            print(
                f"{name:<22} best {min(x[0] for x in r):7.2f} s  {min(x[1] for x in r):8.0f} MB peak RSS "
                "(process tree)"
            )
        ours = runs["hf-distprof analyze"]

        Runs = list[tuple[float, float, float]]

        def ratio(top: Runs, bottom: Runs, memory: bool = False, cpu: bool = False) -> str:
            which = 2 if cpu else int(memory)
            per_round = [a[which] / b[which] for a, b in zip(top, bottom, strict=True)]
            return f"{_median(per_round):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in per_round)})"

        # Targets: HTA / ours >= 5 (time) and > 1 (peak RSS); ours / fastest bare parse <= 1.5.
        if args.compact:
            same = (tmp / "ours.json.full.json").read_bytes() == (tmp / "compact.json.full.json").read_bytes()
            print(f"JSON / compact files: time {ratio(ours, runs['analyze from compact'])} (target >= 4x); "
                  f"whole results equal: {same}")
            print(f"peak RSS of analyze from JSON at {raw / len(files) / 1e6:.0f} MB JSON per rank x {len(files)} "
                  f"ranks: {max(x[1] for x in ours):.0f} MB (target at 200 MB per rank: < 1536 MB)")
            if not same:
                raise SystemExit("MISMATCH: the analysis from the compact files differs from the one from JSON")
        if args.what_if_cost:
            pairs = [("from JSON", ours, runs["analyze, no what-if"])]
            if args.compact:
                pairs.append(("from compact files", runs["analyze from compact"], runs["compact, no what-if"]))
            for label, with_model, without in pairs:
                print(f"what-if model, {label}: with / without, wall time {ratio(with_model, without)}, CPU time "
                      f"{ratio(with_model, without, cpu=True)} (target <= 1.10x)")
        if not args.skip_bare:
            print(f"ours / bare simdjson parse: time {ratio(ours, runs['bare simdjson parse'])} (target <= 1.4x)")
            print(f"ours / bare orjson parse:   time {ratio(ours, runs['bare orjson parse'])}")
        if not args.skip_hta:
            hta_runs = runs["HTA 0.5.0"]
            print(f"HTA / ours: time {ratio(hta_runs, ours)}, peak RSS {ratio(hta_runs, ours, memory=True)}")
            ours_out = json.loads((tmp / "ours.json").read_text())
            hta = json.loads((tmp / "hta.json").read_text())
            worst = max(abs(ours_out[r][k] - hta[r][k]) for r in hta for k in hta[r])
            print(f"largest per-rank difference to HTA (idle/compute/non-compute/overlap %): {worst:.3f} pp")
            if worst > 0.5:
                raise SystemExit("MISMATCH: numbers differ from HTA by more than 0.5 pp")
    if args.small_runs:
        walls = _small_set(args.small_runs)
        print(f"hf-distprof analyze of the shared 8-GPU set as it is ({DLRM.name}): median {_median(walls):.3f} s "
              f"wall over {len(walls)} runs ({min(walls):.3f}-{max(walls):.3f} s) (target <= 0.35 s)")


if __name__ == "__main__":
    main()
