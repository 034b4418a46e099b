"""Rank 0's verdict on each check, from every rank's result: ✓ (passed), ✗ (failed) or - (skipped), with the
numbers behind it and the ranks to blame."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hf_distprof.core.text import format_ranks
from hf_distprof.doctor.checks import COLLECTIVES, ENV_MUST_AGREE, REPEATS, round_robin_rounds
from hf_distprof.doctor.context import RankContext

_SYMBOL = {"pass": "✓", "fail": "✗", "skip": "-"}
# What a correct result is, in the ✓ line.
_PROMISE = {"all_reduce": "sum of rank+1 = n(n+1)/2", "all_gather": "block i = i+1",
            "reduce_scatter": "block r = (r+1)·n(n+1)/2", "broadcast": "rank 0's pattern everywhere",
            "barrier": "every rank arrived"}


@dataclass
class Outcome:
    """Rank 0's verdict on one check, as printed and written to ``--json``."""

    name: str
    status: str  # "pass", "fail" or "skip"
    summary: str
    details: list[str] = field(default_factory=list)
    bad_ranks: list[int] = field(default_factory=list)  # answered with a wrong result or an error
    silent_ranks: list[int] = field(default_factory=list)  # no answer before the deadline
    seconds: float = 0.0
    per_rank: dict[str, Any] = field(default_factory=dict)  # each rank's raw result

    def lines(self) -> list[str]:
        """The headline and its indented details."""
        return [f"{_SYMBOL[self.status]} {self.name:<15}{self.summary}", *(f"    {d}" for d in self.details)]


def _judge(ok: bool, summary: str, details: list[str] | None = None, bad: list[int] | None = None) -> Outcome:
    """An outcome without name, timing or silent ranks; the runner (``Doctor._conclude``) fills those in."""
    return Outcome("", "pass" if ok else "fail", summary, details or [], sorted(bad or []))


def _by_value(values: dict[int, Any]) -> str:
    """``{0: 'a', 1: 'b', 2: 'a'}`` -> ``"'a' on ranks 0, 2; 'b' on rank 1"`` (absent: None)."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(repr(value), []).append(rank)
    return "; ".join(f"{value} on {format_ranks(ranks)}" for value, ranks in groups.items())


def _differences(maps: dict[int, dict[str, Any]]) -> dict[str, dict[int, Any]]:
    """The keys whose value is not the same on every rank (a missing key counts as None), per rank."""
    keys = sorted({k for m in maps.values() for k in m})
    per_key = {k: {r: m.get(k) for r, m in maps.items()} for k in keys}
    return {k: v for k, v in per_key.items() if len(set(v.values())) > 1}


def _judge_init(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    failed = {r: v["error"] for r, v in per_rank.items() if "error" in v}
    hosts: dict[str, list[str]] = {}
    for r, v in sorted(per_rank.items()):
        hosts.setdefault(v["host"], []).append(f"{r} (local {v['local_rank']})")
    details = [f"{host}: rank {', '.join(ranks)}" for host, ranks in hosts.items()]
    details += [f"rank {r}: {err}" for r, err in sorted(failed.items())]
    slowest = max(v["seconds"] for v in per_rank.values())
    summary = (f"{len(per_rank) - len(failed)}/{doc.world} ranks initialised, world size {doc.world} (expected "
               f"{doc.expected_world}), backend {doc.backend}, {slowest:.2f} s")
    return _judge(not failed and doc.world == doc.expected_world, summary, details, list(failed))


def _odd_ones(differ: dict[str, dict[int, Any]]) -> list[int]:
    """Ranks whose value of some key differs from the lowest rank's."""
    return sorted({r for values in differ.values() for r, v in values.items() if v != values[min(values)]})


def _judge_versions(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    differ = _differences(per_rank)
    if differ:
        details = [f"{k}: {_by_value(v)}" for k, v in differ.items()]
        return _judge(False, f"ranks disagree on {', '.join(differ)}", details, _odd_ones(differ))
    versions = ", ".join(f"{k} {v}" for k, v in per_rank[min(per_rank)].items())
    return _judge(True, f"same on {format_ranks(list(per_rank))}: {versions}")


def _judge_environment(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    envs = {r: v["env"] for r, v in per_rank.items()}
    differ = _differences(envs)
    same = {k: v for k, v in sorted(envs[min(envs)].items()) if k not in differ}
    details = [f"same on {format_ranks(list(envs))}: " + (" ".join(f"{k}={v}" for k, v in same.items()) or "(none)")]
    details += [f"{k}: {_by_value(v)}" for k, v in differ.items()]
    conflicts = {k: differ[k] for k in ENV_MUST_AGREE if k in differ}
    if conflicts:
        return _judge(False, f"ranks disagree on {', '.join(conflicts)}", details, _odd_ones(conflicts))
    agreed = ", ".join(f"{k}={same.get(k, '(unset)')}" for k in ENV_MUST_AGREE)
    return _judge(True, f"{agreed} on {format_ranks(list(envs))}", details)


def _judge_memory(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    limit = doc.args.min_free_gb
    rank, least = min(per_rank.items(), key=lambda kv: kv[1]["free_gb"])
    low = sorted(r for r, v in per_rank.items() if v["free_gb"] < limit)
    summary = (f"least free: {least['free_gb']:.2f} of {least['total_gb']:.2f} GB {least['kind']} on rank {rank} "
               f"(--min-free-gb {limit:g})")
    return _judge(not low, summary, [f"rank {r}: {per_rank[r]['free_gb']:.2f} GB free" for r in low], low)


def _judge_p2p(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    rounds = round_robin_rounds(doc.world)
    problems: dict[tuple[int, int], list[tuple[int, str]]] = {}
    round_trips: dict[tuple[int, int], float] = {}
    for rank, result in sorted(per_rank.items()):
        for x in result["pairs"]:
            pair = (min(rank, x["peer"]), max(rank, x["peer"]))
            trouble = x.get("error") or x.get("wrong")
            if trouble:
                problems.setdefault(pair, []).append((rank, trouble))
            elif rank < x["peer"]:
                round_trips[pair] = x["ms"]
    n_pairs = sum(map(len, rounds))
    summary = f"{n_pairs} pair(s) in {len(rounds)} round(s), 1 MiB each way"
    if round_trips:
        a, b = max(round_trips, key=round_trips.__getitem__)
        summary += (f"; round trip median {statistics.median(round_trips.values()):.2f} ms, slowest {a}<->{b} "
                    f"{round_trips[a, b]:.2f} ms")
    if not problems:
        return _judge(True, summary)
    failed = ", ".join(f"{a}<->{b}" for a, b in sorted(problems))
    reports = [report for _, reports in sorted(problems.items()) for report in reports]
    details = [f"rank {rank}: {trouble}" for rank, trouble in reports]
    bad = sorted({rank for rank, _ in reports})
    return _judge(False, f"{len(problems)} of {n_pairs} pair(s) failed: {failed}; {summary}", details, bad)


def _judge_collective(doc: RankContext, per_rank: dict[int, dict[str, Any]], name: str) -> Outcome:
    if all("unsupported" in v for v in per_rank.values()):
        return Outcome(name, "skip", f"not supported by {doc.backend}", [per_rank[min(per_rank)]["unsupported"]])
    wrong = {r: v["wrong"] for r, v in per_rank.items() if "wrong" in v}
    errors = {r: v.get("error") or v["unsupported"] for r, v in per_rank.items() if "error" in v or "unsupported" in v}
    medians = {r: statistics.median(v["ms"]) for r, v in per_rank.items() if v.get("ms")}
    timing = ""
    if medians:
        slow = max(medians, key=medians.__getitem__)
        size = "" if name == "barrier" else " of 1 MiB"
        timing = (f"median {statistics.median(medians.values()):.2f} ms{size} over {REPEATS} runs, slowest rank "
                  f"{slow} {medians[slow]:.2f} ms")
    if not wrong and not errors:
        return _judge(True, f"{_PROMISE[name]} on {len(per_rank)} rank(s); {timing}")
    parts = [f"wrong result on {format_ranks(list(wrong))}"] if wrong else []
    parts += [f"error on {format_ranks(list(errors))}"] if errors else []
    details = [f"rank {r}: {msg}" for r, msg in sorted({**wrong, **errors}.items())]
    return _judge(False, "; ".join(parts + ([timing] if timing else [])), details, [*wrong, *errors])


def _judge_clock_skew(doc: RankContext, per_rank: dict[int, dict[str, Any]]) -> Outcome:
    limit = doc.args.max_skew_ms
    peers = per_rank.get(0, {}).get("peers", [])
    errors = {r: v["error"] for r, v in per_rank.items() if "error" in v}
    far = [p for p in peers if abs(p["offset_ms"]) > limit]
    summary = "no offset measured"
    if peers:
        worst = max(peers, key=lambda p: abs(p["offset_ms"]))
        summary = (f"largest offset from rank 0: {worst['offset_ms']:+.2f} ms on rank {worst['rank']} "
                   f"(± {worst['rtt_ms'] / 2:.2f} ms, half the best round trip); --max-skew-ms {limit:g}")
    details = [f"rank {p['rank']}: {p['offset_ms']:+.1f} ms" for p in far]
    details += [f"rank {r}: {err}" for r, err in sorted(errors.items())]
    return _judge(not far and not errors, summary, details, [p["rank"] for p in far] + list(errors))


# Each check's judge: (the doctor, every rank's result that came in) -> the verdict, without name or timing.
JUDGE: dict[str, Callable[[RankContext, dict[int, dict[str, Any]]], Outcome]] = {
    "init": _judge_init, "versions": _judge_versions, "environment": _judge_environment, "memory": _judge_memory,
    "p2p": _judge_p2p, "clock_skew": _judge_clock_skew,
    **{name: functools.partial(_judge_collective, name=name) for name in COLLECTIVES}}
