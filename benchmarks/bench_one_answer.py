#!/usr/bin/env python
"""Do the live verdict and ``analyze`` tell one story? Many real 2-rank runs of a user's plain ``Trainer`` script.

    python benchmarks/bench_one_answer.py                          # 20 runs with rank 1 slowed, 10 clean
    python benchmarks/bench_one_answer.py --slow-runs 5 --clean-runs 5 --share 0.3
    python benchmarks/bench_one_answer.py --busy                   # beside a busy core (a spinning process)

Every run is ``torchrun --nproc_per_node 2`` of ``tests/integration/plain_trainer.py`` (a small GPT-2 built from its
config, random tokens, ``Trainer.train()``, the two-line route: hf_distprof's flags parsed beside the Trainer's) on
gloo, ``--max_steps`` steps at the profiler's default schedule (wait 5, warmup 2, active 3: steps 8-10 traced),
logging every 10 steps (the Trainer's default is 500; 10 is what a user watching a short run sets). The slowed runs
make rank 1's collator sleep ``--share`` of a clean step per batch (the clean step measured by the first clean run,
which runs first); the clean runs sleep nowhere. Every rank's main thread moves to the next core at every batch
(``HF_DISTPROF_ALTERNATE_CORES=1``, as the scenario suite does): each of this VM's two cores runs ~20% slower for
seconds at a time, so in a 4-second run a rank that stays on one core can be truly slower, by no doing of its own,
and the tool is right to name it (``--no-crossover`` shows that: a user's view on this machine).

Per run, one line: what the step timer said at train end (``timing_summary.json``'s ``imbalance_verdict``: status
and rank), what ``analyze`` says (its imbalance and straggler verdicts, the ranks its findings name, the what-if
savings it counts beyond the noise and over the 10% worth fixing, the box's verdict line) and the profiler's
slowdown of the traced steps. At the end, the counts the issue asks for: slowed runs where the live verdict and
``analyze`` both name rank 1; clean runs with no finding that names a rank and no saving counted; every run where the
two disagree on status or rank (which must be none). Exit status 1 when a run disagrees.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_callback_overhead import busy_core, free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PLAIN = REPO / "tests" / "integration" / "plain_trainer.py"
RANK_KINDS = {"slow_rank", "straggler", "imbalance", "waiting_for_peers"}


@dataclass
class Outcome:
    """What one run's live verdict and its analysis said."""

    name: str
    slowed: bool
    live: tuple[str, int | None]
    offline: tuple[str, int | None]
    straggler: tuple[str, int | None]
    named: set[int]
    counted: list[str]
    box: str
    slowdown: str
    step_ms: float
    effect: str = ""
    """The live verdict's effect and its noise: ``+12.3% (noise 5.1%)``."""
    others: list[str] = field(default_factory=list)
    """Findings that name no rank and count no saving (the profiler's slowdown, data loading on every rank...)."""

    @property
    def agree(self) -> bool:
        """Live and offline give the same status and candidate (the straggler verdict the same status, unless the
        live one is undecided), and the findings name the raised verdict's rank and no other (none when nothing was
        raised)."""
        straggler = self.live[0] == "undecided" or self.straggler[0] == self.live[0]
        return (self.live == self.offline and straggler
                and self.named == ({self.live[1]} if self.live[0] == "raised" else set()))


def run_order(slow_runs: int, clean_runs: int) -> list[str]:
    """The clean run that measures the step first, then the slowed runs and the other clean runs interleaved evenly,
    so that a drift of the machine falls on both alike."""
    later = [(f"slow{i}", (i + 0.5) / slow_runs) for i in range(slow_runs)]
    later += [(f"clean{i}", (i - 0.5) / (clean_runs - 1)) for i in range(1, clean_runs)]
    return ["clean0"] + [name for name, _ in sorted(later, key=lambda item: item[1])]


def run_once(tmp: Path, name: str, steps: int, batch: int, sleep_s: float, crossover: bool) -> Path:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(PLAIN), "--output_dir", str(tmp / "out"), "--use_cpu", "true", "--report_to", "none",
           "--disable_tqdm", "true", "--save_strategy", "no", "--max_steps", str(steps),
           "--per_device_train_batch_size", str(batch), "--logging_steps", "10", "--enable-profiling",
           "--profiler-output-dir", str(tmp / "prof"), "--profiler-run-name", name]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PLAIN_CALLBACKS": "1",
           "PLAIN_COLLATOR_SLEEP": f"1:{sleep_s:.4f}" if sleep_s else "-1:0",
           "HF_DISTPROF_ALTERNATE_CORES": "1" if crossover else "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"run {name} failed:\n{proc.stderr[-3000:]}")
    return tmp / "prof" / name


def judge(folder: Path, name: str, slowed: bool) -> Outcome:
    from hf_distprof.analysis import AnalysisOptions, analyze_paths, format_box

    summary = json.loads((folder / "timing_summary.json").read_text())
    live = summary["imbalance_verdict"]
    options = AnalysisOptions(workers=1)
    result = analyze_paths([folder], options)
    cross = result.cross_rank
    imb = cross.imbalance_verdict if cross is not None else None
    strag = cross.straggler_verdict if cross is not None else None
    named = {r for f in result.findings if f.kind in RANK_KINDS for r in f.ranks}
    others = [f.kind for f in result.findings if f.kind not in RANK_KINDS and f.kind != "what_to_fix_first"]
    counted = [f"{s.scenario} {s.counted_pct:.1f}%" for s in result.what_if
               if s.beyond_noise and s.counted_pct > options.what_if_pct]
    box = next((line.strip("| ").strip() for line in format_box(result).splitlines() if "Verdict" in line), "")
    slow = result.profiler_slowdown or {}
    ratio = slow.get("ratio")
    return Outcome(
        name=name, slowed=slowed,
        live=(live["status"], live.get("rank")),
        offline=(imb.status, imb.rank) if imb is not None else ("none", None),
        straggler=(strag.status, strag.rank) if strag is not None else ("none", None),
        named=named, counted=counted, box=box,
        slowdown=f"{ratio:.2f}x" if isinstance(ratio, (int, float)) else "-",
        step_ms=1e3 * float(summary["step_mean_s"]),
        effect=(f"{float(live['effect_pct']):+.1f}% (noise {float(live['noise_pct']):.1f}%)"
                if live.get("effect_pct") is not None and live.get("noise_pct") is not None else ""),
        others=others,
    )


def _said(verdict: tuple[str, int | None]) -> str:
    return f"{verdict[0]} r{verdict[1]}" if verdict[1] is not None else verdict[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow-runs", type=int, default=20, help="runs with rank 1's collator slowed (default 20)")
    parser.add_argument("--clean-runs", type=int, default=10, help="runs with no slowdown (default 10)")
    parser.add_argument("--share", type=float, default=0.3,
                        help="rank 1's collator sleep per batch, as a share of a clean step (default 0.3)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="sequences of 32 tokens per rank and step (default 256: steps of ~150 ms here)")
    parser.add_argument("--no-crossover", dest="crossover", action="store_false",
                        help="leave each rank's thread where the kernel puts it (the default moves it every batch)")
    parser.add_argument("--busy", action="store_true", help="a process spinning on one core beside the runs")
    parser.add_argument("--keep", type=Path, help="keep the run folders under this folder (prof/<run>)")
    args = parser.parse_args(argv)
    if min(args.clean_runs, args.batch_size) < 1 or args.slow_runs < 0 or not 0.0 < args.share < 5.0 or args.steps < 20:
        parser.error("--clean-runs must be >= 1 (the first measures the clean step), --slow-runs >= 0, "
                     "--share in (0, 5), --steps >= 20, --batch-size >= 1")
    outcomes: list[Outcome] = []
    print(f"{args.clean_runs} clean runs and {args.slow_runs} with rank 1's collator sleeping {args.share:.0%} of a "
          f"clean step, {args.steps} steps each, 2 CPU ranks (gloo), default schedule; load average "
          f"{os.getloadavg()[0]:.1f}{', beside a busy core' if args.busy else ''}"
          f"{'' if args.crossover else ', no crossover'}", flush=True)
    print(f"{'run':<10}{'step ms':>8}  {'live':<14}{'effect (noise)':<22}{'analyze':<14}{'straggler':<14}"
          f"{'named':<7}{'slowdown':<9}{'counted savings':<44}{'other findings':<20}box", flush=True)
    with busy_core(args.busy), tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir) if args.keep is None else args.keep
        tmp.mkdir(parents=True, exist_ok=True)
        mixed = run_order(args.slow_runs, args.clean_runs)
        sleep_s = 0.0
        for name in mixed:
            slowed = name.startswith("slow")
            folder = run_once(tmp, name, args.steps, args.batch_size, sleep_s if slowed else 0.0,
                              args.crossover)
            out = judge(folder, name, slowed)
            if name == "clean0":
                sleep_s = args.share * out.step_ms / 1e3
            outcomes.append(out)
            print(f"{name:<10}{out.step_ms:>8.0f}  {_said(out.live):<14}{out.effect or '-':<22}"
                  f"{_said(out.offline):<14}{_said(out.straggler):<14}"
                  f"{','.join(map(str, sorted(out.named))) or '-':<7}{out.slowdown:<9}"
                  f"{'; '.join(out.counted) or '-':<44}{', '.join(out.others) or '-':<20}{out.box}", flush=True)
    slowed = [o for o in outcomes if o.slowed]
    clean = [o for o in outcomes if not o.slowed]
    both = [o for o in slowed if o.live == ("raised", 1) and o.offline == ("raised", 1) and o.named == {1}]
    quiet = [o for o in clean if not o.named and not o.counted]
    disagree = [o for o in outcomes if not o.agree]
    print(f"slowed runs where the live verdict and analyze both name rank 1 (and no finding names rank 0): "
          f"{len(both)} of {len(slowed)}")
    print(f"clean runs with no finding that names a rank and no saving counted: {len(quiet)} of {len(clean)}; "
          f"with any finding: {sum(bool(o.named or o.counted or o.others) for o in clean)}"
          + "".join(f"; {o.name}: live {o.live}, named {sorted(o.named)}, counted {o.counted}"
                    for o in clean if o not in quiet))
    print(f"runs where the live verdict and analyze disagree: {len(disagree)}"
          + "".join(f"; {o.name}: live {o.live}, analyze {o.offline}, named {sorted(o.named)}" for o in disagree))
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
