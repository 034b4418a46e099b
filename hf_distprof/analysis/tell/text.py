"""Plain-text rendering of an :class:`AnalysisResult`: the terminal summary and the findings list."""

from __future__ import annotations

from hf_distprof.analysis.results.across import BandwidthStat, RankSkew
from hf_distprof.analysis.results.rank import CommKindStat, DeviceMemory, RankResult, StepAfterPause
from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.tell.box import no_finding
from hf_distprof.analysis.tell.run import format_run
from hf_distprof.analysis.tell.whatif import what_if_lines
from hf_distprof.core.text import SHOWN_PCT, format_bytes, format_ranks, rank_spans, step_base, who

# Per-rank rows of the per-kind table up to this many ranks; beyond, the mean over ranks only.
KIND_TABLE_MAX_RANKS = 8
# Rows of the FSDP unit table in the terminal (all of them are in --json).
UNIT_TABLE_ROWS = 12
# Top allocating operators per rank and device in the terminal (--json has memory.TOP_OPS).
MEMORY_OPS = 5


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f}"


def format_findings(result: AnalysisResult) -> str:
    """The ranked findings as text (what the end-of-training hook prints), then the skipped files and the lost ones.

    Args:
        result: An analysis result.

    Returns:
        A headline and one numbered paragraph per finding (or a one-line all-clear), then one line per
        skipped file and one per file the run manifest lists that is missing. Only those when no rank could be
        analysed: a headline of zeros would read as a clean run.
    """
    lines = _findings_lines(result)
    lines += [f"Skipped {err.path}: {err.reason}" for err in result.errors]
    lines += [f"Warning: {text}" for text in (result.run.missing_files if result.run else [])]
    return "\n".join(lines)


def _findings_lines(result: AnalysisResult) -> list[str]:
    if not result.ranks:
        return []
    lines = [
        f"Headline: exposed communication {result.exposed_comm_pct:.1f}% of "
        f"{step_base(True) if result.gpu else 'step time'}, "
        + (f"load imbalance {result.cross_rank.imbalance_pct:.1f}% ({len(result.ranks)} rank(s))"
           if result.cross_rank is not None
           else f"load imbalance n/a ({len(result.ranks)} rank(s))")
    ]
    if not result.findings:
        lines.append(no_finding(result))
    for i, f in enumerate(result.findings, 1):
        sure = f" [confidence {f.confidence:.2f}]" if f.confidence is not None else ""
        lines.append(f"{i}. {f.title}{who(f.ranks, f.title)}{sure}")
        lines.append(f"   Evidence: {f.evidence}")
        lines.append(f"   Try: {f.recommendation}")
    for u in result.undecided:
        lines.append(f"Not enough evidence, no verdict: {u.question}: {u.reason}")
    lines += [note.text for note in result.window_notes]
    if result.slowdown_line is not None:
        lines.append(result.slowdown_line)
    return lines


def _rank_rows(rank: RankResult, gpu: bool) -> list[str]:
    rows = []
    for s in rank.steps:
        c = s.cpu
        row = (
            f"{rank.rank:>4} {s.step:>6} {_ms(s.duration_us):>9} "
            f"{c.pct(c.compute_us):>7.1f} {c.pct(c.communication_us):>7.1f} {c.pct(c.data_loading_us):>7.1f} "
            f"{c.pct(c.other_us):>7.1f}"
        )
        if s.gpu is not None:
            g = s.gpu
            overlap = "-" if g.comm_comp_overlap_pct is None else f"{g.comm_comp_overlap_pct:.1f}"
            row += (
                f" {c.pct(c.gpu_wait_us):>7.1f} | {g.idle_pct:>6.1f} {g.compute_pct:>7.1f} {g.non_compute_pct:>7.1f} "
                f"{g.exposed_comm_pct:>7.1f} {overlap:>7}"
            )
        elif gpu:  # a step of a GPU run without GPU events: its host columns, blank GPU ones
            row += f" {c.pct(c.gpu_wait_us):>7.1f} | {'-':>6} {'-':>7} {'-':>7} {'-':>7} {'-':>7}"
        else:
            overlap = "-" if c.comm_backward_overlap_pct is None else f"{c.comm_backward_overlap_pct:.1f}"
            row += f" | {_ms(c.comm_busy_us):>9} {overlap:>9}"
        rows.append(row)
    return rows


def _kind_row(label: str, row: CommKindStat, fsdp: bool, waits: bool = True) -> str:
    hidden = "-" if row.overlap_pct is None else f"{row.overlap_pct:.1f}"
    wait_ms, wait_pct = (_ms(row.wait_us), f"{row.wait_pct:.1f}") if waits else ("n/a", "n/a")
    return (
        f"{label:>4} {row.kind:<15} {row.count_per_step:>6.1f} {_ms(row.time_us):>8} {_ms(row.exposed_us):>8} "
        f"{wait_ms:>12} {row.exposed_pct:>9.1f} {wait_pct:>15} {hidden:>9}"
        + (f" {_ms(row.forward_exposed_us):>8} {_ms(row.backward_exposed_us):>8}" if fsdp else "")
    )


PEERS_SHOWN = 5
"""The late peers a rank's late-peer line names, longest wait first (a wait for several is split among them)."""


def _kind_totals(result: AnalysisResult) -> list[str]:
    """The per-rank sums of the per-kind rows (the headline's exposed communication), and who waits for whom."""
    ranks = [r for r in result.ranks if r.comm_by_kind]
    if not ranks:
        return []
    sums = ", ".join(f"rank {r.rank} {sum(row.exposed_pct for row in r.comm_by_kind):.1f}%" for r in ranks)
    out = [f"exposed %step per rank (its rows added up; the headline's figure): {sums}"]
    if result.unmeasured_waits:  # (the findings that use it are withheld: "not enough evidence" says why)
        return [*out, f"late-peer wait: n/a: no trace of {format_ranks(result.unmeasured_waits)} read where it "
                      "matters, so the others' time in collectives cannot be told apart into waiting for them and the "
                      "transfer"]
    for r in ranks[:KIND_TABLE_MAX_RANKS]:
        peers = result.late_peers.get(r.rank, [])
        shown = [p for p in peers if p.pct >= SHOWN_PCT]
        if shown:
            rest = peers[PEERS_SHOWN:]
            more = f", {len(rest)} more ranks {sum(p.pct for p in rest):.1f}%" if len(shown) > PEERS_SHOWN else ""
            out.append(f"rank {r.rank}'s late-peer wait: {sum(p.pct for p in peers):.1f}% of its step ("
                       + ", ".join(f"for rank {p.peer} {p.pct:.1f}%" for p in shown[:PEERS_SHOWN]) + more + ")")
    return out


def _kind_table(result: AnalysisResult) -> list[str]:
    """Communication per collective kind: per rank (a few ranks) or mean over ranks (many)."""
    if not result.comm_by_kind:
        return []
    gpu = result.gpu
    fsdp = bool(result.comm_by_module)  # FSDP's forward/backward columns only where FSDP issued collectives
    head = (
        f"{'rank':>4} {'kind':<15} {'calls':>6} {'busy ms':>8} {'exp ms':>8} {'late-peer ms':>12} {'exp %step':>9} "
        f"{'late-peer %step':>15} {'hid %busy':>9}" + (f" {'fwd exp':>8} {'bwd exp':>8}" if fsdp else "")
    )
    out = [
        "",
        "Communication by collective kind, per step. busy: the union of the collectives' spans; exp (exposed): "
        + ("communication kernels with no computation kernel running" if gpu else "the training thread waits for it")
        + ", each moment counted once (the earliest started collective in flight), so a rank's rows add up to its "
        "exposed communication; late-peer: of the exposed time, the late-peer wait (before the last rank reached "
        "the same collective), the rest is the collective itself and a rank's time in it past its completion; %step: "
        "% of the step ("
        + ("its GPU span, as HTA's" if gpu else "its wall time")
        + "), mean over steps; hid %busy: % of the busy time hidden behind computation"
        + ("; fwd/bwd exp: exposed ms issued in FSDP's forward/backward" if fsdp else ""),
        head,
        "-" * len(head),
    ]
    if len(result.ranks) <= KIND_TABLE_MAX_RANKS:
        out += [_kind_row(str(r.rank), row, fsdp, not result.unmeasured_waits) for r in result.ranks
                for row in r.comm_by_kind]
    out += [_kind_row("mean", row, fsdp, not result.unmeasured_waits) for row in result.comm_by_kind]
    others = sorted({k for row in result.comm_by_kind if row.kind == "other" for k in row.kinds})
    if others:
        out.append(f"other = {', '.join(others)}")
    return out + _kind_totals(result)


def _after_pause(result: AnalysisResult) -> list[str]:
    """The traced steps that an evaluation or a checkpoint began: left out (or kept, when every step of a window was
    one), and what each held."""
    by_step: dict[int, list[tuple[int, StepAfterPause]]] = {}
    for r in result.ranks:
        for p in r.steps_after_pause:
            by_step.setdefault(p.step, []).append((r.rank, p))
    if not by_step:
        return []
    kept = sorted(step for step, held in by_step.items() if any(p.kept for _, p in held))
    gone = sorted(step for step in by_step if step not in kept)
    means = [r.mean_step_us for r in result.ranks if r.steps]
    out = []
    if gone:
        mean = f"; the steps kept: {_ms(sum(means) / len(means))} ms on average" if means else ""
        out.append(f"Left out of every figure: step{'s' if len(gone) > 1 else ''} {rank_spans(gone)}, traced right "
                   "after an evaluation or a checkpoint, in which the ranks that finished it first wait for the others "
                   f"(as the step timer leaves them out{mean}):")
    if kept:
        out.append(f"Kept, though traced right after an evaluation or a checkpoint (every step of its window was): "
                   f"step{'s' if len(kept) > 1 else ''} {rank_spans(kept)}, from where the pause ended; the ranks' "
                   "waits in it are the pause's more than the training's:")
    for step in gone + kept:
        held = by_step[step]
        p_rank, p = max(held, key=lambda x: (x[1].pause_us, -x[0]))
        r_rank, r = max(held, key=lambda x: (x[1].rest_us, -x[0]))
        of = f", the longest of {len(held)} ranks" if len(held) > 1 else ""
        what = next((x.what for _, x in held if x.what), "")
        after = f", after {'an' if what[:1] in 'aeiou' else 'a'} {what}" if what else ""
        out.append(f"  step {step}{after}: the pause {_ms(p.pause_us)} ms on rank {p_rank}{of}; the step after it "
                   f"{_ms(r.rest_us)} ms on rank {r_rank}")
    return out


CLOCKS_APART_US = 1e6
"""A rank's clock further from the first rank's than this (1 s) is said: NTP keeps a cluster's clocks within ms."""


def _clocks_apart(result: AnalysisResult, per_rank: list[RankSkew]) -> list[str]:
    """The ranks whose clocks read more than :data:`CLOCKS_APART_US` from the first rank's at the same collectives (the
    alignment's offset, with the traces' own base times), said once."""
    base = {r.rank: r.base_time_ns / 1e3 for r in result.ranks}
    first = min(p.rank for p in per_rank)
    apart = [(p.rank, p.clock_offset_us + base.get(p.rank, 0.0) - base.get(first, 0.0)) for p in per_rank]
    apart = [(rank, us) for rank, us in apart if abs(us) > CLOCKS_APART_US]
    if not apart:
        return []
    moved = ", ".join(f"rank {rank} {us / 1e6:+.1f} s" for rank, us in apart)
    return [f"clocks apart: {moved} against rank {first}'s, found by matching their collectives and taken out "
            "(hosts whose clocks are not synchronised; or traces of another run, whose collectives match by chance)"]


def _own_collectives(result: AnalysisResult) -> list[str]:
    """The collectives hf_distprof issued itself in the traced steps, named once: no table or figure counts them."""
    counts: dict[str, int] = {}
    busy_us = 0.0
    for c in (c for r in result.ranks for s in r.steps for c in s.own_collectives):
        counts[c.kind] = counts.get(c.kind, 0) + 1
        busy_us += c.duration_us
    if not counts:
        return []
    n = len(result.ranks)
    kinds = ", ".join(f"{counts[k] / n:g} {k}" for k in sorted(counts))
    return [f"hf-distprof's own collectives left out: {kinds} per rank in the traced steps "
            f"({_ms(busy_us / n)} ms in flight per rank)"]


def _unit_table(result: AnalysisResult) -> list[str]:
    """FSDP's collectives per unit, most exposed first (mean over ranks)."""
    rows = result.comm_by_module
    if not rows:
        return []
    head = f"{'FSDP unit':<28} {'kind':<15} {'phase':<9} {'calls':>6} {'time ms':>9} {'exposed ms':>10}"
    out = ["", "FSDP collectives per unit (per step, mean over ranks; most exposed first)", head, "-" * len(head)]
    for row in rows[:UNIT_TABLE_ROWS]:
        out.append(
            f"{row.module or '(root)':<28} {row.kind:<15} {row.phase or '-':<9} {row.count_per_step:>6.1f} "
            f"{_ms(row.time_us):>9} {_ms(row.exposed_us):>10}"
        )
    if len(rows) > UNIT_TABLE_ROWS:
        out.append(f"... {len(rows) - UNIT_TABLE_ROWS} more rows in --json (comm_by_module)")
    return out


def format_gbps(value: float | None) -> str:
    """A bandwidth in GB/s for a table: 3 decimals below 10, one above; "<0.001" for a trickle."""
    if value is None:
        return "-"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if value >= 0.001 or value == 0 else "<0.001"


def missing_sizes_note(result: AnalysisResult) -> str | None:
    """A sentence on the collectives without a recorded size, or None when every one has one; it names what gives
    the sizes for the run's own backend (gloo and other CPU backends: recorded shapes only)."""
    if not result.unsized_collectives:
        return None
    head = f"{result.unsized_collectives} collective(s), counted on every rank, have no message size"
    if not result.gpu:
        backends = sorted({r.backend for r in result.ranks if r.backend}) or ["CPU"]
        return (f"{head}: {'/'.join(backends)} traces state them only as recorded shapes: profile with "
                "--profiler-record-shapes (it slows the traced steps, see the flag).")
    return (f"{head}: NCCL traces of newer PyTorch state sizes (record_param_comms); with older ones, record shapes "
            "(--profiler-record-shapes) and analyse with --message-sizes shapes.")


def _bandwidth_row(row: BandwidthStat) -> str:
    wait = "-" if row.wait_pct is None else f"{row.wait_pct:.1f}"
    rates = [row.algbw_gbps, row.busbw_gbps, row.transfer_algbw_gbps, row.transfer_busbw_gbps]
    algbw, busbw, x_algbw, x_busbw = (format_gbps(r) for r in rates)
    return (
        f"{row.kind:<15} {row.group_size or '-':>3} {row.bucket:<16} {row.count_per_rank:>6.1f} "
        f"{format_bytes(row.mean_bytes):>11} {_ms(row.time_us):>9} {algbw:>7} {busbw:>7} {wait:>10} "
        f"{x_algbw:>7} {x_busbw:>7}"
    )


def _bandwidth_table(result: AnalysisResult) -> list[str]:
    """Collective bandwidth per kind, group size and message size; a note when sizes are missing."""
    note = missing_sizes_note(result)
    if not result.bandwidth:
        return ["", f"Collective bandwidth: {note}"] if note else []
    head = (
        f"{'kind':<15} {'n':>3} {'size':<16} {'calls':>6} {'mean size':>11} {'time ms':>9} {'algbw':>7} "
        f"{'busbw':>7} {'late-peer %time':>15} {'x-algbw':>7} {'x-busbw':>7}"
    )
    out = [
        "",
        "Collective bandwidth (GB/s, nccl-tests' algbw and busbw; calls and time per rank, over the traced steps; "
        "late-peer %time: of the "
        "time, the late-peer wait (for the last rank to arrive); x-: over the rest, the transfer time)",
        head,
        "-" * len(head),
    ]
    out += [_bandwidth_row(row) for row in result.bandwidth]
    if note:
        out.append(note)
    return out


REF_SIZE_FAR = 2.0
"""A reference taken at a size more than this many times off a row's mean size is marked: bandwidth depends on size."""


def reference_lines(result: AnalysisResult) -> list[str]:
    """The bandwidth rows against ``--bandwidth-ref``'s CSV and the per-rank totals; empty without one."""
    source = result.bandwidth_reference_file
    if source is None:
        return []
    if not result.bandwidth_reference:
        kinds = sorted({row.kind for row in result.bandwidth}) or ["none with a size"]
        return [f"Against {source}: no collective of the trace ({', '.join(kinds)}) has a reference there."]
    head = (
        f"{'kind':<15} {'n':>3} {'size':<16} {'ref size':>10} {'ref busbw':>9} {'busbw':>7} {'time ms':>9} "
        f"{'at ref ms':>9} {'slow net ms':>11} {'late peer ms':>12}"
    )
    out = [
        f"Against {source} (busbw GB/s; per rank; time: transfer time, waits taken out, or the whole time with "
        "one rank; at ref: the same bytes at the reference busbw of the nearest size; slow net: the difference)",
        head,
        "-" * len(head),
    ]
    far = []  # rows whose nearest reference size is more than REF_SIZE_FAR times off their mean size
    for r in result.bandwidth_reference:
        late = "-" if r.late_peer_us is None else _ms(r.late_peer_us)
        off = r.mean_bytes > 0 and max(r.mean_bytes / r.ref_bytes, r.ref_bytes / r.mean_bytes) > REF_SIZE_FAR
        far += [r] if off else []
        ref = format_bytes(r.ref_bytes) + ("*" if off else "")
        out.append(
            f"{r.kind:<15} {r.group_size or '-':>3} {r.bucket:<16} {ref:>10} {format_gbps(r.ref_busbw_gbps):>9} "
            f"{format_gbps(r.busbw_gbps):>7} {_ms(r.time_us):>9} {_ms(r.at_ref_us):>9} {_ms(r.slow_network_us):>11} "
            f"{late:>12}"
        )
    total = result.reference_totals
    assert total is not None  # set with the rows
    waited = f"{_ms(total.late_peer_us)} ms waiting for a late peer; " if total.waits_separated else ""
    spent = "of transfers" if total.waits_separated else "in collectives (waits included: one rank)"
    # The lost time is the rows slower than the reference, added up: said as that when the others were faster (a
    # trial read "38.41 ms ... would take 55.94 ms at the reference speed: 12.44 ms lost to a slow network").
    lost = (f"{_ms(total.slow_network_us)} ms lost to a slow network" if total.at_ref_us <= total.time_us else
            f"faster than the reference in all, though the rows slower than it lose {_ms(total.slow_network_us)} ms"
            if total.slow_network_us > 0 else "no time lost to the network")
    out.append(f"Per rank: {waited}{_ms(total.time_us)} ms {spent} would take {_ms(total.at_ref_us)} ms at the "
               f"reference speed: {lost}.")
    if far:
        out.append(f"* the reference's nearest size is more than {REF_SIZE_FAR:g}x off the row's mean size "
                   f"({', '.join(f'{format_bytes(r.mean_bytes)} against {format_bytes(r.ref_bytes)}' for r in far)}): "
                   "bandwidth depends on size; measure the trace's sizes (hf-distprof bench-collectives --sizes ...)")
    return out


def _memory_section(result: AnalysisResult) -> list[str]:
    """Peak memory per rank and device, and the top allocating operators; empty without ``[memory]`` events.

    The operators are listed for every rank up to :data:`KIND_TABLE_MAX_RANKS` ranks; beyond, for the rank
    with the highest peak of each device type (all ranks' are in --json).
    """
    ranks = [r for r in result.ranks if r.memory]
    if not ranks:
        return []
    head = f"{'rank':>4} {'device':<8} {'peak alloc':>11} {'at step':>7} {'alloc/step':>11} {'freed/step':>11}"
    out = [
        "",
        "Memory (from [memory] events; peak: the most allocated at once over the traced steps)",
        head,
        "-" * len(head),
    ]
    for r in ranks:
        for d in r.memory:
            alloc = sum(s.allocated_bytes for s in d.steps) / len(d.steps)
            freed = sum(s.freed_bytes for s in d.steps) / len(d.steps)
            out.append(
                f"{r.rank:>4} {d.device:<8} {format_bytes(d.peak_allocated_bytes):>11} {d.peak_step:>7} "
                f"{format_bytes(alloc):>11} {format_bytes(freed):>11}"
            )
    shown = [(r.rank, d) for r in ranks for d in r.memory]
    if len(ranks) > KIND_TABLE_MAX_RANKS:
        highest: dict[str, tuple[int, DeviceMemory]] = {}
        for rank, d in shown:
            if d.kind not in highest or d.peak_allocated_bytes > highest[d.kind][1].peak_allocated_bytes:
                highest[d.kind] = (rank, d)
        shown = list(highest.values())
    out.append("Top allocating operators (bytes allocated over the traced steps, allocations):")
    for rank, d in shown:
        ops = ", ".join(f"{op.name} {format_bytes(op.allocated_bytes)} ({op.count})" for op in d.top_ops[:MEMORY_OPS])
        out.append(f"  rank {rank} {d.device}: {ops or '-'}")
    return out


def format_summary(result: AnalysisResult) -> str:
    """The terminal summary: per-rank per-step table, cross-rank view, findings.

    The skipped files are only counted here: the CLI lists them on stderr, the report in its own section.

    Args:
        result: An analysis result.

    Returns:
        Multi-line text; only the count line when no rank could be analysed.
    """
    out: list[str] = []
    gpu = result.gpu
    out.append(f"Analysed {len(result.ranks)} rank(s), {len(result.errors)} file(s) skipped or read in part.")
    if result.ranks:
        head = f"{'rank':>4} {'step':>6} {'step ms':>9} {'cpu%':>7} {'comm%':>7} {'data%':>7} {'other%':>7}"
        head += (
            f" {'sync%':>7} | {'idle%':>6} {'comp%':>7} {'nonc%':>7} {'expC%':>7} {'ovlp%':>7}"
            if gpu
            else f" | {'gloo ms':>9} {'bwd ovl%':>9}"
        )
        out += [
            "",
            "Per rank and step (% of the step on the main thread: compute / communication / data loading / other"
            + (
                " / sync, waiting for the GPU inside CUDA calls (cudaStreamSynchronize ... in .item() or a copy to "
                "the host); GPU, % of the step's GPU span: HTA idle / compute / non-compute, exposed comm; ovlp%: % "
                "of the communication that overlaps computation)"
                if gpu
                else "; gloo: collective time, % of it under backward)"
            ),
            head,
            "-" * len(head),
        ]
        for rank in result.ranks:
            out += _rank_rows(rank, gpu)
    out += _after_pause(result)
    out += _kind_table(result)
    out += _own_collectives(result)
    out += _unit_table(result)
    out += _bandwidth_table(result)
    ref = reference_lines(result)
    out += ["", *ref] if ref else []
    out += _memory_section(result)
    out += ["", *format_run(result.run)] if result.run is not None else []
    cross = result.cross_rank
    if cross is not None:
        out += ["", f"Across ranks ({cross.matched_collectives} collectives matched):"]
        out.append("(per step, mean over the traced steps: busy, the rank's busy time (GPU: compute kernels; CPU: "
                   "compute + data loading), what the load imbalance compares; exposed comm, the rank's exposed "
                   "communication; late, its latest arrival at the step's collectives after the earliest rank, median "
                   "over steps)")
        out.append(f"{'rank':>4} {'step ms':>9} {'busy ms':>9} {'exposed comm ms':>16} {'late ms':>8}")
        for p in cross.per_rank:
            late = "-" if p.lateness_us is None else _ms(p.lateness_us)
            out.append(
                f"{p.rank:>4} {_ms(p.mean_step_us):>9} {_ms(p.busy_us):>9} {_ms(p.comm_wait_us):>16} {late:>8}"
            )
        out += _clocks_apart(result, cross.per_rank)
        spread = max((s.spread_pct for s in cross.step_spread), default=0.0)
        out.append(f"load imbalance {cross.imbalance_pct:.1f}%, largest step-duration spread {spread:.1f}%")
        for name, verdict in (("straggler", cross.straggler_verdict), ("imbalance", cross.imbalance_verdict)):
            if verdict is not None:
                out.append(f"{name} verdict: {verdict.status}: {verdict.reason}")
    out += what_if_lines(result)
    findings = _findings_lines(result)
    if findings:
        out += ["", *findings]
    return "\n".join(out)
