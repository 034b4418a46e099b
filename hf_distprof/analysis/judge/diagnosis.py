"""Diagnosis (pure): measured numbers -> ranked findings, each with its evidence and a recommendation.

The decisions are :mod:`hf_distprof.core.verdicts`'s (the same the live step timer makes): per-step shares must
be above their threshold from :class:`AnalysisOptions` in most steps, and rank comparisons must hold up
against the run's noise. A finding's ``severity`` is a rough share of step time at stake, so that the
list reads most-costly first; its ``confidence`` says how sure the verdict is.
"""

from __future__ import annotations

from hf_distprof.analysis.across import comm
from hf_distprof.analysis.judge import memory
from hf_distprof.analysis.options import AnalysisOptions
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.findings import TRACE, TRACE_AND_TIMER, Finding, Undecided
from hf_distprof.analysis.results.rank import CommKindStat, RankResult
from hf_distprof.core import stats
from hf_distprof.core.run_verdict import by_the_timer
from hf_distprof.core.verdicts import UNDECIDED, SlowRankVerdict, judge_share


def _basis(verdict: SlowRankVerdict | None) -> str:
    """What a slow-rank verdict weighed: the traced window alone, or with the step timer's records."""
    return TRACE_AND_TIMER if by_the_timer(verdict) else TRACE


def diagnose(
    ranks: list[RankResult], cross: CrossRankResult | None, options: AnalysisOptions
) -> list[Finding]:
    """Ranked findings for the analysed ranks.

    Args:
        ranks: Per-rank results.
        cross: The cross-rank view (None for a single rank).
        options: The thresholds.

    Returns:
        Findings in the order they were found (:func:`hf_distprof.analysis.judge.findings.in_order` orders them);
        empty for a healthy trace.
    """
    findings: list[Finding] = []
    fsdp = _fsdp_exposed(ranks, "all_gather", options) + _fsdp_exposed(ranks, "reduce_scatter", options)
    findings += _comm_bound(ranks, options, fsdp_findings=bool(fsdp))
    findings += fsdp
    if cross is not None:
        findings += _stragglers(cross)
        findings += _imbalance(cross, options)
        findings += _waiting_for_peers(ranks, cross, options)
    findings += _low_utilisation(ranks, options)
    findings += _launch_bound(ranks, options)
    findings += _data_loading(ranks, options)
    findings += memory.imbalance_findings(ranks, options)
    return findings


def undecided(cross: CrossRankResult | None) -> list[Undecided]:
    """The slow-rank questions the run is too short to decide ("not enough evidence"), with what would decide them."""
    if cross is None:
        return []
    out = []
    for name, v in (("straggler", cross.straggler_verdict), ("imbalance", cross.imbalance_verdict)):
        if v is not None and v.status == UNDECIDED:
            out.append(Undecided(
                question=name,
                reason=v.reason,
                why=(f"{v.claim} (threshold {v.threshold_pct:g}%), but {v.steps} traced steps of {v.ranks} ranks are "
                     f"too few to tell a slow rank from chance (at least {v.min_steps} are needed)"),
                to_decide=v.to_decide,
                ranks=[v.rank] if v.rank is not None else [],
                basis=_basis(v),
                steps=v.steps,
            ))
    return out


def _transfer_pct_per_step(rank: RankResult) -> list[float]:
    """Per step, the exposed communication that is not a wait for a late peer, % of the step (GPU: its GPU span)."""
    waits = comm.wait_us_per_step(rank)
    if rank.device == "gpu":
        return [100.0 * max(0.0, s.gpu.exposed_comm_us - waits[s.step]) / s.gpu.kernel_time_us
                if s.gpu.kernel_time_us > 0 else 0.0 for s in rank.steps if s.gpu is not None]
    return [s.cpu.pct(max(0.0, s.cpu.communication_us - waits[s.step])) for s in rank.steps]


def _comm_bound(ranks: list[RankResult], options: AnalysisOptions, fsdp_findings: bool) -> list[Finding]:
    """Communication-bound: the exposed communication that is the collectives themselves (a rank waiting for a late
    peer is that peer's finding, not the network's) above the threshold, median over steps and in most steps."""
    verdicts = {r.rank: judge_share(_transfer_pct_per_step(r), options.comm_bound_pct,
                                    "exposed communication, waits for late peers left out") for r in ranks}
    hit = [r for r in ranks if verdicts[r.rank].raised]
    if not hit:
        return []
    transfer = {r.rank: stats.mean(_transfer_pct_per_step(r)) for r in ranks}
    worst = max(hit, key=lambda r: transfer[r.rank])
    mean = stats.mean(list(transfer.values()))
    gpu = worst.device == "gpu"
    overlap = [
        s.gpu.comm_comp_overlap_pct for s in worst.steps if s.gpu and s.gpu.comm_comp_overlap_pct is not None
    ]
    what = (
        "communication kernels run with no computation" if gpu else "the training thread waits on collectives"
    )
    late = "".join(_waits_left_out(r, transfer[r.rank]) for r in hit)
    exposed = stats.mean([r.exposed_comm_pct for r in ranks])
    if fsdp_findings:
        action = "FSDP's all-gathers and reduce-scatters: see the FSDP findings for which and where"
    elif any(_is_fsdp(r) for r in ranks):
        action = ("Overlap communication with compute: FSDP prefetching and wrap granularity, fewer/larger "
                  "collectives (the per-kind table says which)")
    else:
        action = ("Overlap communication with compute: larger DDP buckets (bucket_cap_mb) or gradient accumulation to "
                  "all-reduce less often, fewer/larger collectives (the per-kind table says which)")
    return [
        Finding(
            kind="communication_bound",
            severity=mean,
            title="Communication-bound",
            ranks=[r.rank for r in hit],
            evidence=(
                f"{what}, the collectives themselves and not a wait for a late peer, for {mean:.1f}% of step time "
                f"on average (rank {worst.rank}: {transfer[worst.rank]:.1f}%, median "
                f"{verdicts[worst.rank].median_pct:.1f}%; threshold {options.comm_bound_pct:g}%)" + late
                + (f"; only {stats.mean(overlap):.1f}% of communication overlaps computation" if overlap else "")
                + _kind_split(worst)
            ),
            recommendation=action + ".",
            numbers={"transfer_pct": mean, "worst_rank_transfer_pct": transfer[worst.rank],
                     "exposed_comm_pct": exposed, "worst_rank_exposed_comm_pct": worst.exposed_comm_pct},
            confidence=min(verdicts[r.rank].confidence for r in hit),
            phase="communication",
            why=(f"the collectives themselves, waits for late peers left out, are {mean:.1f}% of the step on average "
                 f"(exposed in all: {exposed:.1f}%)"),
            action=action,
            steps=verdicts[worst.rank].steps,
        )
    ]


def _waiting_for_peers(ranks: list[RankResult], cross: CrossRankResult, options: AnalysisOptions) -> list[Finding]:
    """Ranks that wait for late peers for more than ``comm_bound_pct`` of the step (median over steps, in most
    steps) when the run is too short for a slow-rank verdict: the time is the ranks' skew, not the network, and no
    finding would otherwise say where a large share of the step goes. A raised verdict's finding carries the waits;
    verdicts that judged enough steps and name nobody say the waits are the run's own noise (on a busy host a clean
    run's ranks wait for each other in turn)."""
    verdicts = [v for v in (cross.straggler_verdict, cross.imbalance_verdict) if v is not None]
    if any(v.raised for v in verdicts) or not any(v.status == UNDECIDED for v in verdicts):
        return []
    shares = {r.rank: comm.wait_pct_per_step(r) for r in ranks}
    judged = {rank: judge_share(pct, options.comm_bound_pct, "waiting for late peers") for rank, pct in shares.items()}
    hit = sorted(rank for rank, v in judged.items() if v.raised)
    if not hit:
        return []
    mean = stats.mean([stats.mean(pct) for pct in shares.values()])
    worst = max(hit, key=lambda rank: judged[rank].median_pct)
    peers = next(r for r in ranks if r.rank == worst).waits_by_peer()
    by_peer = sorted(((sum(kinds.values()), p) for p, kinds in peers.items()), reverse=True)
    whom = ", ".join(f"rank {p} {pct:.1f}%" for pct, p in by_peer[:3])
    n = judged[worst].steps
    why = (f"the ranks wait at collectives for a peer that arrives later for {mean:.1f}% of step time on average "
           f"(rank {worst}: {judged[worst].median_pct:.1f}%, median over {n} step{'s' if n != 1 else ''}; "
           f"threshold {options.comm_bound_pct:g}%)")
    action = ("This is the ranks' skew, not the network: compare the late ranks' steps with a peer's in the merged "
              "trace (hf-distprof merge), trace more steps (or keep the step timer on) so that the verdicts can "
              "name a rank, and give every rank the same work")
    return [
        Finding(
            kind="waiting_for_peers",
            severity=mean,
            title="Ranks wait for late peers",
            ranks=hit,
            evidence=(
                f"{why}; rank {worst} waits for {whom} of its step; no verdict names a slow rank (see the straggler "
                "and imbalance verdicts)"
            ),
            recommendation=action + ".",
            phase="communication",
            why=why,
            action=action,
            steps=n,
            numbers={"wait_pct": mean, "worst_rank_wait_pct": judged[worst].median_pct},
            confidence=min(judged[rank].confidence for rank in hit),
        )
    ]


def _waits_left_out(rank: RankResult, transfer_pct: float) -> str:
    """"; of rank 0's 53.1% exposed, 10.0% is a wait for a late peer (rank 1), left out" when it waits at all."""
    waited = rank.exposed_comm_pct - transfer_pct
    peers = sorted({p for row in rank.comm_by_kind for p in row.waited_for})
    if waited < 0.05 or not peers:
        return ""
    return (f"; of rank {rank.rank}'s {rank.exposed_comm_pct:.1f}% exposed, {waited:.1f}% is a wait for a late peer "
            f"(rank{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))}), left out")


def _kind_split(rank: RankResult) -> str:
    """"; exposed by kind on rank R: all_gather 9.8% (of which 7.0% waiting), ..." for a rank with collectives."""
    parts = [f"{row.kind} {row.exposed_pct:.1f}%" + (f" ({row.wait_pct:.1f}% waiting)" if row.wait_pct >= 0.05 else "")
             for row in rank.comm_by_kind if row.exposed_us > 0]
    return f"; exposed by kind on rank {rank.rank} (% of the step): {', '.join(parts)}" if parts else ""


def _fsdp_rows(ranks: list[RankResult], kind: str, options: AnalysisOptions) -> list[tuple[RankResult, CommKindStat]]:
    """(rank, its row of ``kind``) for the FSDP ranks whose exposed share of ``kind`` crosses the threshold."""
    hit = []
    for r in ranks:
        if not _is_fsdp(r):
            continue  # no FSDP annotation: these collectives are not FSDP's to tune
        row = next((row for row in r.comm_by_kind if row.kind == kind), None)
        if row is not None and row.exposed_pct_median > options.fsdp_exposed_pct:
            hit.append((r, row))
    return hit


def _steps_above(rank: RankResult, kind: str, threshold_pct: float) -> float:
    """Share of the rank's steps in which the exposed time of ``kind`` is above ``threshold_pct`` of the step."""
    exposed: dict[int, float] = {}
    for c in rank.collectives:
        if c.kind == kind:
            for start, end, step in c.exposed_share:  # shares: overlapping collectives do not count a moment twice
                exposed[step] = exposed.get(step, 0.0) + end - start
    steps = [s for s in rank.steps if s.duration_us > 0]
    above = sum(100.0 * exposed.get(s.step, 0.0) / s.duration_us > threshold_pct for s in steps)
    return above / len(steps) if steps else 0.0


def _is_fsdp(rank: RankResult) -> bool:
    """Whether FSDP issued some of the rank's collectives (its annotations name their unit)."""
    return any(c.module is not None for c in rank.collectives)


def _worst_unit(rank: RankResult, kind: str) -> str:
    """The FSDP unit whose collectives of ``kind`` are the most exposed on ``rank``, as text."""
    per: dict[tuple[str, str | None], float] = {}
    for c in rank.collectives:
        if c.kind == kind and c.module is not None:
            per[(c.module, c.phase)] = per.get((c.module, c.phase), 0.0) + c.exposed_share_us
    if not per:
        return ""
    (module, phase), exposed = max(per.items(), key=lambda kv: kv[1])
    where = f"{phase}, " if phase else ""
    return f"; most exposed unit: {module or '(root)'} ({where}{exposed / len(rank.steps) / 1e3:.2f} ms per step)"


def _cpu_note(rank: RankResult) -> str:
    return (
        " On CPU (gloo) the training thread waits for each collective, so nothing hides it: there the "
        "levers are fewer and smaller collectives."
        if rank.device == "cpu"
        else ""
    )


def _fsdp_exposed(ranks: list[RankResult], kind: str, options: AnalysisOptions) -> list[Finding]:
    """FSDP's all-gathers (or reduce-scatters) exposed above ``fsdp_exposed_pct`` of the step: where they are exposed
    (forward or backward, the worst unit) and what FSDP setting hides them."""
    hit = _fsdp_rows(ranks, kind, options)
    if not hit:
        return []
    worst, row = max(hit, key=lambda h: h[1].exposed_pct_median)
    median_over = f"median over {len(worst.steps)} steps; threshold {options.fsdp_exposed_pct:g}%"
    numbers = {"exposed_us": row.exposed_us, "exposed_pct": row.exposed_pct_median}
    if kind == "all_gather":
        backward = row.backward_exposed_us > row.forward_exposed_us
        title = "Exposed FSDP all-gather" + (" in backward" if backward else " before forward")
        why = (f"on rank {worst.rank} the training waits {row.exposed_us / 1e3:.2f} ms per step for all-gathers, "
               f"{row.exposed_pct_median:.1f}% of the step ({median_over}): {row.forward_exposed_us / 1e3:.2f} ms in "
               f"forward, {row.backward_exposed_us / 1e3:.2f} ms in backward, of {row.time_us / 1e3:.2f} ms of "
               f"all-gather in {row.count_per_step:g} calls ({row.overlap_pct or 0.0:.1f}% hidden)")
        if backward:
            action = ("Most of it is in backward, re-gathering the parameters that forward freed: keep them instead "
                      "(--fsdp-reshard-after-forward false; fully_shard(reshard_after_forward=False); FSDP1 "
                      "SHARD_GRAD_OP), for every unit or only the last ones, trading memory for those all-gathers")
            more = "; FSDP1: backward_prefetch=BACKWARD_PRE."
        else:
            action = ("Most of it is before forward: prefetch further ahead (FSDP2 gathers one unit ahead; "
                      "unit.set_modules_to_forward_prefetch([next units]); FSDP1 forward_prefetch=True), and check the "
                      "wrap granularity: many small units make latency-bound all-gathers (wrap coarser), one huge "
                      "unit cannot hide behind its predecessor's compute (wrap finer)")
            more = "."
        numbers.update(forward_exposed_us=row.forward_exposed_us, backward_exposed_us=row.backward_exposed_us)
        phase = "backward" if backward else "forward"
    else:
        title = "Reduce-scatter not overlapped with backward"
        why = (f"on rank {worst.rank} {row.time_us / 1e3:.2f} ms of reduce-scatter per step "
               f"({row.count_per_step:g} calls), {row.overlap_pct or 0.0:.1f}% of it hidden behind backward "
               f"computation: {row.exposed_us / 1e3:.2f} ms exposed, {row.exposed_pct_median:.1f}% of the step "
               f"({median_over})")
        action = ("A unit's reduce-scatter can only hide behind the backward of the units before it, so the last "
                  "one (the root's) is always exposed: keep the root unit small and wrap finer")
        more = ("; with gradient accumulation skip it on all but the last micro-batch "
                "(set_requires_gradient_sync(False)); reduce in bf16 "
                "(MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)) to halve the bytes.")
        phase = "backward"
    numbers["time_us"] = row.time_us
    return [
        Finding(
            kind=f"fsdp_exposed_{kind}",
            severity=row.exposed_pct_median,
            title=title,
            ranks=[r.rank for r, _ in hit],
            evidence=why + _worst_unit(worst, kind),
            recommendation=action + more + _cpu_note(worst),
            numbers=numbers,
            confidence=_steps_above(worst, kind, options.fsdp_exposed_pct),
            phase=phase,
            why=why,
            action=action,
            steps=len(worst.steps),
        )
    ]


def _stragglers(cross: CrossRankResult) -> list[Finding]:
    out = []
    step = stats.mean([p.mean_step_us for p in cross.per_rank])
    for s in cross.stragglers:
        if s.reason == "late_collectives" and s.lateness_us is not None:
            severity = 100.0 * s.lateness_us / step if step else 0.0
            action = (
                f"Look at what rank {s.rank} does before its first collective that its peers do not: "
                "uneven data (sequence lengths, batch sizes), extra work on that rank (logging, eval, "
                "checkpointing), a slower device or a busy host"
            )
            more = (". Open the merged trace (hf-distprof merge) and compare the forward/backward of that rank with a "
                    "peer.")
        else:
            severity = s.step_excess_pct or 0.0
            action, more = "Compare this rank's step with a peer's in the merged trace", "; check its host and device."
        verdict = cross.straggler_verdict
        out.append(
            Finding(
                kind="straggler",
                severity=severity,
                title=f"Straggler: rank {s.rank}",
                ranks=[s.rank],
                evidence=s.evidence,
                recommendation=action + more,
                why=s.summary,
                action=action,
                basis=_basis(verdict) if s.reason == "late_collectives" else TRACE,
                steps=verdict.steps if verdict is not None and s.reason == "late_collectives" else None,
                numbers={
                    k: v
                    for k, v in (("lateness_us", s.lateness_us), ("step_excess_pct", s.step_excess_pct))
                    if v is not None
                },
                confidence=s.confidence,
            )
        )
    return out


def _imbalance(cross: CrossRankResult, options: AnalysisOptions) -> list[Finding]:
    verdict = cross.imbalance_verdict
    if verdict is None or not verdict.raised:
        return []
    busiest = next(p for p in cross.per_rank if p.rank == verdict.rank)
    others = sorted(p.busy_us for p in cross.per_rank if p.rank != busiest.rank)
    typical = others[len(others) // 2]
    step = stats.mean([p.mean_step_us for p in cross.per_rank])
    why = (f"busy time (GPU: compute kernels; CPU: compute + data loading): rank {busiest.rank} "
           f"{busiest.busy_us / 1e3:.2f} ms per step vs {typical / 1e3:.2f} ms on a typical peer")
    action = ("Give every rank the same amount of work: pack or bucket sequences by length, drop uneven "
              "last batches, shard evenly")
    return [
        Finding(
            kind="imbalance",
            severity=100.0 * (busiest.busy_us - typical) / step if step else 0.0,
            title="Load imbalance across ranks",
            ranks=[busiest.rank],
            evidence=f"{why}; {verdict.reason}",
            recommendation=action + "; the other ranks idle in collectives until the busiest finishes.",
            phase="compute",
            why=why,
            action=action,
            basis=_basis(verdict),
            steps=verdict.steps,
            numbers={
                "imbalance_pct": verdict.effect_pct,
                "max_busy_us": busiest.busy_us,
                "typical_busy_us": typical,
                "slowest_in_steps": verdict.slowest_in,
                "steps": verdict.steps,
            },
            confidence=verdict.confidence,
        )
    ]


def _low_utilisation(ranks: list[RankResult], options: AnalysisOptions) -> list[Finding]:
    # Low utilisation is a GPU idle share above 100 - low_util_pct, in most steps (the shared share rule).
    verdicts = {
        r.rank: judge_share([s.gpu.idle_pct for s in r.steps if s.gpu], 100.0 - options.low_util_pct, "GPU idle")
        for r in ranks
        if r.device == "gpu"
    }
    util = {rank: 100.0 - v.median_pct for rank, v in verdicts.items()}
    low = {rank: util[rank] for rank, v in verdicts.items() if v.raised}
    if not low:
        return []
    mean = stats.mean(list(low.values()))
    confidence = min(verdicts[rank].confidence for rank in low)
    why = (f"the GPU is busy for {mean:.1f}% of its step span (median over steps) on {len(low)} of {len(util)} ranks "
           f"(lowest: rank {min(low, key=low.__getitem__)} at {min(low.values()):.1f}%; threshold "
           f"{options.low_util_pct:g}%)")
    action = ("The GPU waits for the host: look for CPU work, synchronisations (.item(), .cpu(), printing "
              "tensors) and data loading between kernels")
    return [
        Finding(
            kind="low_utilisation",
            severity=100.0 - mean,
            title="Low GPU utilisation",
            ranks=sorted(low),
            evidence=why,
            recommendation=action + "; increase the batch size or use CUDA graphs.",
            phase="compute",
            why=why,
            action=action,
            steps=max(v.steps for v in verdicts.values()),
            numbers={"gpu_busy_pct": mean},
            confidence=confidence,
        )
    ]


def _launch_bound(ranks: list[RankResult], options: AnalysisOptions) -> list[Finding]:
    hit = []
    for r in ranks:
        gpu = [s.gpu for s in r.steps if s.gpu]
        n = sum(g.n_kernels for g in gpu)
        if not n:
            continue
        tiny = 100.0 * sum(g.n_tiny_kernels for g in gpu) / n
        idle = judge_share([g.idle_pct for g in gpu], 100.0 - options.low_util_pct, "GPU idle")
        if tiny >= options.launch_bound_tiny_pct and idle.raised:
            hit.append((r.rank, tiny, idle.median_pct, n / len(gpu), idle.confidence))
    if not hit:
        return []
    tiny = stats.mean([h[1] for h in hit])
    idle = stats.mean([h[2] for h in hit])
    per_step = stats.mean([h[3] for h in hit])
    why = (f"{tiny:.0f}% of the {per_step:.0f} kernels per step run under {options.tiny_kernel_us:g} us "
           f"while the GPU idles {idle:.1f}% of the step")
    action = ("Fuse small ops (torch.compile, fused optimizers foreach=True/fused=True, fused layer norms), "
              "use CUDA graphs, or raise the batch size so each kernel does more work")
    return [
        Finding(
            kind="launch_bound",
            severity=idle / 2,
            title="Launch-bound: many tiny kernels",
            ranks=[h[0] for h in hit],
            evidence=why,
            recommendation=action + ".",
            phase="compute",
            why=why,
            action=action,
            numbers={"tiny_kernel_pct": tiny, "gpu_idle_pct": idle, "kernels_per_step": per_step},
            confidence=min(h[4] for h in hit),
        )
    ]


def _data_loading(ranks: list[RankResult], options: AnalysisOptions) -> list[Finding]:
    verdicts = {
        r.rank: judge_share([s.cpu.pct(s.cpu.data_loading_us) for s in r.steps], options.data_loading_pct,
                            "fetching the next batch")
        for r in ranks
    }
    hit = {rank: v.median_pct for rank, v in verdicts.items() if v.raised}
    if not hit:
        return []
    mean = stats.mean(list(hit.values()))
    why = (f"fetching the next batch takes {mean:.1f}% of step time (median over steps) on {len(hit)} of "
           f"{len(verdicts)} ranks, above the {options.data_loading_pct:g}% threshold in most steps")
    pin = "pin_memory=True, " if any(r.device == "gpu" for r in ranks) else ""  # pinned memory helps copies to a GPU
    action = f"Load data ahead of the step: DataLoader num_workers > 0, {pin}persistent_workers=True, prefetch_factor"
    return [
        Finding(
            kind="data_loading_bound",
            severity=mean,
            title="Data-loading bound",
            ranks=sorted(hit),
            evidence=why,
            recommendation=action + "; pre-tokenise the dataset instead of tokenising in __getitem__.",
            phase="data",
            why=why,
            action=action,
            steps=max(v.steps for v in verdicts.values()),
            numbers={"data_loading_pct": mean},
            confidence=min(verdicts[rank].confidence for rank in hit),
        )
    ]
