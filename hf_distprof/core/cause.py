"""Whose fault (torch-free): why one rank makes its peers wait, from the step timer's per-step figures.

A rank named slow next raises three questions, each answered from the run's own steps, the same way by the live step
timer and by ``hf-distprof analyze`` (the one rule, :func:`attribute`):

- **Does it wait for a CPU?** Its thread was ready to run but waited in the run queue (another process, or the other
  rank, holds its core). That is the machine's doing, not the code's.
- **Is its input pipeline slower?** Its data loading (inside the loader's ``next()``) exceeds its peers'.
- **Does it do more work?** It processes more tokens (or samples) per step than its peers: uneven batches.
- **Does it do the same work slower?** Its compute per token (its own work less data loading, the CPU wait taken
  out) is slower than its peers': a slower, throttled or shared machine.

The figures are interquartile means (:func:`~hf_distprof.core.stats.interquartile_mean`) over the judged steps of the
rank's value against the median of its peers' in the same step: robust to stalls in up to a quarter of the steps (the
burst's to say, :mod:`hf_distprof.core.burst`), as a median is, and the middle of a slowness that comes in every other
step, where a median lands on either level by one step's chance (a trial: 30 ms more loading in every other step said
as "2.1 ms more per step").
Whether the rank is slow at all is the verdict engine's decision (:mod:`hf_distprof.core.verdicts`); this says why, and
whether it was so in most steps or in bursts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from statistics import median
from typing import Any

from hf_distprof.core.stats import interquartile_mean as typical


class Cause(str, Enum):
    """Why a rank makes its peers wait. Its value is what the JSON files show."""

    CPU_WAIT = "cpu_wait"
    """Its machine: its thread waits for a CPU (its cores are shared)."""
    INPUT = "input"
    """Its input pipeline: data loading is slower."""
    MORE_WORK = "more_work"
    """Its data: more tokens (or samples) per step than its peers."""
    SLOWER_MACHINE = "slower_machine"
    """Its machine: the same work per token takes longer (a slower, throttled or shared device or host)."""
    COMPUTE = "compute"
    """Its compute is slower, and neither the work counted nor the speed per token says why."""


MACHINE = frozenset({Cause.CPU_WAIT, Cause.SLOWER_MACHINE})
"""Causes outside the user's code and data."""

PARTS = ("arrival", "cpu_wait", "data", "compute", "units")
"""Per step and rank: the pre-sync time (what its peers wait for at the sync), the part of it spent waiting for a
CPU, data loading, own compute (pre-sync less data loading, the CPU wait taken out) and the work units (tokens, else
samples)."""

CPU_SHARE = 0.5
"""The wait for a CPU is the cause when it is at least this share of the rank's excess."""
PERSISTENT_SHARE = 0.75
"""A rank slowest in at least this share of the steps is slow throughout; else in bursts."""


@dataclass
class Attribution:
    """Why ``rank`` makes its peers wait, with every figure the answer rests on (seconds per step, interquartile means
    over the judged steps of the rank's value less its peers' median in the same step)."""

    rank: int
    cause: Cause
    steps: int
    excess_s: float
    """Its pre-sync time over its peers': what they wait for it per step."""
    cpu_wait_s: float
    """Its wait for a CPU over its peers'."""
    data_s: float
    """Its data loading over its peers'."""
    compute_s: float
    """Its own compute over its peers'."""
    cpu_wait_abs_s: float = 0.0
    """Its own wait for a CPU per step, and its peers' (per step the median of theirs), as the other figures."""
    peers_cpu_wait_s: float = 0.0
    unit: str = "tokens"
    """What the work is counted in: ``tokens``, else ``samples``."""
    work_ratio: float | None = None
    """Its work per step over its peers' (1.0: the same); None when no work was counted."""
    speed_ratio: float | None = None
    """Its compute per unit of work over its peers' (above 1: slower on the same work); None without work counted."""
    slowest_in: int = 0
    """Steps in which it reached the sync last."""
    longest_run: int = 0
    """The longest run of consecutive steps in which it was last."""
    persistent: bool = True
    """Slowest in most steps (:data:`PERSISTENT_SHARE`), not in bursts."""
    cpu_wait_beyond_work_s: float = 0.0
    """Its wait for a CPU beyond its peers' scaled by its work ratio (what the cause weighs); ``cpu_wait_s`` when its
    work is its peers'."""
    data_beyond_work_s: float = 0.0
    """Its data loading beyond its peers' scaled by its work ratio."""
    more_work_too: bool = False
    """Besides its cause (a wait for a CPU, its data loading), it also does more work than its peers (``work_ratio``
    above the threshold): both are said."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What the host or device showed, when sampled (GPU clocks, throttle reasons ...)."""

    @property
    def machine(self) -> bool:
        """Whether the cause is outside the user's code and data (not when it also does more work)."""
        return self.cause in MACHINE and not self.more_work_too

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["cause"] = self.cause.value
        return out


def _excess(values: Mapping[int, Sequence[float]], rank: int, n: int) -> list[float]:
    """Per step, ``rank``'s value less the median of its peers'."""
    peers = [r for r in values if r != rank]
    return [values[rank][i] - median(values[p][i] for p in peers) for i in range(n)]


def _beyond(values: Mapping[int, Sequence[float]], rank: int, n: int, scale: float) -> float:
    """Over the steps (their interquartile mean), ``rank``'s value less ``scale`` times its peers' median (what its
    work explains)."""
    peers = [r for r in values if r != rank]
    return typical([values[rank][i] - scale * median(values[p][i] for p in peers) for i in range(n)])


def _ratio(values: Mapping[int, Sequence[float]], rank: int, n: int) -> float | None:
    """Median over the steps of ``rank``'s value over its peers' median (steps where that is 0 left out)."""
    peers = [r for r in values if r != rank]
    ratios = []
    for i in range(n):
        them = median(values[p][i] for p in peers)
        if them > 0:
            ratios.append(values[rank][i] / them)
    return median(ratios) if ratios else None


def _runs(last: Sequence[bool]) -> int:
    best = run = 0
    for flag in last:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def attribute(parts: Mapping[str, Mapping[int, Sequence[float]]], rank: int, threshold_pct: float,
              unit: str = "tokens") -> Attribution | None:
    """Why ``rank`` makes its peers wait.

    Args:
        parts: :data:`PARTS` -> rank -> its value in each judged step (same steps, same order for every rank and part).
        rank: The rank the verdict names (or its candidate).
        threshold_pct: The slow-rank threshold: a work or speed ratio counts when it is above ``1 + threshold``.
        unit: What ``parts["units"]`` counts.

    Returns:
        The attribution; None with fewer than 2 ranks, no step, or ``rank`` not among them.
    """
    arrival = parts["arrival"]
    if rank not in arrival or len(arrival) < 2:
        return None
    n = min(len(v) for p in PARTS for v in parts[p].values())
    if n == 0:
        return None
    excess = typical(_excess(arrival, rank, n))
    cpu = typical(_excess(parts["cpu_wait"], rank, n))
    data = typical(_excess(parts["data"], rank, n))
    compute = typical(_excess(parts["compute"], rank, n))
    counted = any(v > 0 for vs in parts["units"].values() for v in vs[:n])
    work = _ratio(parts["units"], rank, n) if counted else None
    per_unit = {r: [c / u if u > 0 else 0.0 for c, u in zip(parts["compute"][r][:n], parts["units"][r][:n])]
                for r in arrival}
    speed = _ratio(per_unit, rank, n) if counted else None
    above = 1.0 + threshold_pct / 100.0
    # A rank with more work runs longer, so on a shared host it waits longer for a CPU, and it loads more data, in
    # proportion: only its wait and its loading beyond its peers' scaled by its work ratio are its machine's or its
    # input pipeline's.
    scale = max(work, 1.0) if work is not None else 1.0
    cpu_beyond = _beyond(parts["cpu_wait"], rank, n, scale)
    data_beyond = _beyond(parts["data"], rank, n, scale)
    if cpu_beyond > 0 and cpu_beyond >= CPU_SHARE * excess:
        cause = Cause.CPU_WAIT
    elif data_beyond > 0 and data_beyond >= compute:
        cause = Cause.INPUT
    elif work is not None and work > above:
        cause = Cause.MORE_WORK
    elif speed is not None and speed > above:
        cause = Cause.SLOWER_MACHINE
    else:
        cause = Cause.COMPUTE
    last = [arrival[rank][i] >= max(arrival[r][i] for r in arrival) for i in range(n)]
    slowest = sum(last)
    return Attribution(
        rank=rank, cause=cause, steps=n, excess_s=excess, cpu_wait_s=cpu, data_s=data, compute_s=compute,
        cpu_wait_beyond_work_s=cpu_beyond, data_beyond_work_s=data_beyond,
        cpu_wait_abs_s=typical(list(parts["cpu_wait"][rank][:n])),
        peers_cpu_wait_s=typical([median(parts["cpu_wait"][r][i] for r in arrival if r != rank) for i in range(n)]),
        unit=unit, work_ratio=work, speed_ratio=speed, slowest_in=slowest, longest_run=_runs(last),
        persistent=slowest >= PERSISTENT_SHARE * n,
        more_work_too=cause in (Cause.CPU_WAIT, Cause.INPUT) and work is not None and work > above,
    )


def attribute_rows(rows: Mapping[int, Sequence[Sequence[float]]], rank: int,
                   threshold_pct: float) -> Attribution | None:
    """:func:`attribute` of rows of ``(arrival, cpu_wait, data, compute, tokens, samples)``
    per rank and step: the work counted in tokens when every rank counted some, else in samples."""
    tokens = all(any(row[4] > 0 for row in steps) for steps in rows.values())
    column = 4 if tokens else 5
    parts = {name: {r: [row[i] for row in steps] for r, steps in rows.items()}
             for i, name in enumerate(("arrival", "cpu_wait", "data", "compute"))}
    parts["units"] = {r: [row[column] for row in steps] for r, steps in rows.items()}
    return attribute(parts, rank, threshold_pct, "tokens" if tokens else "samples")


SLOWER_CLOCK = 0.05
"""A GPU whose SM clock is this much below its peers' median is slower on the same work."""


def device_evidence(health: Mapping[int, Mapping[str, Any]], rank: int) -> dict[str, Any]:
    """What the ranks' GPUs say about ``rank``'s: its SM clock against its peers' median, its active slowdowns; empty
    when its GPU was not sampled or shows nothing slower (``health``: rank -> :meth:`GpuHealth.to_json`)."""
    mine = health.get(rank)
    peers = sorted(h["sm_clock_mhz"] for r, h in health.items() if r != rank and h)
    if not mine:
        return {}
    out: dict[str, Any] = {}
    if mine.get("throttle"):
        out["throttle"] = list(mine["throttle"])
    if peers:
        typical = median(peers)
        if mine["sm_clock_mhz"] < (1.0 - SLOWER_CLOCK) * typical:
            out["sm_clock_mhz"], out["peers_sm_clock_mhz"] = mine["sm_clock_mhz"], typical
    if out and mine.get("temperature_c") is not None:
        out["temperature_c"] = mine["temperature_c"]
    return out


def evidence_sentence(extra: dict[str, Any]) -> str:
    """"its GPU runs at 1410 MHz against its peers' 1980 MHz, slowed by hardware thermal slowdown (at 91 C)", or ""."""
    parts = []
    if "sm_clock_mhz" in extra:
        parts.append(f"its GPU runs at {extra['sm_clock_mhz']} MHz against its peers' "
                     f"{extra['peers_sm_clock_mhz']:.0f} MHz")
    if extra.get("throttle"):
        parts.append(f"slowed by {' and '.join(extra['throttle'])}")
    if parts and extra.get("temperature_c") is not None:
        parts[-1] += f" (at {extra['temperature_c']} C)"
    return ", ".join(parts)


def with_device(a: Attribution, health: Mapping[int, Mapping[str, Any]]) -> Attribution:
    """``a`` with what the ranks' GPUs show (``health``: rank -> its sample, :mod:`hf_distprof.timing.gpu_health`):
    a rank whose GPU runs slower than its peers' or is throttled, with no other cause named, is slower on the same
    work because of its machine."""
    extra = device_evidence(dict(health), a.rank)
    if not extra:
        return a
    cause = Cause.SLOWER_MACHINE if a.cause in (Cause.COMPUTE, Cause.SLOWER_MACHINE) else a.cause
    return Attribution(**{**{f: getattr(a, f) for f in a.__dataclass_fields__}, "cause": cause, "extra": extra})


def from_json(doc: Any) -> Attribution | None:
    """An attribution written by :meth:`Attribution.to_json`; None when absent or malformed."""
    if not isinstance(doc, Mapping):
        return None
    try:
        values = dict(doc)
        values["cause"] = Cause(values["cause"])
        return Attribution(**values)
    except (KeyError, TypeError, ValueError):
        return None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if abs(seconds) >= 0.01 else f"{seconds * 1e3:.1f} ms"


def _unit(a: Attribution, one: bool = False) -> str:
    return ("token" if one else "tokens") if a.unit == "tokens" else ("sample" if one else "samples")


def cause_title(a: Attribution) -> str:
    """What holds the rank back, as a finding's title ends ("Rank 1 holds the others back: <this>")."""
    if a.more_work_too:
        also = f"more work ({a.work_ratio or 0.0:.1f}x the {_unit(a)} of its peers)"
        return {Cause.CPU_WAIT: f"its machine (it waits for a CPU) and {also}",
                Cause.INPUT: f"its data loading and {also}"}[a.cause]
    return {
        Cause.CPU_WAIT: "its machine, not your code (it waits for a CPU)",
        Cause.INPUT: "its data loading",
        Cause.MORE_WORK: f"more work ({a.work_ratio or 0.0:.1f}x the {_unit(a)} of its peers)",
        # ("not your code" only where the device says why: on a host the same work can be slower for a thread of
        # the rank's own process.)
        Cause.SLOWER_MACHINE: f"its machine{', not your code' if a.extra else ''} (the same work, slower)",
        Cause.COMPUTE: "its compute",
    }[a.cause]


def cause_why(a: Attribution) -> str:
    """The measurement that says why, in one sentence (after "rank R: "): the cause, its figures, persistence."""
    unit = _unit(a)
    if a.cause == Cause.CPU_WAIT:
        if a.more_work_too:  # the share its work explains is the work's, said after
            text = (f"it waited {_ms(a.cpu_wait_abs_s)} per step for a CPU (its peers {_ms(a.peers_cpu_wait_s)}), "
                    f"{_ms(a.cpu_wait_beyond_work_s)} beyond what its work explains"
                    f"{_of(a.cpu_wait_beyond_work_s, a, ', ')}"
                    ": another process shares its cores")
        else:
            text = (f"not your code: it waited {_ms(a.cpu_wait_abs_s)} per step for a CPU (its peers "
                    f"{_ms(a.peers_cpu_wait_s)}), {_ms(a.cpu_wait_s)}{_of(a.cpu_wait_s, a)}: another process shares "
                    "its cores")
    elif a.cause == Cause.INPUT:
        text = f"its data loading takes {_ms(a.data_s)} more per step than its peers'"
        if a.more_work_too:
            text += f", {_ms(a.data_beyond_work_s)} beyond what its work explains"
    elif a.cause == Cause.MORE_WORK:
        speed = f", at {a.speed_ratio:.2f}x their time per {_unit(a, True)}" if a.speed_ratio is not None else ""
        text = f"it processes {a.work_ratio or 0.0:.2f}x the {unit} of its peers per step{speed}"
    elif a.cause == Cause.SLOWER_MACHINE:
        same = (f"it does the same work ({a.work_ratio or 0.0:.2f}x the {unit} of its peers) "
                f"{a.speed_ratio or 0.0:.2f}x slower per {_unit(a, True)}" if a.speed_ratio is not None else
                f"its compute takes {_ms(a.compute_s)} more per step than its peers'")
        device = evidence_sentence(a.extra)
        text = f"not your code: {same}; {device}" if device else f"the same work, slower: {same}"
    else:
        work = f" with {a.work_ratio:.2f}x the {unit} of its peers" if a.work_ratio is not None else ""
        text = f"its compute takes {_ms(a.compute_s)} more per step than its peers'{work}"
    if a.more_work_too:
        text += f"; it also does {a.work_ratio or 0.0:.2f}x the {unit} of its peers per step"
    return f"{text}; {persistence(a)}"


def _of(part: float, a: Attribution, lead: str = " ") -> str:
    """``lead`` + "of the 117 ms its peers wait for it", or, for a part larger than that whole (two medians over the
    same steps need not nest: "2.2 ms of the 1.9 ms"), ", more than all 1.9 ms its peers wait for it"."""
    if _ms(part) != _ms(a.excess_s) and part > a.excess_s:
        return f", more than all {_ms(a.excess_s)} its peers wait for it"
    return f"{lead}of the {_ms(a.excess_s)} its peers wait for it"


def persistence(a: Attribution) -> str:
    """Whether the rank was the last to the sync throughout or in bursts."""
    where = f"last to the sync in {a.slowest_in} of {a.steps} steps"
    if a.persistent:
        return f"{where}, throughout the run"
    return f"{where}, in bursts (at most {a.longest_run} in a row)"


def cause_action(a: Attribution, on_gpu: bool, phase_advice_text: str) -> str:
    """The first thing to try (after "Rank R: "); ``phase_advice_text``: what the slowest phase calls for, which
    the input pipeline's and the unexplained compute's advice is."""
    even = (f"even out the work per rank: fixed-length (padded) or length-grouped batches (--group_by_length), "
            f"or token-balanced batches, so that every rank gets the same number of {_unit(a)} per step")
    if a.cause == Cause.CPU_WAIT:
        if a.more_work_too:
            return ("move or stop the other process on its cores (top or htop on its host shows it), give each rank "
                    f"cores of its own, or drain that node; then {even}")
        return ("move or stop the other process on its cores (top or htop on its host shows it), give each rank "
                "cores of its own, or drain that node; your code and data are not the cause")
    if a.cause == Cause.INPUT and a.more_work_too:
        return f"{phase_advice_text}; then {even}"
    if a.cause == Cause.MORE_WORK:
        return even
    if a.cause == Cause.SLOWER_MACHINE:
        if on_gpu:
            return ("check its GPU: clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK), temperature "
                    "and power; replace or drain the node; your code and data are not the cause")
        # (A busy thread of the rank's own process slows its work alike, through the GIL, with no wait for a CPU:
        # a trial's such thread was told "your code ... not the cause".)
        return ("check its host: another process on its cores, a lower CPU frequency, a slower node, or a busy "
                "thread of the rank's own process holding the GIL (py-spy dump --pid shows it); move the rank or "
                "drain the node; its data and its amount of work are not the cause")
    if a.cause == Cause.COMPUTE and a.unit == "tokens" and a.work_ratio is not None and a.speed_ratio is not None:
        # The same tokens, a little slower each (under the threshold that names its machine): longer padded batches,
        # or its machine (a trial's clean run on a shared host was told "check for uneven sequence lengths" alone).
        where = ("its GPU: clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK), or other processes on it"
                 if on_gpu else "its host: another process on its cores, a lower CPU frequency, or a busy thread of "
                 "the rank's own process (py-spy dump --pid)")
        return (f"it has about its peers' tokens ({a.work_ratio:.2f}x) at {a.speed_ratio:.2f}x their time per token: "
                "if its batches are padded longer (the same tokens in longer sequences), pad to a fixed length or use "
                f"--group_by_length; if not, {where}; on a shared host, run again before acting (a host's lean comes "
                "and goes)")
    return phase_advice_text
