"""The findings' words, written once, last (pure): each judgement's facts into its title, its one-sentence ``why``
and ``action``, and the rest of its evidence and of what to try.

A finding has one prose pair: ``why`` (the measurement that makes it a finding, what the box shows) and ``action``
(the first thing to try). Its ``evidence`` is ``why`` followed by every other figure the verdict rests on, its
``recommendation`` is ``action`` followed by the rest: the long forms extend the short ones, so they cannot diverge.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_distprof.analysis.results.facts import (BurstFacts, ChainFacts, CommAdvice, CommBoundFacts, DataLoadingFacts,
                                                 EnteredLate,
                                                 FixFirstFacts, FsdpFacts, ImbalanceFacts, Judged, LaunchBoundFacts,
                                                 LowUtilFacts, MemoryFacts, PeerWaits, Question, QuietSlowdown,
                                                 RunSlowFacts, SlowdownFacts, SlowResumeFacts, StragglerFacts,
                                                 WaitingFacts, WindowFacts)
from hf_distprof.analysis.results.findings import STEP_TIMER, TRACE_AND_TIMER, Finding, Judgement, Undecided, WindowNote
from hf_distprof.analysis.results.whatif import WhatIfModel, WhatIfScenario
from hf_distprof.analysis.tell.unread import unread_words
from hf_distprof.core.advice import PHASE_NAMES, load_ahead, phase_advice
from hf_distprof.core.cause import Attribution, cause_action, cause_title, cause_why
from hf_distprof.core.overhead import left_out_words
from hf_distprof.core.text import SHOWN_PCT, apart, calls, format_bytes, step_base


@dataclass
class Prose:
    """A finding's words: its title, the pair (``why``, ``action``) and what extends each."""

    title: str
    why: str
    details: str
    """Appended to ``why`` to make the evidence."""
    action: str
    more: str
    """Appended to ``action`` to make the recommendation."""


def write(j: Judgement) -> Finding:
    """The finding of one judgement, with its words."""
    words = _WRITERS[type(j.facts)](j)
    return Finding(kind=j.kind, severity=j.severity, title=words.title, ranks=j.ranks,
                   evidence=words.why + words.details, recommendation=words.action + words.more, numbers=j.numbers,
                   confidence=j.confidence, phase=j.phase, why=words.why, action=words.action, basis=j.basis,
                   steps=j.steps, cause=j.cause, more_work_too=j.more_work_too)


def write_all(judged: Judged) -> tuple[list[Finding], list[Undecided], list[WindowNote], str | None]:
    """Every finding, undecided question and window note of the run, and the profiler's slowdown when it raised no
    finding, in words."""
    quiet = judged.quiet_slowdown
    return ([write(j) for j in judged.findings], [undecided(q) for q in judged.questions],
            [window_note(w) for w in judged.windows], slowdown_line(quiet) if quiet is not None else None)


def slowdown_line(q: QuietSlowdown) -> str | None:
    """The profiler's slowdown that raised no finding, in one line ("Profiler slowdown: the 5 steps under the profiler
    ... 1.02x the 40 untraced steps after the window's start ..., within the run's own noise of 3.1%"), or why not."""
    if q.ratio is None:
        return f"Profiler slowdown: {q.note}" if q.note is not None else None
    left_out = f" (the {q.steps_before} before it left out: a run's first steps run slower)" if q.steps_before else ""
    around = (f"the {q.steps_after} untraced steps after the window's start{left_out}" if q.noise_pct is not None
              else "the other steps")  # older summaries have no noise (and compared with every other step)
    within = ("" if q.noise_pct is None else f", within the run's own noise of {q.noise_pct:.1f}%" if q.within_noise
              else f" (the run's own noise {q.noise_pct:.1f}%)")
    traced = (f"the {q.steps_inside} steps under the profiler (its warm-up and recorded steps"
              f"{left_out_words(q.steps_left_out)})" if q.steps_inside is not None else "traced steps")
    against = (f": above the {q.threshold_ratio:g}x threshold, but no slowdown the run can tell from its noise"
               if q.noise_only else f"; below {q.threshold_ratio:g}x" if q.below_threshold
               else f"; threshold {q.threshold_ratio:g}x")
    return f"Profiler slowdown: {traced} {apart(q.ratio, q.threshold_ratio)}x {around}{within}{against}"


def _ms_of(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _steps(w: PeerWaits) -> str:
    """What the waiting ranks' % are of: their steps' GPU spans (GPU traces), else their steps."""
    return "steps' GPU spans" if w.gpu else "step"


def waits_sentence(w: PeerWaits) -> str:
    """"rank 0 waits 55.7% of its step at all_gather and 6.7% at all_reduce for rank 1" (the peer that waits most,
    and how many others do)."""
    its_step = "its step's GPU span" if w.gpu else "its step"
    parts = [f"{pct:.1f}% of {its_step} at {kind}" if i == 0 else f"{pct:.1f}% at {kind}"
             for i, (kind, pct) in enumerate(w.kinds) if pct >= SHOWN_PCT]
    text = f"rank {w.worst} waits {' and '.join(parts)} for rank {w.slow}"
    if w.others:
        low, high = f"{min(w.others):.1f}", f"{max(w.others):.1f}"
        spread = low if low == high else f"{low}-{high}"
        text += f"; {len(w.others)} other rank{'s' if len(w.others) > 1 else ''} wait {spread}%"
    return text


def _comm_bound(j: Judgement) -> Prose:
    f: CommBoundFacts = j.facts
    what = "communication kernels run with no computation" if f.gpu else "the training thread waits on collectives"
    late = "".join(
        f"; of rank {s.rank}'s {s.exposed_pct:.1f}% exposed, {s.waited_pct:.1f}% is a wait for a late peer "
        f"(rank{'s' if len(s.peers) > 1 else ''} {', '.join(map(str, s.peers))}), left out" for s in f.late)
    split = [f"{kind} {exposed:.1f}%" + (f" ({wait:.1f}% waiting)" if wait >= SHOWN_PCT else "")
             for kind, exposed, wait in f.kind_split]
    if f.advice is CommAdvice.FSDP_FINDINGS:
        action = "FSDP's all-gathers and reduce-scatters: see the FSDP findings for which and where"
    elif f.advice is CommAdvice.FSDP:
        action = ("Overlap communication with compute: FSDP prefetching and wrap granularity, fewer/larger "
                  "collectives (the per-kind table says which)")
    else:
        action = ("Overlap communication with compute: larger DDP buckets (bucket_cap_mb) or gradient accumulation to "
                  "all-reduce less often, fewer/larger collectives (the per-kind table says which)")
    resumed = ("; the time in collectives after they completed (threads resuming late), left out: "
               + ", ".join(f"rank {rank} {pct:.1f}%" for rank, pct in f.resumed_late)) if f.resumed_late else ""
    return Prose(
        title="Communication-bound",
        # What was judged first (the worst rank's median against the threshold), then the ranks' mean: a mean under
        # the threshold said first read as contradicting the finding.
        why=(f"the collectives themselves, waits for late peers and time past completion left out, are "
             f"{f.worst_median_pct:.1f}% of {step_base(f.gpu)} on rank {f.worst} (its median over the steps; threshold "
             f"{f.threshold_pct:g}%), {f.mean_pct:.1f}% on average over the ranks (exposed in all: "
             f"{f.exposed_pct:.1f}%)"),
        details=(f"; on rank {f.worst}, {f.worst_pct:.1f}% on average, {what}" + late + resumed
                 + (f"; only {f.overlap_pct:.1f}% of communication overlaps computation" if f.overlap_pct is not None
                    else "")
                 + (f"; exposed by kind on rank {f.worst} (% of {step_base(f.gpu)}): {', '.join(split)}" if split
                    else "")),
        action=action,
        more=".",
    )


def _slow_resume(j: Judgement) -> Prose:
    f: SlowResumeFacts = j.facts
    base = step_base(f.gpu)
    parts = []
    for x in f.ranks:
        text = f"rank {x.rank} {x.mean_pct:.1f}% of {base} (median {x.median_pct:.1f}%)"
        if x.cpu_wait_ms is not None and x.cpu_wait_pct is not None:
            text += (f", and the step timer saw it wait for a CPU {x.cpu_wait_ms:.1f} ms per traced step "
                     f"({x.cpu_wait_pct:.1f}% of the step, the run queue)")
        parts.append(text)
    cpu = [x.rank for x in f.ranks if x.cpu_bound]
    measured = any(x.cpu_wait_ms is not None for x in f.ranks)
    if cpu:
        who = "rank" + ("s " if len(cpu) > 1 else " ") + ", ".join(map(str, cpu))
        why = f": {who} waited for a CPU: its host runs more threads than cores"
        action = ("Keep ranks x intra-op threads at or under the host's cores (OMP_NUM_THREADS, "
                  "torch.set_num_threads), with fewer data-loader workers or other work on the host")
    elif f.gpu:
        why = ": the host thread had not run again yet"
        action = ("Look for other processes or data-loader workers on its cores, and bind each rank to its own cores "
                  "(NUMA / CPU affinity)")
    else:
        why = ": the thread had not run again yet" + (
            "; the step timer's run-queue readings do not show a CPU wait of that size" if measured else "")
        action = ("Look for what else runs on its host: other processes, data-loader workers, intra-op threads "
                  "against the cores (OMP_NUM_THREADS)")
    return Prose(
        title="Slow to resume after collectives",
        why=(f"ranks stay in their collectives after these completed on a peer: {'; '.join(parts)} (threshold "
             f"{f.threshold_pct:g}%)"),
        details=why + "; this is neither the transfer nor a wait for a late peer",
        action=action,
        more="; overlapping communication or a faster network will not shorten it.",
    )


def entered_late_sentence(late: list[EnteredLate]) -> str:
    """Where late ranks' lateness arose: before the step began ("rank 7's lateness at the collectives, 7.62 ms, arose
    before it began the step (7.53 ms of it), not in its work in the step")."""

    def listed(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    one = len(late) == 1
    lags = listed([f"{e.start_lag_us / 1e3:.2f}" for e in late])
    lateness = listed([f"{e.lateness_us / 1e3:.2f}" for e in late])
    who = f"rank {late[0].rank}'s lateness" if one else f"the lateness of ranks {listed([str(e.rank) for e in late])}"
    return (f"{who} at the collectives, {lateness} ms, arose before {'it' if one else 'they'} began the step "
            f"({lags} ms of it, against {'its' if one else 'their'} peers' time from their step's start), not in "
            f"{'its' if one else 'their'} work in the step")


_BETWEEN_STEPS = ("what runs after a step's last collective and before the next step begins: gradient clipping, the "
                  "optimizer step, the learning-rate scheduler, zero_grad, the step-end callbacks before the "
                  "profiler's, or in your own loop what comes before prof.step()")


def _waiting(j: Judgement) -> Prose:
    f: WaitingFacts = j.facts
    whom = ", ".join(f"rank {p} {pct:.1f}%" for p, pct in f.whom)
    its_step = "its step's GPU span" if f.gpu else "its step"
    late = f"; {entered_late_sentence(f.entered_late)}" if f.entered_late else ""
    look = (f"look at what the late ranks do between steps that their peers do not ({_BETWEEN_STEPS}) in the merged "
            "trace (hf-distprof merge)" if f.all_entered_late else
            "compare the late ranks' steps with a peer's in the merged trace (hf-distprof merge)")
    return Prose(
        title="Ranks wait for late peers",
        why=(f"the ranks wait at collectives for a peer that arrives later: rank {f.worst} for "
             f"{f.worst_median_pct:.1f}% of {step_base(f.gpu)} (its median over {f.steps} "
             f"step{'s' if f.steps != 1 else ''}; threshold {f.threshold_pct:g}%), "
             f"{f'all {f.of_ranks} ranks' if f.of_ranks > 2 else 'the ranks'} for {f.mean_pct:.1f}% on average"),
        details=(f"; rank {f.worst} waits for {whom} of {its_step}{late}; no verdict names a slow rank (see the "
                 "straggler and imbalance verdicts)"),
        action=(f"This is the ranks' skew, not the network: {look}, trace more steps (or keep the step timer on) so "
                "that the verdicts can name a rank, and give every rank the same work"),
        more=".",
    )


def _fsdp(j: Judgement) -> Prose:
    f: FsdpFacts = j.facts
    row = f.row
    median_over = f"median over {f.steps} steps; threshold {f.threshold_pct:g}%"
    if f.kind == "all_gather":
        title = "Exposed FSDP all-gather" + (" in backward" if f.backward else " before forward")
        why = (f"on rank {f.rank} the training waits {row.exposed_us / 1e3:.2f} ms per step for all-gathers, "
               f"{row.exposed_pct_median:.1f}% of the step ({median_over}): {row.forward_exposed_us / 1e3:.2f} ms in "
               f"forward, {row.backward_exposed_us / 1e3:.2f} ms in backward, of {row.time_us / 1e3:.2f} ms of "
               f"all-gather in {calls(row.count_per_step)} ({row.overlap_pct or 0.0:.1f}% hidden)")
        if f.backward:
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
    else:
        title = "Reduce-scatter not overlapped with backward"
        why = (f"on rank {f.rank} {row.time_us / 1e3:.2f} ms of reduce-scatter per step "
               f"({row.count_per_step:g} calls), {row.overlap_pct or 0.0:.1f}% of it hidden behind backward "
               f"computation: {row.exposed_us / 1e3:.2f} ms exposed, {row.exposed_pct_median:.1f}% of the step "
               f"({median_over})")
        action = ("A unit's reduce-scatter can only hide behind the backward of the units before it, so the last "
                  "one (the root's) is always exposed: keep the root unit small and wrap finer")
        more = ("; with gradient accumulation skip it on all but the last micro-batch "
                "(set_requires_gradient_sync(False)); reduce in bf16 "
                "(MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)) to halve the bytes.")
    unit = ""
    if f.unit is not None:
        module, phase, ms = f.unit
        unit = f"; most exposed unit: {module or '(root)'} ({f'{phase}, ' if phase else ''}{ms:.2f} ms per step)"
    cpu = (" On CPU (gloo) the training thread waits for each collective, so nothing hides it: there the levers are "
           "fewer and smaller collectives." if f.cpu else "")
    return Prose(title=title, why=why, details=unit, action=action, more=more + cpu)


def _why_named(f: StragglerFacts) -> str:
    """Why the straggler verdict names the rank: the arrival order in the window, weighed with the step timer's
    untraced steps, or the step timer's own verdict over the run."""
    v = f.verdict
    if f.named_with is not None:
        text = f"late together with rank {f.named_with}, standing out from the other ranks"
    elif f.basis == STEP_TIMER:
        text = (f"the step timer names it over the run's {v.steps} untraced steps: slowest in {v.slowest_in} of "
                f"{v.steps} (p = {v.p_value:.3f} by chance)")
    elif f.basis == TRACE_AND_TIMER:
        text = (f"it is the last to arrive in {v.slowest_in} of {v.steps} steps (p = {v.p_value:.3f} by chance, with "
                "the step timer's untraced steps)")
    else:
        text = f"it is the last to arrive in {v.slowest_in} of {v.steps} steps (p = {v.p_value:.3f} by chance)"
    return f"{text}, beyond the step-to-step noise of {v.noise_pct:.1f}%"


def _straggler(j: Judgement) -> Prose:
    f: StragglerFacts = j.facts
    s = f.straggler
    waits = f"; {waits_sentence(f.waits)}" if f.waits is not None else ""
    if f.late:
        assert s.lateness_us is not None
        why = (f"rank {s.rank} reaches a collective of each step {s.lateness_us / 1e3:.2f} ms after the earliest rank "
               f"(its latest arrival per step, median over steps; {f.matched} matched collectives; "
               f"{f.lateness_pct:.1f}% of the {s.step_us / 1e3:.2f} ms step)")
        unseen = (", which the traced window does not show (there this rank waited longer than its peers): the "
                  "run's untraced steps carry the verdict") if f.window_disagrees else ""
        late = f"; {entered_late_sentence([f.entered_late])}" if f.entered_late is not None else ""
        action = (f"Look at what rank {s.rank} does between steps that its peers do not ({_BETWEEN_STEPS}), or a "
                  "slower host" if f.entered_late is not None else
                  f"Look at what rank {s.rank} does before its first collective that its peers do not: uneven data "
                  "(sequence lengths, batch sizes), extra work on that rank (logging, eval, checkpointing), a slower "
                  "device or a busy host")
        return Prose(
            title=f"Straggler: rank {s.rank}",
            why=why,
            details=(f"; its exposed communication is {s.comm_wait_us / 1e3:.2f} ms per step against its peers' "
                     f"{s.peer_wait_us / 1e3:.2f} ms{late}; {_why_named(f)}{unseen}{waits}"),
            action=action,
            more=(". Open the merged trace (hf-distprof merge) and compare the end of that rank's previous step with a "
                  "peer's (trace more steps to see it)." if f.entered_late is not None else
                  ". Open the merged trace (hf-distprof merge) and compare the forward/backward of that rank with a "
                  "peer."),
        )
    return Prose(
        title=f"Straggler: rank {s.rank}",
        why=(f"rank {s.rank}'s steps take {s.mean_step_us / 1e3:.2f} ms, {s.step_excess_pct or 0.0:.1f}% more than the "
             f"median rank's {s.step_us / 1e3:.2f} ms and more than 3 scaled median absolute deviations "
             f"({s.spread_us / 1e3:.2f} ms) from it across the {f.verdict.ranks} ranks"),
        details=waits,
        action="Compare this rank's step with a peer's in the merged trace",
        more="; check its host and device.",
    )


def _imbalance(j: Judgement) -> Prose:
    f: ImbalanceFacts = j.facts
    return Prose(
        title="Load imbalance across ranks",
        why=(f"busy time (GPU: compute kernels; CPU: compute + data loading): rank {f.rank} "
             f"{f.busy_us / 1e3:.2f} ms per step vs {f.typical_us / 1e3:.2f} ms on a typical peer"),
        details=f"; {f.verdict.reason}" + (f"; {waits_sentence(f.waits)}" if f.waits is not None else ""),
        action=("Give every rank the same amount of work: pack or bucket sequences by length, drop uneven "
                "last batches, shard evenly"),
        more="; the other ranks idle in collectives until the busiest finishes.",
    )


def _low_util(j: Judgement) -> Prose:
    f: LowUtilFacts = j.facts
    return Prose(
        title="Low GPU utilisation",
        why=(f"the GPU runs a kernel (NCCL's included) {f.busy_pct:.1f}% of its step span on {f.low} of {f.ranks} "
             f"ranks (the mean of those ranks' medians over steps; lowest: rank {f.lowest} at {f.lowest_pct:.1f}%; "
             f"threshold {f.threshold_pct:g}%)"),
        details="",
        action=("The GPU waits for the host: look for CPU work, synchronisations (.item(), .cpu(), printing "
                "tensors) and data loading between kernels"),
        more="; increase the batch size or use CUDA graphs.",
    )


def _launch_bound(j: Judgement) -> Prose:
    f: LaunchBoundFacts = j.facts
    return Prose(
        title="Launch-bound: many tiny kernels",
        why=(f"{f.tiny_pct:.0f}% of the {f.kernels_per_step:.0f} kernels per step run under {f.tiny_kernel_us:g} us "
             f"while the GPU idles {f.idle_pct:.1f}% of the step (the mean of those ranks' medians over steps)"),
        details="",
        action=("Fuse small ops (torch.compile, fused optimizers foreach=True/fused=True, fused layer norms), "
                "use CUDA graphs, or raise the batch size so each kernel does more work"),
        more=".",
    )


def _data_loading(j: Judgement) -> Prose:
    f: DataLoadingFacts = j.facts
    return Prose(
        title="Data-loading bound",
        why=(f"fetching the next batch takes {f.pct:.1f}% of step time on {f.hit} of {f.ranks} ranks (the mean of "
             f"those ranks' medians over steps), above the {f.threshold_pct:g}% threshold in most steps"),
        details="",
        action=load_ahead(f.gpu, f.loader),  # (pinned memory helps copies to a GPU; what the run sets, left out)
        more="; pre-tokenise the dataset instead of tokenising in __getitem__.",
    )


def _memory(j: Judgement) -> Prose:
    f: MemoryFacts = j.facts
    allocators = ", ".join(f"{op.name} {format_bytes(op.allocated_bytes)}" for op in f.high.top_ops[:3])
    return Prose(
        title=f"Peak {f.kind} memory imbalance across ranks",
        why=(f"peak allocated memory over the traced steps ([memory] events): rank {f.rank} "
             f"{format_bytes(f.high.peak_allocated_bytes)} on {f.high.device} (step {f.high.peak_step}) vs "
             f"{format_bytes(f.typical_bytes)}, the median of the other ranks: {f.pct:.1f}% more "
             f"(threshold {f.threshold_pct:g}%)"),
        details=f"; its top allocators: {allocators}",
        action=("Look for work only that rank does (evaluation, logging, checkpoint saving on rank 0), "
                "uneven batch shapes (pad to a fixed length or group by length), or tensors kept alive on one rank"),
        more="; sharding optimizer state and gradients (FSDP) also evens memory out.",
    )


def _source(from_timer: bool, steps: int) -> str:
    """Where a phase's excess comes from, in words."""
    return (f"the step timer, the middle half of {steps} untraced steps" if from_timer
            else f"the traced window, the middle half of {steps} steps")


def _chain(j: Judgement) -> Prose:
    f: ChainFacts = j.facts
    name = PHASE_NAMES.get(f.phase.phase, f.phase.phase)
    late = ""
    if f.lateness_us is not None:
        late = (f", so it reaches each step's collectives {f.lateness_us / 1e3:.2f} ms "
                f"({f.lateness_pct:.1f}% of its {f.step_us / 1e3:.2f} ms step) after the earliest rank")
    up_to = "up to " if any(f"{o:.1f}" != f"{f.waits.pct:.1f}" for o in f.waits.others) else ""  # (the longest's)
    (first, verdict), *more = f.verdicts
    reasons = f"{first} verdict: {verdict.reason}" + "".join(f"; {other} verdict raised too: {v.claim}"
                                                             for other, v in more)
    data = (f"; data loading is {f.data_pct:.1f}% of rank {f.rank}'s step (median over the traced steps)"
            if f.data_pct is not None else "")
    if f.cause is not None:
        return _caused(f.rank, f.cause, f.gpu, phase_advice(f.phase.phase, f.gpu, f.loader),
                       f"its peers wait {up_to}{f.waits.pct:.1f}% of their {_steps(f.waits)} for it at the "
                       "collectives in the traced steps",
                       f"; its {name} exceeds its peers' by {f.phase.excess_us / 1e3:.2f} ms per step "
                       f"({_source(f.phase.from_timer, f.source_steps)}){late}, and the others wait for it there (from "
                       f"their arrival at the same collective to its, clocks aligned): {waits_sentence(f.waits)}"
                       f"{data}. {reasons}", _WAIT_NOT_NETWORK)
    action = f"Rank {f.rank}: {phase_advice(f.phase.phase, f.gpu, f.loader)}"
    return Prose(
        title=f"Rank {f.rank} holds the others back: its {name}",
        why=(f"{name} takes {f.phase.excess_us / 1e3:.1f} ms more per step than on its peers, who wait "
             f"{up_to}{f.waits.pct:.1f}% of their {_steps(f.waits)} for it at the collectives in the traced "
             "steps"),
        details=(f": rank {f.rank}'s {name} exceeds its peers' by {f.phase.excess_us / 1e3:.2f} ms per step "
                 f"({_source(f.phase.from_timer, f.source_steps)}){late}, and the others wait for it there (from their "
                 f"arrival at the same collective to its, clocks aligned): {waits_sentence(f.waits)}{data}. {reasons}"),
        action=action,
        more=_WAIT_NOT_NETWORK,
    )


_WAIT_NOT_NETWORK = (". The others' wait for it at the collectives is not the network: larger buckets or a faster "
                     "network will not shorten that part of their exposed communication.")


def _caused(rank: int, cause: Attribution, gpu: bool, advice: str, peers: str, details: str, more: str) -> Prose:
    """The slow rank's words when the step timer's records say why (:mod:`hf_distprof.core.cause`): the cause and its
    figures as the live warning says them, what its peers pay; ``details``: the rest of the evidence."""
    return Prose(
        title=f"Rank {rank} holds the others back: {cause_title(cause)}",
        why=f"{cause_why(cause)}; {peers}",
        details=details,
        action=f"Rank {rank}: {cause_action(cause, gpu, advice)}",
        more=more,
    )


def _run_slow(j: Judgement) -> Prose:
    f: RunSlowFacts = j.facts
    v = f.verdict
    if f.cause is not None:
        peers = (f"its peers wait {_ms_of(f.cause.excess_s)} per step for it over the run's {v.steps} untraced steps "
                 "(the step timer)")
        window = f"; in the traced window {waits_sentence(f.waits)}" if f.waits is not None else ""
        advice = phase_advice(f.advice_phase, f.gpu, f.loader)
        return _caused(f.rank, f.cause, f.gpu, advice, peers, f"{window}. {v.reason[:1].upper()}{v.reason[1:]}", ".")
    name = PHASE_NAMES.get(f.phase.phase, f.phase.phase) if f.phase is not None else ""
    most = (f"; most of it in its {name}: {f.phase.excess_us / 1e3:.2f} ms more per step than its peers' "
            f"({_source(f.phase.from_timer, f.phase.steps)})" if f.phase is not None else "")
    return Prose(
        title=f"Rank {f.rank} holds the others back" + (f": its {name}" if name else ""),
        why=(f"its own work exceeds its peers' by a median {v.effect_pct:.1f}% over the run's {v.steps} "
             f"untraced steps (the step timer; slowest in {v.slowest_in} of them)"),
        details=most + (f"; in the traced window {waits_sentence(f.waits)}" if f.waits is not None else "")
        + f". {v.reason[:1].upper()}{v.reason[1:]}",
        action=f"Rank {f.rank}: {phase_advice(f.advice_phase, f.gpu, f.loader)}",
        more=".",
    )


_ADVICE = {  # scenario -> (the first thing to try, the rest)
    "slow_rank": ("Find what rank {ranks} does that its peers do not (the critical path and the finding on rank "
                  "{ranks} say where): uneven data, extra work on that rank, a slower device or host", "."),
    "no_data_loading": ("{load}", "; pre-tokenise instead of tokenising per item."),
    "hide_communication": ("Overlap communication with computation ({overlap}) or send fewer bytes (bf16 reduction, "
                           "fewer and larger collectives)", "."),
    "fastest_pace": ("Give every rank the same work, at the pace of the fastest: balance the data (sequence "
                     "lengths, batch sizes), then look at the hosts and devices of the slower ranks", "."),
    "network_at_reference": ("The transfers run slower than bench-collectives measured on this fabric: check the "
                             "{library} settings and the network path of the collectives that take longest", "."),
}


def noise_of(model: WhatIfModel, noise_ms: float | None) -> str:
    """What a saving was held against, in words: the run's noise over its judged steps, or the traced steps'."""
    if model.run_noise_ms is not None:
        return f"step-to-step noise {model.run_noise_ms:.2f} ms over the run's {model.run_steps} judged steps"
    return (f"step-to-step noise {noise_ms or 0.0:.2f} ms, the smaller of the measured steps' "
            f"{model.noise_ms or 0.0:.2f} ms and the predicted ones'")


def over_the_run(scenario: WhatIfScenario, model: WhatIfModel) -> str:
    """"; over the run's N judged steps that pace saves X% ..." when the run's figure is the smaller one, else ""."""
    if not scenario.held_to_run:
        return ""
    return (f"; over the run's {model.run_steps} judged steps that pace saves {scenario.run_saving_pct:.1f}% of the "
            "step (the step timer's records), the figure that counts")


def _fix_first(j: Judgement) -> Prose:
    f: FixFirstFacts = j.facts
    top, model = f.top, f.model
    ranked = "; ".join(f"{s.title}: {s.step_ms_predicted:.2f} ms (-{s.saving_pct:.1f}%)"
                       if not s.held_to_run else f"{s.title}: -{s.counted_pct:.1f}% over the run"
                       for s in f.worth)
    action, more = _ADVICE[top.scenario]
    action = action.format(ranks=", ".join(map(str, top.ranks)), load=load_ahead(f.gpu, f.loader),
                           library="NCCL" if f.backend in (None, "nccl") else f.backend,
                           overlap="FSDP prefetching, wrap granularity" if f.fsdp else "DDP bucket_cap_mb, gradient "
                           "accumulation")
    return Prose(
        title=f"What to fix first: {top.title}",
        why=(f"replaying the {len(model.steps)} traced step(s) across ranks with {top.title} predicts "
             f"{top.step_ms_predicted:.2f} ms per step instead of the measured {top.step_ms_now:.2f} ms: "
             f"{top.saving_pct:.1f}% faster, {top.hours_per_1000_steps:.3f} h saved per 1,000 steps (model error "
             f"+-{top.error_ms:.2f} ms; {noise_of(model, top.noise_ms)}){over_the_run(top, model)}"),
        details=f". Above the {f.threshold_pct:g}% threshold and the noise, in order: {ranked}",
        action=action,
        more=more,
    )


def _slowdown(j: Judgement) -> Prose:
    f: SlowdownFacts = j.facts
    action = "Read the trace's absolute times with care and trust its shares more"
    return Prose(
        title="The profiler slows the traced steps",
        why=(f"the traced steps took {apart(f.ratio, f.threshold_ratio)}x as long as the run's other steps (threshold "
             f"{f.threshold_ratio:.2f}x)"),
        details=f": {f.warning}",
        action=action,
        more=("; leave a core free per traced rank (fewer ranks per host while it traces), or trace fewer steps."
              if f.cost == "cpu_wait" else
              "; profile with fewer options (--profiler-record-shapes false, no --profiler-with-stack / "
              "--profiler-profile-memory unless you need them) and see PROFILING_GUIDE.md for what each option "
              "costs."),
    )


def _burst(j: Judgement) -> Prose:
    b = j.facts.burst
    phase = {"data": "input pipeline (a slow file, a cache miss, a worker restarting)",
             "compute": "work there (longer sequences, a heavier batch) or what ran beside it on its host"}
    return Prose(
        title=f"Rank {b.rank}{' also' if b.beside == b.rank else ''} held the others back {b.what} ({b.span})",
        why=(f"its own work exceeded its peers' by {b.excess_s:.3f} s in all in {b.span}"
             f"{', beyond its usual excess' if b.usual_s > 0 else ''}, {b.pct:.1f}% of the run's "
             f"{b.run_s:.2f} s of judged steps; the others waited for it there"),
        details=f"{'; most of it in its ' + b.phase_name if b.phase else ''} (the step timer's records; {b.against})",
        action=f"Look at what rank {b.rank} did in {b.span}: its {phase.get(b.phase or '', 'step')}",
        more=("." if b.single else  # (its "once" says what --profile-on-anomaly does after one)
              "; --profile-on-anomaly opens a window a few steps after a stall: it records the next one if that comes "
              "while it records, not the one that opened it." if b.stalls else
              "; --profile-on-anomaly traces such a burst while it lasts."),
    )


_WRITERS = {
    CommBoundFacts: _comm_bound, WaitingFacts: _waiting, FsdpFacts: _fsdp, StragglerFacts: _straggler,
    ImbalanceFacts: _imbalance, LowUtilFacts: _low_util, LaunchBoundFacts: _launch_bound,
    DataLoadingFacts: _data_loading, MemoryFacts: _memory, ChainFacts: _chain, RunSlowFacts: _run_slow,
    FixFirstFacts: _fix_first, SlowdownFacts: _slowdown, SlowResumeFacts: _slow_resume, BurstFacts: _burst,
}


def undecided(q: Question) -> Undecided:
    """A question the run could not decide, in words."""
    if q.missing or q.coverage is not None:
        what = write(q.withheld).title if q.withheld is not None else "The what-if replay across ranks"
        why, to_decide = unread_words(q.missing, q.coverage, q.ended)
        return Undecided(question=q.question, reason=f"{what} withheld: {why}", why=f"{what} withheld: {why}",
                         ranks=q.ranks, basis=q.basis, steps=q.steps, to_decide=to_decide)
    if q.withheld is not None:
        title = write(q.withheld).title
        why = (f"the traced steps ran {q.ratio:.2f}x slower than the rest of the run, and over the untraced steps the "
               "step timer names no slow rank")
        return Undecided(question=q.question, reason=f"{title} withheld: {why} ({q.timer_reason})",
                         why=f"{title} withheld: {why}", ranks=q.ranks, basis=q.basis, steps=q.steps,
                         to_decide=("trace again with fewer profiler options (the profiler-slowdown finding names the "
                                    "costly ones), so that the traced steps run like the others"))
    v = q.verdict
    assert v is not None
    return Undecided(
        question=q.question,
        reason=v.reason,
        why=(f"{v.claim} (threshold {v.threshold_pct:g}%), but {v.steps} traced steps of {v.ranks} ranks are "
             f"too few to tell a slow rank from chance (at least {v.min_steps} are needed)"),
        to_decide=v.to_decide,
        ranks=q.ranks,
        basis=q.basis,
        steps=q.steps,
    )


def window_note(w: WindowFacts) -> WindowNote:
    """The traced window's own verdict against the run's, in words."""
    final, window, steps, untraced = w.run, w.window, w.traced_step_ms, w.untraced_step_ms
    said = (f"rank {final.rank} is slow across the run" if final.raised
            else f"no rank is slow across the run ({final.claim or final.status})")
    distortion = ""
    if w.ratio is not None and untraced:
        distortion = (f"; its {len(steps)} recorded steps (not the profiler's warm-up) took "
                      f"{', '.join(f'{t:.0f}' for t in steps)} ms against a median {untraced:.0f} ms untraced "
                      f"({w.ratio:.2f}x)")
        if w.beyond_noise and w.ratio > 1:
            distortion += ", beyond the run's own noise: the profiler's cost and the host's load weigh on them"
        elif w.beyond_noise:  # faster than the run's other steps: not the profiler's doing
            distortion += ", faster beyond the run's own noise: the host's load or the work changed while they ran"
    text = (f"The traced window alone says otherwise ({w.question}): {window.reason}; over the run's "
            f"{final.steps} untraced steps the step timer says {said}, and the verdict follows the run" + distortion)
    return WindowNote(w.question, window.status, window.rank, final.status, final.rank, window.reason, steps, untraced,
                      text)
