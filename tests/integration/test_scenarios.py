"""The diagnosis against real 2-rank CPU runs of the demo script, profiling and thresholds at their defaults.

Five clean runs must raise no straggler or imbalance, neither live (the step timer's warnings) nor offline
(the trace analysis at train end). A rank slowed by 50% of its own work must be named by both; one slowed by
15%, run twice, in at least one of the two (and no other rank in either; see RUNS). A data-loading stall on every
rank is data-bound, not a straggler; a comm-heavy configuration is communication-bound, not a straggler (its
slow-rank thresholds at 50%, see there). ``hf-distprof compare`` on the same folders names the slowed rank's data
loading, and no rank between two clean runs.

Every run crosses its ranks over the machine's cores (``HF_DISTPROF_ALTERNATE_CORES``, see ALTERNATE): each of
this VM's two cores switches between two speeds ~20% apart for seconds at a time, independently of the other,
and a rank that stayed on the slow one made one clean run in 40 truly slower on one rank. The table this prints
(``pytest -s``) is the one in docs/measurements.md.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from hf_distprof.analysis import AnalysisOptions, analyze_paths
from hf_distprof.runs.compare import compare_runs
from hf_distprof.runs.load import load_run

from .launch import train_lambda

pytestmark = pytest.mark.integration

# Default schedule: wait 5, warmup 2, active 3 -> steps 6-10 traced (8-10 recorded); 2-5 and 11-22 not: 16 judged
# live, an even count, so that each rank spends as many judged steps on each core (ALTERNATE). Three traced steps
# cannot name a rank alone (2 ranks need 6): the analysis weighs them with the step timer's records of the run.
STEPS = 22
TRACED = 3
LEAK_STEPS = 20
BATCH = 8
CLEAN_RUNS = 5
# compare's effect floor for the same reason: between two clean runs of the suite one rank's backward compute
# drifted by 23% (a CI run under load), above compare's default 10%; the slowed rank's data loading grows by
# thousands of %.
COMPARE_MIN_EFFECT_PCT = 30.0
# Each core of this shared 2-core VM switches between two speeds ~20% apart for 1-20 s at a time, each on its own
# (pinned matmul loops: 7.5 ms or 9.2 ms, nothing else running). A rank whose thread stays on the slow core for a
# 20-step run (~11 s) does ~20% more own work than its peer: a clean run with a truly slower rank, the machine's
# doing (1 live warning in 40 clean runs at the default 10%, in a CI run). Every run here moves rank r's main
# thread to core (r + batch) mod 2 at every batch, so each rank gets each core alike (a crossover): the slowed
# rank's sleep follows it, a core's speed does not.
ALTERNATE = {"HF_DISTPROF_ALTERNATE_CORES": "1"}
THRESHOLD: tuple[str, ...] = ()  # the defaults: --imbalance-threshold-pct 10 --straggler-threshold-pct 10
SLOWDOWNS = (0.15, 0.5)  # share of a clean rank's pre-sync work added as a sleep on rank 1
# Runs of each slowdown. The step timer measured a rank slowed by 15% at a median 10.7-25.3% over its peer (the
# spread is from run to run: 28 judged steps did not narrow it), so at the 10% threshold the lowest runs are ~1%
# above it (named in 31 of 31 runs, the measured table). The suite runs it twice: rank 1 is the candidate in both, never
# another rank, and named by both the timer and the analysis in at least one.
RUNS = {0.15: 2, 0.5: 1}
COMM_HEAVY_SLOW_RANK_PCT = "50"
STALL_S = 0.3  # per batch on every rank: far more than a step's compute
# Findings that name a rank as holding the others back (the chain stands for the straggler and imbalance ones).
RANK_FINDINGS = ("imbalance", "slow_rank", "straggler", "waiting_for_peers", "burst")
SLOW_ENV = "HF_DISTPROF_SIMULATE_SLOW_RANK"
LEAK_ENV = "HF_DISTPROF_SIMULATE_LEAK"
LEAK_MIB = 30  # kept alive per step by rank 1 in the leak scenario; a clean rank's RSS is ~600 MiB


@dataclass
class Outcome:
    name: str
    proc: subprocess.CompletedProcess[str]
    summary: dict
    analysis: dict
    run_dir: Path

    @property
    def live_imbalance(self) -> list[str]:
        """Step-time imbalance warnings in the logs (live and at train end)."""
        return [line for line in (self.proc.stdout + self.proc.stderr).splitlines()
                if "Imbalance before the gradient sync" in line]

    @property
    def timer_named(self) -> list[int]:
        verdict = self.summary["imbalance_verdict"]
        return [verdict["rank"]] if verdict["status"] == "raised" else []

    @property
    def analysis_named(self) -> list[int]:
        ranks = {s["rank"] for s in self.analysis["cross_rank"]["stragglers"]}
        ranks |= {r for f in self.analysis["findings"] if f["kind"] in RANK_FINDINGS for r in f["ranks"]}
        return sorted(ranks)

    @property
    def kinds(self) -> list[str]:
        return [f["kind"] for f in self.analysis["findings"]]


def run(tmp: Path, name: str, *extra: str, batch: int = BATCH, slow: str | None = None,
        threshold: tuple[str, ...] = THRESHOLD) -> Outcome:
    env = {"SKIP_PREFLIGHT": "1", **ALTERNATE, **({SLOW_ENV: slow} if slow else {})}
    proc = train_lambda(
        tmp, "--enable-profiling", "--profiler-analyze", "--max-steps", str(STEPS), "--logging-steps", "4",
        "--per-device-train-batch-size", str(batch), "--output-dir", str(tmp / name),
        "--profiler-output-dir", str(tmp / "prof"), "--profiler-run-name", name, *threshold, *extra, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    run_dir = tmp / "prof" / name
    return Outcome(
        name,
        proc,
        json.loads((run_dir / "timing_summary.json").read_text()),
        json.loads((run_dir / "analysis.json").read_text()),
        run_dir,
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    tmp = tmp_path_factory.mktemp("scenarios")
    out = {f"clean{i}": run(tmp, f"clean{i}") for i in range(CLEAN_RUNS)}
    # Slow rank 1 by a share of what a clean rank's own work takes here, on this machine, now: its pre-sync
    # work less the time its thread waited for a CPU (the other rank, the harness).
    own = statistics.median(r["pre_sync_s"] - r["cpu_wait_s"] for o in out.values() for r in o.summary["per_rank"])
    for share in SLOWDOWNS:
        for i in range(RUNS[share]):
            name = f"slow{share:.0%}" + (f"-{i + 1}" if i else "")
            out[name] = run(tmp, name, slow=f"1:{share * own:.4f}")
    out["data_stall"] = run(tmp, "data_stall", slow=f"all:{STALL_S}")
    # One sequence of 16 tokens per step, a 32k vocabulary (4.7 M parameters) and one DDP bucket, so the whole
    # gradient all-reduce waits for the end of backward: as comm-heavy as 2 shared CPU cores get. Steps this
    # small make rank 0's own per-step work (its progress bar) a few % of the step, enough for a true but
    # unrelated "rank 0 is late" finding in 1 CI run of 2 (see docs/measurements.md); the bar is off here.
    # Its steps are ~60 ms with ~30 ms of own work per rank, and in some runs one rank's own work is 15-21% above
    # the other's in most steps (on equal token counts; seen live and in the trace, 3 development runs of 5):
    # a few ms, but persistent and above 5% of the step, so at the default 10% a true imbalance finding. Rank 0
    # also reaches the collectives of such steps late by up to ~15% of the step (its work between steps:
    # logging; a CI run, at 10%). What this scenario asks is whether communication is named: its slow-rank
    # thresholds are 35% (at 25%, beside a busy core and other sessions' work, the timer and the analysis named rank
    # 0 in 1 run of 5, once its materiality was judged against the step less the run-queue wait). At 35% a CI run
    # beside other work named rank 0: its backward compute 11.3 ms against rank 1's 7.8 ms in 16 of 16 steps (36.5%,
    # on equal token counts and forward times), against 0.4-18.6% in 12 development launches; so 50%.
    out["comm_heavy"] = run(
        tmp, "comm_heavy", "--max-seq-length", "16", "--tiny-vocab-size", "32768", "--ddp-bucket-cap-mb", "1000",
        "--disable-tqdm", "true", batch=1,
        threshold=("--imbalance-threshold-pct", COMM_HEAVY_SLOW_RANK_PCT, "--straggler-threshold-pct",
                   COMM_HEAVY_SLOW_RANK_PCT),
    )
    rows = ["| scenario | timer names | analysis names | findings | profiler slowdown (noise) |",
            "|---|---|---|---|---|"]
    for o in out.values():
        slowdown = o.summary.get("profiler_slowdown") or {}
        ratio, noise = slowdown.get("ratio"), slowdown.get("noise_pct")
        rows.append(
            f"| {o.name} | {o.timer_named or '-'} | {o.analysis_named or '-'} | {', '.join(o.kinds) or '-'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x (±{noise:.1f}%)'} |"
        )
    print("\n" + "\n".join(rows))
    return out


def test_clean_runs_raise_no_straggler_or_imbalance(outcomes):
    clean = [o for name, o in outcomes.items() if name.startswith("clean")]
    assert len(clean) == CLEAN_RUNS
    for o in clean:
        assert o.live_imbalance == [], o.name
        assert o.timer_named == [] and not any("Imbalance before the gradient sync" in w for w in o.summary["warnings"])
        assert o.summary["burst"] is None, o.summary["burst"]  # no burst, no stalls: hiccups are neither
        assert o.analysis_named == [], (o.name, o.analysis["cross_rank"]["straggler_verdict"])
        assert set(RANK_FINDINGS).isdisjoint(o.kinds), o.name
        # Memory: a clean run's RSS does not keep growing.
        assert o.summary["memory_growth"] == [] and "grows" not in o.proc.stdout + o.proc.stderr, o.name
        # The questions were asked and answered over the run: both verdicts are the step timer's over its untraced
        # steps, as live (quiet, never "not enough evidence"); the 3 traced steps' own verdicts are kept beside them.
        cross = o.analysis["cross_rank"]
        live = o.summary["imbalance_verdict"]
        for verdict in (cross["straggler_verdict"], cross["imbalance_verdict"]):
            assert verdict["steps"] == live["steps"] and verdict["status"] == live["status"] == "quiet", \
                verdict["reason"]
        for window in (cross["straggler_window"], cross["imbalance_window"]):
            assert window["steps"] == TRACED, window["reason"]
        assert o.analysis["undecided"] == [], o.name


@pytest.mark.parametrize("share", SLOWDOWNS)
def test_the_slowed_rank_is_named_live_and_offline(outcomes, share):
    runs = [o for name, o in outcomes.items() if name.split("-")[0] == f"slow{share:.0%}"]
    assert len(runs) == RUNS[share]
    named = []
    for o in runs:
        # Never another rank: rank 1 is the candidate, the slowest, and the only rank any warning names.
        verdict = o.summary["imbalance_verdict"]
        assert verdict["rank"] == 1 and verdict["effect_pct"] > 5.0, (o.name, verdict)
        assert o.timer_named in ([], [1]) and o.analysis_named in ([], [1]), (o.name, verdict["reason"])
        assert all("rank 1 is the slowest" in line for line in o.live_imbalance), o.name
        assert o.summary["slowest_rank"] == 1 and o.summary["slowest_phase"] == "data", o.name
        if o.timer_named == [1] and o.live_imbalance and o.analysis_named == [1]:
            named.append(o.name)
    reasons = [(o.name, o.summary["imbalance_verdict"]["reason"],
                o.analysis["cross_rank"]["imbalance_verdict"]["reason"]) for o in runs]
    # Named by both in every run of the 50% slowdown, in at least one of the two of 15%.
    assert len(named) >= (1 if share < 0.5 else len(runs)), reasons


def test_a_data_stall_on_every_rank_is_data_bound_not_a_straggler(outcomes):
    o = outcomes["data_stall"]
    assert "data_loading_bound" in o.kinds and o.analysis_named == [] and o.timer_named == []
    assert set(RANK_FINDINGS).isdisjoint(o.kinds), o.kinds
    bound = next(f for f in o.analysis["findings"] if f["kind"] == "data_loading_bound")
    assert bound["ranks"] == [0, 1] and bound["numbers"]["data_loading_pct"] > 20  # threshold 10


def test_a_comm_heavy_run_is_communication_bound_not_a_straggler(outcomes, tmp_path):
    o = outcomes["comm_heavy"]
    assert o.analysis_named == [] and o.timer_named == [] and set(RANK_FINDINGS).isdisjoint(o.kinds)
    clean = max(x.analysis["exposed_comm_pct"] for name, x in outcomes.items() if name.startswith("clean"))
    assert o.analysis["exposed_comm_pct"] > clean + 5
    # On 2 shared cores gloo's reduction competes with compute, so the share stays at 20-30% (clean runs: ~5%)
    # and under the default 30%; the finding is there at a threshold between the two, and the same analysis of
    # the same folder, at the run's own slow-rank thresholds, still names no straggler. (At the default 10% it may:
    # in a CI run rank 1's steps were slowest in 15 of 16, a true imbalance that this scenario does not ask about.)
    pct = float(COMM_HEAVY_SLOW_RANK_PCT)
    strict = analyze_paths([o.run_dir], AnalysisOptions(workers=1, comm_bound_pct=12.0, straggler_pct=pct,
                                                        imbalance_pct=pct))
    assert "communication_bound" in [f.kind for f in strict.findings]
    assert strict.cross_rank is not None and strict.cross_rank.stragglers == []


def test_timing_summary_and_analysis_carry_the_profiler_slowdown(outcomes):
    for o in outcomes.values():
        slowdown = o.summary["profiler_slowdown"]
        # Steps 6-10 against 11-22 (less those the trace's compact summary overlapped, and step 11, which waited
        # for the slowest rank's trace export); 2-5 are the warm-up.
        rows = [json.loads(line) for line in (o.run_dir / "timing_rank0.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r["after_pause"]] == [11]
        after = sum(1 for r in rows if 11 <= r["step"] <= 22 and not r["profiler_busy"] and not r["after_pause"])
        assert (slowdown["steps_inside"], slowdown["steps_before"], slowdown["steps_after"]) == (5, 4, after)
        assert slowdown["ratio"] is not None and slowdown["noise_pct"] is not None
        assert slowdown["options"] == {"record_shapes": False, "profile_memory": False, "with_stack": False,
                                       "with_flops": False}
        assert o.analysis["profiler_slowdown"] == slowdown


@pytest.mark.flaky(reruns=1, reason=(
    "a statistical scenario: two clean runs a minute apart on 2 shared cores, where one rank's share of the cores "
    "can drift between runs (docs/measurements.md: a pair of clean runs once named rank 0's backward compute +23%); "
    "the rerun trains its two clean runs anew"))
def test_compare_names_the_slowed_rank_and_data_loading_and_nothing_between_clean_runs(outcomes, request, tmp_path):
    # hf-distprof compare on the same folders: rank 1 slowed by 50% against a clean run, and two clean runs.
    if getattr(request.node, "execution_count", 1) > 1:  # a rerun is a new experiment, not the same runs again
        outcomes = {**outcomes, **{name: run(tmp_path, name) for name in ("clean0", "clean1")}}
    clean, other = (load_run(outcomes[name].run_dir) for name in ("clean0", "clean1"))
    slowed = compare_runs(clean, load_run(outcomes["slow50%"].run_dir), COMPARE_MIN_EFFECT_PCT)
    h = slowed.headline
    assert (h.kind, h.rank, h.phase, h.metric) == ("localized", 1, "data", "data_load_s"), h.text
    rows = {(r.metric, r.rank): r.diff for r in slowed.rows}
    assert rows[("data_load_s", 1)].significant and not rows[("data_load_s", 0)].significant
    # Warm-up step 1 and the profiler's steps 6-10 are left out: 2-5 and 11-22 are compared, less the steps the
    # step timer marked as overlapped by the trace's compact summary being written (profiler_busy) and step 11, which
    # waited for the slowest rank's trace export (after_pause).
    runs = (clean, load_run(outcomes["slow50%"].run_dir))
    kept = [len(set.intersection(*({r["step"] for r in run.steps[k] if (2 <= r["step"] <= 5 or 11 <= r["step"] <= 22)
                                    and not r.get("profiler_busy") and not r.get("after_pause")} for k in run.ranks)))
            for run in runs]
    assert all(11 not in {r["step"] for r in run.steps[k] if not r.get("after_pause")} for run in runs
               for k in run.ranks)
    assert (slowed.steps_a, slowed.steps_b) == (kept[0], kept[1])
    same = compare_runs(clean, other, COMPARE_MIN_EFFECT_PCT)
    # Between two clean runs no rank and no phase is named. A machine whose load changed between the two runs
    # (other work on the shared cores) slows every rank alike: that is reported as such, never as one rank.
    # "uniform": every rank's own work moved alike (CI once: +16% on both); "other" without a rank: only figures
    # outside the ranks' own work moved, alike on every rank (throughput +33% on both once, when other work on
    # the machine stopped between the two runs: less waiting for a CPU, the same own work).
    assert same.headline.rank is None and same.headline.kind in ("none", "uniform", "other"), same.headline.text
    if same.headline.kind == "none":  # the machine was as busy for both runs: then nothing at all is significant
        assert [(r.metric, r.rank) for r in same.significant] == [], same.headline.text
    else:
        delta = {(r.metric, r.rank): r.diff.delta for r in same.rows if r.diff.delta is not None}
        moved = [r for r in same.significant if r.rank is not None]
        assert moved, same.headline.text
        if same.headline.kind == "uniform":
            own = [r for r in moved if r.unit == "s"]
            assert own and len({r.diff.delta > 0 for r in own}) == 1, same.headline.text
        for r in moved:  # the other rank's same figure moved the same way
            assert (delta[(r.metric, 1 - r.rank)] > 0) == (r.diff.delta > 0), (r.metric, r.rank, same.headline.text)


def test_a_rank_that_keeps_memory_alive_is_named_with_its_rate(tmp_path):
    # Rank 1 keeps LEAK_MIB more alive at every step; the memory logger samples every 2 steps. No profiler:
    # while it traces, its own buffers grow the RSS of every rank, and those intervals are left out.
    proc = train_lambda(
        tmp_path, "--enable-memory-logging", "--memory-log-steps", "2", "--enable-step-timing", "--max-steps",
        str(LEAK_STEPS), "--logging-steps", "4", "--output-dir", str(tmp_path / "leak"), "--profiler-output-dir",
        str(tmp_path / "prof"), "--profiler-run-name", "leak",
        env={"SKIP_PREFLIGHT": "1", LEAK_ENV: f"1:{LEAK_MIB}"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    run_dir = tmp_path / "prof" / "leak"
    # One live warning (rank 0 speaks for every rank), naming rank 1 only.
    warned = re.findall(r"\] step \d+: rank (\d+): process RSS grows", proc.stdout + proc.stderr)
    assert warned == ["1"], proc.stderr[-3000:]
    summary = json.loads((run_dir / "memory_summary.json").read_text())
    (growth,) = summary["memory_growth"]
    assert growth["rank"] == 1 and growth["what"] == "process RSS"
    assert 0.8 * LEAK_MIB <= growth["rate_mb_per_step"] <= 1.3 * LEAK_MIB
    assert (growth["first_step"], growth["last_step"]) == (4, LEAK_STEPS)  # samples at 2..20, 2 -> 4 is warm-up
    # The memory logger owns the verdict when it runs; the step timer leaves it to it.
    assert json.loads((run_dir / "timing_summary.json").read_text())["memory_growth"] == []
    assert summary["highest_peak_rank"] == 1
    # Two samples per gather (every 2 steps, gathered on logging steps every 4): each lands in TensorBoard at
    # its own step with its own rank's value, as that rank wrote it to its JSON lines.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = re.search(r"TensorBoard events: (\S+)", proc.stdout)  # the end-of-run block (RunSummaryCallback)
    assert tb_dir, proc.stdout[-2000:]
    acc = EventAccumulator(str(tmp_path / tb_dir.group(1)))
    acc.Reload()
    jsonl = {
        rank: [json.loads(line) for line in (run_dir / f"memory_rank{rank}.jsonl").read_text().splitlines()]
        for rank in (0, 1)
    }
    for rank, rows in jsonl.items():
        assert [r["step"] for r in rows] == list(range(2, LEAK_STEPS + 1, 2))
        logged = [(e.step, e.value) for e in acc.Scalars(f"memory/rss_mb/rank{rank}")]
        assert logged == [(r["step"], pytest.approx(r["rss_mb"], rel=1e-6)) for r in rows]
    highest = [max(a["rss_mb"], b["rss_mb"]) for a, b in zip(jsonl[0], jsonl[1], strict=True)]
    assert [e.value for e in acc.Scalars("memory/rss_mb/max")] == pytest.approx(highest, rel=1e-6)
