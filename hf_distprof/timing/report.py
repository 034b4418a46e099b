"""Pure maths over per-rank step timings: means, cross-rank imbalance, the slowest rank, warnings, the table.

No I/O and no distributed calls: the callback gathers ``RankSummary`` dicts from every rank and hands
them to ``cross_rank_report``; the results are plain dataclasses that serialise to JSON.

Why the slow rank is found from ``pre_sync_s`` and not ``step_s``: under DDP the gradient all-reduce
ends at the same moment on every rank, so every rank's step lasts as long as the slowest one's; the
fast ranks spend the difference waiting inside the collective. What differs between ranks is the time
each spends on its own work before that sync (data loading + forward + the compute part of backward).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from hf_distprof.core.advice import LoaderSettings, phase_advice
from hf_distprof.core.burst import Burst
from hf_distprof.core.cause import Attribution, cause_action, cause_why
from hf_distprof.core.verdicts import QUIET_WHY, SlowRankVerdict, imbalance_pct
from hf_distprof.timing.recorder import StepTiming

# Mean phases carried per rank; the optional ones are None when not measured on some step.
PHASES: tuple[str, ...] = ("data_s", "forward_s", "backward_s", "optimizer_s", "step_s")
OPTIONAL_PHASES: tuple[str, ...] = ("data_load_s", "backward_compute_s", "cpu_wait_s")
DERIVED: tuple[str, ...] = ("pre_sync_s", "wait_s")
_SUMMED = (*PHASES, *OPTIONAL_PHASES, *DERIVED)  # what PhaseTotals sums, in this order

# Dense BF16/FP16 tensor-core peak TFLOPs per device, from the vendors' datasheets (no sparsity).
# Matched in order against torch.cuda.get_device_name(): more specific names first.
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0),
    ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10", 125.0), ("V100", 125.0), ("T4", 65.0),
)


def peak_tflops_for_device(device_name: str) -> float | None:
    """Built-in peak dense BF16/FP16 TFLOPs for a GPU name, or None when it is not in the table."""
    for key, tflops in GPU_PEAK_TFLOPS:
        if key == "A10" and ("A100" in device_name or "A10G" in device_name):
            continue  # "A10" is a prefix of other parts with other peaks
        if key in device_name:
            return tflops
    return None


# The per-rank phase means, in table and TensorBoard order.
PHASE_KEYS: tuple[str, ...] = ("data_s", "data_load_s", "forward_s", "backward_s", "backward_compute_s", "optimizer_s",
                               "step_s", "pre_sync_s", "wait_s")

@dataclass
class PhaseTotals:
    """Running sums of ``StepTiming`` fields, so that long runs keep no per-step history in memory."""

    steps: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    tokens: int = 0

    def add(self, timing: StepTiming) -> None:  # one step
        self.add_row(timing.to_json())

    def add_row(self, row: Mapping[str, Any], also: PhaseTotals | None = None) -> None:
        """Add one step given as its ``StepTiming.to_json()`` (made once per step by a caller that also writes it), to
        ``also`` as well when given (a window's totals and the run's: one pass over the row)."""
        samples, tokens = row["samples"], row["tokens"]
        self.steps += 1
        self.samples += samples
        self.tokens += tokens
        sums, counts = self.sums, self.counts
        if also is None:
            for key in _SUMMED:
                value = row[key]
                if value is not None:
                    sums[key] = sums.get(key, 0.0) + float(value)
                    counts[key] = counts.get(key, 0) + 1
            return
        also.steps += 1
        also.samples += samples
        also.tokens += tokens
        sums2, counts2 = also.sums, also.counts
        for key in _SUMMED:
            value = row[key]
            if value is not None:
                value = float(value)
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
                sums2[key] = sums2.get(key, 0.0) + value
                counts2[key] = counts2.get(key, 0) + 1

    def mean(self, key: str) -> float | None:
        """Mean over the steps where ``key`` was measured; None if it never was on every step."""
        count = self.counts.get(key, 0)
        if count == 0 or count < self.steps:
            return None
        return self.sums[key] / count

    def to_rank_summary(self, rank: int, host: str = "", peak_memory_bytes: int | None = None) -> RankSummary:
        """Per-step means of this rank, ready to be gathered."""
        total = self.sums.get("step_s", 0.0)
        means = {key: self.mean(key) for key in (*PHASES, *OPTIONAL_PHASES, *DERIVED)}
        return RankSummary(
            rank=rank,
            host=host,
            steps=self.steps,
            total_s=total,
            samples=self.samples,
            tokens=self.tokens,
            samples_per_s=self.samples / total if total > 0 else 0.0,
            tokens_per_s=self.tokens / total if total > 0 else 0.0,
            peak_memory_bytes=peak_memory_bytes,
            **means,
        )


@dataclass
class RankSummary:
    """One rank's per-step means (seconds) and throughput over a window of steps."""

    rank: int
    host: str
    steps: int
    total_s: float
    samples: int
    tokens: int
    samples_per_s: float
    tokens_per_s: float
    peak_memory_bytes: int | None
    data_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    step_s: float | None = None
    data_load_s: float | None = None
    backward_compute_s: float | None = None
    pre_sync_s: float | None = None
    wait_s: float | None = None
    cpu_wait_s: float | None = None
    """Seconds per step the training thread waited for a CPU (run queue) before the optimizer; None: unknown."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankSummary:
        """Inverse of ``dataclasses.asdict``; unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class CrossRankReport:
    """The cross-rank view of one window of steps."""

    ranks: list[RankSummary]
    step_mean_s: float
    step_min_s: float
    step_max_s: float
    step_imbalance_pct: float
    imbalance_pct: float
    slowest_rank: int
    fastest_rank: int
    slowest_phase: str
    memory_imbalance_pct: float | None
    max_memory_rank: int | None
    samples_per_s: float
    tokens_per_s: float
    mfu_pct: float | None
    time_threshold_pct: float
    memory_threshold_pct: float
    warnings: list[str] = field(default_factory=list)
    imbalance_verdict: dict[str, Any] | None = None
    """The noise-aware decision on pre-sync time per step (``hf_distprof.core.verdicts.judge_slow_rank``)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _phase_components(rank: RankSummary) -> dict[str, float]:
    forward, backward = rank.forward_s or 0.0, rank.backward_compute_s or 0.0
    data = rank.data_load_s if rank.data_load_s is not None else rank.data_s
    if None not in (rank.pre_sync_s, rank.forward_s, rank.backward_compute_s):
        # The loading the pre-sync time counted (on a GPU, what the device waited for). (A mean is None unless its
        # phase was measured in every step: then the difference would take that phase's other steps for loading.)
        data = max(0.0, (rank.pre_sync_s or 0.0) - forward - backward)
    elif data is not None and rank.data_s is not None:
        data = min(data, rank.data_s)
    return {"data": data or 0.0, "forward": forward, "backward": backward}


def _slowest_phase(ranks: Sequence[RankSummary], slow: RankSummary, among: Sequence[str] = ()) -> tuple[str, float]:
    """The pre-sync part (of ``among``, if given) where ``slow`` exceeds the others' mean the most, and by how much."""
    others = [r for r in ranks if r.rank != slow.rank] or [slow]
    mine = _phase_components(slow)
    excess = {
        name: mine[name] - sum(_phase_components(o)[name] for o in others) / len(others)
        for name in mine if not among or name in among
    }
    name = max(excess, key=lambda k: excess[k])
    return name, excess[name]


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def cross_rank_report(
    ranks: Sequence[RankSummary],
    time_threshold_pct: float = 10.0,
    memory_threshold_pct: float = 20.0,
    flops: float | None = None,
    peak_tflops: float | None = None,
    verdict: SlowRankVerdict | None = None,
    on_gpu: bool = True,
    cause: Attribution | None = None, burst: Burst | None = None, loader: LoaderSettings | None = None,
) -> CrossRankReport:
    """Compare the ranks of one window of steps.

    The figures come from the window's means; the time warning comes only from ``verdict``, the
    noise-aware decision over the window's individual steps (:meth:`StepSeries.verdict`): means alone
    cannot tell a slow rank from a noisy step.

    Args:
        ranks: One summary per rank with at least one step each.
        time_threshold_pct: The imbalance threshold (shown in the table; the verdict applies it).
        memory_threshold_pct: Warn when the peak memory imbalance exceeds this.
        flops: FLOPs of all ranks together over the window (the Trainer's count), for MFU.
        peak_tflops: Peak TFLOPs of one device; MFU is None without it.
        verdict: The slow-rank verdict over the window's steps; None: no time warning. Its candidate is the slowest
            rank, raised or not, so that the table, the warning and ``hf-distprof analyze`` name the same rank.
        on_gpu: Whether the ranks train on a GPU (advice that only a GPU run can use is left out otherwise); ``loader``:
            the run's DataLoader settings, which the data advice does not ask for again.
        cause: Why the verdict's rank makes its peers wait (:meth:`StepSeries.cause`): the warning says it, with what
            to try for that cause; None: the slowest phase's advice.

    Returns:
        The report, with warnings (and recommendations) for the verdicts raised.

    Raises:
        ValueError: When ``ranks`` is empty or a rank has no steps.
    """
    if not ranks or any(r.steps == 0 or r.step_s is None or r.pre_sync_s is None for r in ranks):
        raise ValueError(f"cross_rank_report needs every rank to have timed steps, got {list(ranks)!r}")
    ranks = sorted(ranks, key=lambda r: r.rank)
    steps = [float(r.step_s or 0.0) for r in ranks]
    pre = [float(r.pre_sync_s or 0.0) for r in ranks]
    slow = ranks[max(range(len(ranks)), key=lambda i: pre[i])]
    # The verdict's rank (its candidate when quiet); a burst's (a quiet verdict) when there is one: its peers waited.
    named = burst.rank if burst is not None and burst.beside is None else verdict.rank if verdict is not None else None
    if named is not None and any(r.rank == named for r in ranks):
        slow = next(r for r in ranks if r.rank == named)
    others = [i for i, r in enumerate(ranks) if r.rank != slow.rank] or list(range(len(ranks)))
    fast = ranks[min(others, key=lambda i: pre[i])]  # never the slowest rank too
    # The phase the cause says (loading), not the means' (a peer's few stalls can move them): else the means'.
    phase, excess = _slowest_phase(ranks, slow, ("data",) if cause is not None and cause.rank == slow.rank
                                   and cause.cause.value == "input" else ())
    imbalance = imbalance_pct(pre)
    mems, mem_imbalance, max_mem_rank = [r.peak_memory_bytes for r in ranks], None, None
    if len(ranks) > 1 and all(m is not None for m in mems):
        mem_imbalance = imbalance_pct([float(m or 0) for m in mems])
        max_mem_rank = max(ranks, key=lambda r: r.peak_memory_bytes or 0).rank

    mfu, mean_total = None, sum(r.total_s for r in ranks) / len(ranks)
    if flops and peak_tflops and mean_total > 0:
        mfu = flops / (len(ranks) * mean_total * peak_tflops * 1e12) * 100.0

    warnings: list[str] = []
    if len(ranks) > 1 and verdict is not None and verdict.raised:
        others = [p for r, p in zip(ranks, pre) if r.rank != slow.rank]
        typical = median(others)  # as imbalance_pct takes it: with an even count, the mean of the middle two
        # The advice follows the cause said beside it (not the loading the means blame after a few stalls).
        compute = cause is not None and cause.rank == slow.rank and cause.cause.value != "input" and phase == "data"
        advice = phase_advice(_slowest_phase(ranks, slow, ("forward", "backward"))[0] if compute else phase, on_gpu,
                              loader)
        named = PHASE_NAMES.get(phase, phase)
        why = (f"Most of the difference is in {named} (+{excess:.4f}s per step): rank {slow.rank}: {advice}."
               if cause is None or cause.rank != slow.rank else
               f"Rank {slow.rank}: {cause_why(cause)}. Rank {slow.rank}: {cause_action(cause, on_gpu, advice)}.")
        # (a peer's few long steps can lift its mean above the slow rank's: then the means are no evidence, said so)
        # (The verdict's figure is the median step's; the means' ratio, the table's, is said beside it: trial V read
        # "123.1%" next to means 89.2% apart.)
        mean = (f"averages {slow.pre_sync_s:.4f}s per step vs {typical:.4f}s on a typical peer "
                f"({100.0 * (slow.pre_sync_s / typical - 1.0):.1f}% in the means)"
                if slow.pre_sync_s > typical and typical > 0 else
                f"is longer step by step, though its mean is not ({slow.pre_sync_s:.4f}s vs "
                f"{typical:.4f}s on a typical peer: another rank's few long steps weigh on the means)")
        warnings.append(
            f"Imbalance before the gradient sync {verdict.effect_pct:.1f}% > {time_threshold_pct:g}% (the median "
            f"step's): rank {slow.rank} is the slowest. Its time to the sync (data + forward + backward compute, its "
            f"wait for a CPU included) {mean}; step by step, that wait left out, the other ranks wait for it in the "
            f"collectives ({verdict.reason}; confidence {verdict.confidence:.3f}). {why}")
    if mem_imbalance is not None and mem_imbalance > memory_threshold_pct:
        warnings.append(memory_warning(ranks, mem_imbalance, memory_threshold_pct))
    return CrossRankReport(
        ranks=list(ranks),
        step_mean_s=sum(steps) / len(steps),
        step_min_s=min(steps),
        step_max_s=max(steps),
        step_imbalance_pct=imbalance_pct(steps),
        imbalance_pct=imbalance,
        slowest_rank=slow.rank,
        fastest_rank=fast.rank,
        slowest_phase=phase,
        memory_imbalance_pct=mem_imbalance,
        max_memory_rank=max_mem_rank,
        samples_per_s=sum(r.samples_per_s for r in ranks),
        tokens_per_s=sum(r.tokens_per_s for r in ranks),
        mfu_pct=mfu,
        time_threshold_pct=time_threshold_pct,
        memory_threshold_pct=memory_threshold_pct,
        warnings=warnings,
        imbalance_verdict=verdict.to_json() if verdict is not None else None,
    )


def memory_warning(ranks: Sequence[RankSummary], mem_imbalance: float, threshold_pct: float) -> str:
    """The peak-memory imbalance warning, naming the highest and the lowest rank."""
    low = min(ranks, key=lambda r: r.peak_memory_bytes or 0)
    high = max(ranks, key=lambda r: r.peak_memory_bytes or 0)
    return (
        f"Peak memory imbalance {mem_imbalance:.1f}% > {threshold_pct:g}%: rank {high.rank} peaks "
        f"at {format_bytes(high.peak_memory_bytes)} vs {format_bytes(low.peak_memory_bytes)} on rank "
        f"{low.rank}. Look for work only that rank does (logging, evaluation, checkpoint saving on rank 0; the "
        "profiler's window when --profile-ranks traces only some ranks: its events stay in memory until the window's "
        "export), uneven batch shapes (variable-length padding: pad to a fixed length or use --group_by_length), or "
        "tensors kept alive on one rank; sharding optimizer state and gradients (FSDP) also evens it out."
    )


def live_time_warnings(warned: Mapping[tuple[str, int], int], final: SlowRankVerdict | None
                       ) -> tuple[list[dict[str, Any]], list[str]]:
    """Each live step-time warning (``warned``: (kind, rank) -> the step it was said), whether the verdict over the
    whole run still names its rank, and the sentence withdrawing each one that does not: a rank slower for the first
    20 steps of 30 (a shared machine's drift) is warned about live, then found within the threshold over the run."""
    rows: list[dict[str, Any]] = []
    withdrawn: list[str] = []
    for (kind, rank), step in sorted(warned.items(), key=lambda item: item[1]):
        if kind != "time":
            continue
        held = bool(final is not None and final.raised and final.rank == rank)
        rows.append({"rank": rank, "step": step, "held_at_end": held})
        if not held:
            why = final.reason if final is not None else "no verdict over the run"
            withdrawn.append(f"The step-time warning of step {step} about rank {rank} did not hold over the "
                             f"whole run: {why}")
    return rows, withdrawn


def unresolved_note(comm: dict[str, Any]) -> str:
    """``""`` when the probe resolved the communication, else the sentence saying it did not."""
    if comm.get("resolved", True):
        return ""
    return (f"; not resolved: within the passes' own spread ({comm.get('noise_s', 0.0):.4f}s), run more passes "
            "or on a quieter machine")


PHASE_NAMES = {"data": "load", "forward": "forward", "backward": "backward compute"}
"""The pre-sync phases as the table's columns name them (``slowest_phase`` compares the loading pre-sync counts: the
``load`` column, not ``data``, the whole wait for the batch)."""
SHOWN_PHASE_SHARE = 0.01
"""The slowest rank's phase is named when its excess is at least this share of its pre-sync (a trial: 3 us)."""


def verdict_line(verdict: dict[str, Any] | None, threshold_pct: float) -> str:
    """The slow-rank verdict in one table line, so that a mean imbalance above the threshold with no warning says why
    ("quiet: rank 1's pre-sync work (...) exceeds its peers' by a median 18.1%: not the slowest in enough steps");
    empty without a verdict naming a rank. The claim is the verdict's own: it names what it compared (own work, or
    pre-sync time with the wait for a CPU when own work named no rank)."""
    if not verdict or verdict.get("rank") is None:
        return ""
    claim = verdict.get("claim") or (f"rank {verdict['rank']}'s excess is a median "
                                     f"{float(verdict.get('effect_pct') or 0.0):.1f}%")
    head = f"slow-rank verdict over {verdict.get('steps', 0)} steps: "
    status = verdict.get("status")
    if status == "raised":
        return f"{head}raised: {claim}: the warning follows in the log"
    if status != "quiet":
        return f"{head}not decided: {claim}: too few steps to tell a slow rank from chance"
    gate = str(verdict.get("gate") or "")
    why = f"under the {threshold_pct:g}% threshold" if gate == "threshold" else QUIET_WHY.get(gate, "quiet")
    return f"{head}quiet: {claim}: {why}"


def _cell(value: float | None, width: int, fmt: str = ".4f") -> str:
    return ("n/a" if value is None else format(value, fmt)).rjust(width)


def format_table(report: CrossRankReport, comm: dict[str, Any] | None = None, title: str = "") -> str:
    """The human-readable table rank 0 prints at the end of training.

    Args:
        report: The run's cross-rank report.
        comm: The comm-overhead result (``CommOverhead.to_json()``), when it was measured.
        title: A first line.

    Returns:
        Multi-line text.
    """
    alone = len(report.ranks) == 1  # one process: its "wait" is the rest of the step, no rank to wait for
    cols = ("data", "load", "forward", "backward", "(compute)", "optim", "step", "pre-sync",
            "rest" if alone else "wait")
    keys = PHASE_KEYS
    lines = [title] if title else []
    lines.append("seconds per optimizer step (means); pre-sync = load + forward + backward compute"
                 + ("; rest = step - pre-sync - optim" if alone else ""))
    lines.append("rank " + "".join(c.rjust(10) for c in cols) + "  samples/s   tokens/s   peak mem")
    for r in report.ranks:
        row = f"{r.rank:<5}" + "".join(_cell(getattr(r, k), 10) for k in keys)
        row += f"{r.samples_per_s:11.1f}{r.tokens_per_s:11.0f}{format_bytes(r.peak_memory_bytes):>11}"
        if len(report.ranks) > 1 and r.rank == report.slowest_rank:
            row += "  <- slowest"
        lines.append(row)
    # The imbalance is the largest mean pre-sync over its peers'; the slowest rank is the verdict's (step by step, on
    # its own basis). When they are not the same rank, the line says whose each is rather than put one's figure
    # beside the other's name.
    most = max(report.ranks, key=lambda r: r.pre_sync_s or 0.0).rank
    slowest = f"slowest rank {report.slowest_rank}"
    slow = next((r for r in report.ranks if r.rank == report.slowest_rank), None)
    if slow is not None and (len(report.ranks) == 1 or _slowest_phase(report.ranks, slow)[1]
                             > SHOWN_PHASE_SHARE * (slow.pre_sync_s or 0.0)):
        slowest += f" ({PHASE_NAMES.get(report.slowest_phase, report.slowest_phase)})"  # a phase it is slower in
    if len(report.ranks) > 1 and most != report.slowest_rank:
        slowest = f"the most on rank {most}; {slowest} by the verdict below, which compares the ranks step by step"
    # Above the threshold in the means while the verdict raises nothing (a few long steps): said where it is read.
    mean_only = len(report.ranks) > 1 and report.imbalance_pct > report.time_threshold_pct and \
        report.imbalance_verdict is not None and report.imbalance_verdict.get("status") != "raised"
    if len(report.ranks) == 1:  # (no peer: no imbalance, no slowest rank, no verdict; a trial read "slowest rank 0")
        lines.append(f"step time: {report.step_mean_s:.4f} s (one rank: no imbalance or slow rank to judge)")
    else:
        lines.append(
            f"step time (the ranks' means) mean/min/max: {report.step_mean_s:.4f} / {report.step_min_s:.4f} / "
            f"{report.step_max_s:.4f} s; imbalance (mean pre-sync): {report.imbalance_pct:.1f}% (threshold "
            f"{report.time_threshold_pct:g}%{'; in the means only: the verdict below decides' if mean_only else ''}), "
            f"{slowest}"
        )
    said = verdict_line(report.imbalance_verdict, report.time_threshold_pct) if len(report.ranks) > 1 else ""
    if said:
        lines.append(said)
    waits = [r.cpu_wait_s for r in report.ranks]
    if all(w is not None for w in waits):
        lines.append(
            "waiting for a CPU (run queue, before the optimizer): "
            + ", ".join(f"rank {r.rank} {r.cpu_wait_s:.4f}s" for r in report.ranks)
            + (" per step; the verdict weighs pre-sync less the part of this wait inside it, then with it (a rank "
               "only this wait makes late is named with its machine as the cause)" if len(report.ranks) > 1 else
               " per step")
        )
    mem = "n/a" if report.memory_imbalance_pct is None else f"{report.memory_imbalance_pct:.1f}%"
    lines.append(f"peak memory imbalance: {mem} (threshold {report.memory_threshold_pct:g}%)")
    mfu = "n/a (no --peak-tflops and no known GPU)" if report.mfu_pct is None else f"{report.mfu_pct:.1f}%"
    lines.append(
        f"throughput (all ranks): {report.samples_per_s:.1f} samples/s, "
        f"{report.tokens_per_s:.0f} tokens/s; MFU {mfu}"
    )
    if comm:
        lines.append(
            f"comm overhead ({comm['passes']} passes per mode): compute {comm['compute_s']:.4f}s, "
            f"with sync {comm['with_sync_s']:.4f}s, communication {comm['comm_s']:.4f}s = "
            f"{comm['overhead_pct']:.1f}% of a synced forward+backward (one micro-batch's){unresolved_note(comm)}"
        )
    if report.warnings:
        lines.append(f"{len(report.warnings)} warning(s) follow in the log.")
    return "\n".join(lines)
