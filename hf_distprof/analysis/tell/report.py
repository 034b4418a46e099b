"""Report writer: an :class:`AnalysisResult` -> a folder with Markdown, self-contained HTML, PNGs, JSON.

The report is built once as blocks (:mod:`hf_distprof.analysis.tell.document`) and written as Markdown and as HTML
from them; every figure shares one tail (:func:`hf_distprof.analysis.tell.plot.save`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.analysis.tell.box import format_box, no_finding
from hf_distprof.analysis.tell.document import (
    Blank,
    Block,
    Bullet,
    Heading,
    Image,
    Lines,
    Numbered,
    Pre,
    Table,
    para,
    plain,
    to_html,
    to_markdown,
)
from hf_distprof.analysis.tell.plot import pyplot, save
from hf_distprof.analysis.tell.run import format_run
from hf_distprof.analysis.tell.text import format_gbps, format_summary, missing_sizes_note, reference_lines
from hf_distprof.analysis.tell.whatif import CRITICAL_PATH_PNG, plot_critical_path, what_if_blocks
from hf_distprof.core import names
from hf_distprof.core.files import atomic_path, atomic_write_text
from hf_distprof.core.stats import mean
from hf_distprof.core.text import format_bytes, step_base, who

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
RESULT_JSON = names.ANALYSIS_NAME
BREAKDOWN_PNG = "breakdown.png"
STEPS_PNG = "step_durations.png"
PHASES_PNG = "phases_per_step.png"
LATENESS_PNG = "lateness_per_step.png"
COMM_PNG = "communication_by_kind.png"
MEMORY_PNG = "memory_over_time.png"  # only when the traces hold [memory] events


def _heatmap(ax, rows: list[list[float]], ranks: list[int], steps: list[int], title: str, unit: str) -> None:  # type: ignore[no-untyped-def]
    """One rank x step heatmap, a column per step in ``steps`` labelled with its number (steps need not follow each
    other: a step left out after a checkpoint, two windows); labels thinned past 12 steps and 16 ranks."""
    image = ax.imshow(rows, aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(-0.5, len(steps) - 0.5, len(ranks) - 0.5, -0.5))
    ax.set_title(title, fontsize=9)
    every_step = max(1, -(-len(steps) // 12))
    ax.set_xticks(list(range(0, len(steps), every_step)), [str(s) for s in steps[::every_step]])
    every = max(1, len(ranks) // 16)
    ax.set_yticks(list(range(0, len(ranks), every)), [str(r) for r in ranks[::every]])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.figure.colorbar(image, ax=ax, label=unit)


def _phases_plot(result: AnalysisResult, out: Path) -> None:
    """Per rank and step: each phase's share of the step, one heatmap per phase."""
    plt = pyplot()
    steps = result.common_steps
    ranks = [r.rank for r in result.ranks]
    gpu = result.gpu
    if gpu:
        phases = {
            # A step without GPU events is a blank cell (NaN), not a measured 0%.
            "GPU compute": lambda s: s.gpu.compute_pct if s.gpu else math.nan,
            "exposed communication": lambda s: s.gpu.exposed_comm_pct if s.gpu else math.nan,
            "GPU idle": lambda s: s.gpu.idle_pct if s.gpu else math.nan,
        }
    else:
        phases = {
            "compute": lambda s: s.cpu.pct(s.cpu.compute_us),
            "communication (waiting)": lambda s: s.cpu.pct(s.cpu.communication_us),
            "data loading": lambda s: s.cpu.pct(s.cpu.data_loading_us),
        }
    if not steps:  # no step every rank traced (--profile-ranks auto: each window its own ranks)
        fig, ax = plt.subplots(figsize=(7, 3.0))
        ax.text(0.5, 0.5, "no step traced on every rank", ha="center", va="center")
        ax.set_axis_off()
        save(fig, out)
        return
    fig, axes = plt.subplots(1, len(phases), figsize=(4.2 * len(phases), max(3.0, 0.25 * len(ranks) + 2)))
    for ax, (name, value) in zip(axes, phases.items()):
        rows = []
        for r in result.ranks:
            by_step = {s.step: s for s in r.steps}
            rows.append([value(by_step[step]) for step in steps])
        _heatmap(ax, rows, ranks, steps, f"{name} (% of step)", "%")
    save(fig, out)


def lateness_rows(result: AnalysisResult) -> tuple[list[int], list[list[float]]]:
    """The lateness plot's steps and, per rank, its lateness at each step's collectives in ms; NaN (a blank cell) where
    the rank has no matched collective in that step, not 0.0, which would read as "on time"."""
    cross = result.cross_rank
    steps = sorted({s for p in cross.per_rank for s in p.lateness_steps}) if cross else []
    if cross is None:
        return steps, []
    return steps, [[dict(zip(p.lateness_steps, p.lateness_per_step_us)).get(step, math.nan) / 1e3 for step in steps]
                   for p in cross.per_rank]


def _lateness_plot(result: AnalysisResult, out: Path) -> None:
    """Per rank and step: how late the rank reached that step's collectives (the straggler evidence)."""
    plt = pyplot()
    cross = result.cross_rank
    fig, ax = plt.subplots(figsize=(7, max(3.0, 0.25 * len(result.ranks) + 2)))
    steps, rows = lateness_rows(result)
    if steps and cross is not None:
        _heatmap(ax, rows, [p.rank for p in cross.per_rank], steps, "lateness at the step's collectives (ms)", "ms")
    else:
        ax.text(0.5, 0.5, "no collective matched across ranks", ha="center", va="center")
        ax.set_axis_off()
    save(fig, out)


def _comm_plot(result: AnalysisResult, out: Path) -> None:
    """Communication per collective kind, per step: exposed and hidden time (mean over ranks)."""
    plt = pyplot()
    rows = result.comm_by_kind
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if rows:
        kinds = [row.kind for row in rows]
        exposed = [row.exposed_us / 1e3 for row in rows]
        hidden = [max(0.0, row.time_us - row.exposed_us) / 1e3 for row in rows]
        ax.bar(kinds, exposed, label="exposed")
        ax.bar(kinds, hidden, bottom=exposed, label="hidden behind compute")
        ax.set_ylabel("ms per step (mean over ranks)")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no collective in the traces", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("Communication by collective kind")
    save(fig, out)


def _breakdown_plot(result: AnalysisResult, out: Path) -> None:
    plt = pyplot()

    gpu = result.gpu
    labels = [f"r{r.rank}" for r in result.ranks]
    if gpu:
        parts = {
            "compute": [mean([s.gpu.compute_pct for s in r.steps if s.gpu]) for r in result.ranks],
            "exposed comm": [mean([s.gpu.exposed_comm_pct for s in r.steps if s.gpu]) for r in result.ranks],
            "other non-compute": [
                mean([s.gpu.non_compute_pct - s.gpu.exposed_comm_pct for s in r.steps if s.gpu])
                for r in result.ranks
            ],
            "idle": [mean([s.gpu.idle_pct for s in r.steps if s.gpu]) for r in result.ranks],
        }
        title = "GPU time per rank (% of step GPU span, HTA definitions)"
    else:
        parts = {
            name: [mean([s.cpu.pct(getattr(s.cpu, attr)) for s in r.steps]) for r in result.ranks]
            for name, attr in (
                ("compute", "compute_us"),
                ("communication", "communication_us"),
                ("data loading", "data_loading_us"),
                ("other", "other_us"),
            )
        }
        title = "Main thread time per rank (% of step)"
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(labels) + 3), 4))
    bottom = [0.0] * len(labels)
    for name, values in parts.items():
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("% of step")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out)


def _steps_plot(result: AnalysisResult, out: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result.ranks:
        ax.plot(
            [s.step for s in r.steps],
            [s.duration_us / 1e3 for s in r.steps],
            marker="o",
            label=f"rank {r.rank}",
        )
    ax.set_xlabel("profiler step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_ylabel("step duration (ms)")
    ax.set_title("Step duration per rank")
    if len(result.ranks) <= 16:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out)


def _memory_plot(result: AnalysisResult, out: Path) -> None:
    """Allocated memory over the traced steps, one line per rank, one panel per device type."""
    plt = pyplot()
    kinds = sorted({d.kind for r in result.ranks for d in r.memory}, key=lambda k: (k != "cpu", k))
    fig, axes = plt.subplots(len(kinds), 1, figsize=(8, 3.5 * len(kinds)), squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        for r in result.ranks:
            devices = [d for d in r.memory if d.kind == kind]
            for d in devices:
                label = f"rank {r.rank}" + (f" ({d.device})" if len(devices) > 1 else "")
                # The level holds from one event to the next: a step line.
                ax.plot(d.series_ms, [b / 2**20 for b in d.series_bytes], drawstyle="steps-post", label=label)
        ax.set_xlabel("ms since the first traced step")
        ax.set_ylabel("allocated (MiB)")
        ax.set_title(f"{kind} memory allocated ([memory] events)")
        if len(result.ranks) <= 16:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out)


def _has_memory(result: AnalysisResult) -> bool:
    return any(r.memory for r in result.ranks)


def _document(result: AnalysisResult, images: list[str]) -> list[Block]:
    """The report, block by block (``images``: the figures written)."""
    def figure(name: str, alt: str) -> list[Block]:
        return [Image(name, alt), Blank()] if name in images else [Blank()]

    blocks: list[Block] = [
        Heading(1, "hf-distprof trace analysis"),
        Blank(),
        Lines([[("b", "Exposed communication:"),
                ("", f" {result.exposed_comm_pct:.1f}% of {step_base(True) if result.gpu else 'step time'}")],
               [("b", "Load imbalance:"), ("", f" {result.cross_rank.imbalance_pct:.1f}%"
                                           if result.cross_rank is not None else " n/a (one rank's trace)")],
               [("b", "Ranks analysed:"),
                ("", f" {len(result.ranks)}; files skipped or read in part: {len(result.errors)}")]]),
        Blank(),
        Pre(format_box(result)),
        Blank(),
        *_run_blocks(result),
        Heading(2, "Findings"),
        Blank(),
    ]
    if not result.findings:
        blocks.append(para(no_finding(result)))
    for i, f in enumerate(result.findings, 1):
        sure = f", confidence {f.confidence:.2f}" if f.confidence is not None else ""
        blocks.append(Numbered(i, [("b", f.title), ("", who(f.ranks, f.title) + sure)],
                               [plain(f"Evidence: {f.evidence}"), plain(f"Recommendation: {f.recommendation}")]))
    blocks += [Bullet(plain(f"Not enough evidence, no verdict: {u.question}: {u.reason}")) for u in result.undecided]
    blocks += [Bullet(plain(note.text)) for note in result.window_notes]
    blocks += what_if_blocks(result, with_figure=CRITICAL_PATH_PNG in images)
    blocks += _comm_blocks(result)
    blocks += _bandwidth_blocks(result)
    if result.errors:
        blocks += [Blank(), Heading(2, "Files skipped or read in part"), Blank()]
        blocks += [Bullet([("code", e.path), ("", f": {e.reason}")]) for e in result.errors]
    blocks += [Blank(), Heading(2, "Plots"), Blank(),
               *figure(BREAKDOWN_PNG, "per-rank breakdown"), *figure(STEPS_PNG, "step durations"),
               *figure(PHASES_PNG, "phases per rank and step"), *figure(LATENESS_PNG, "lateness per rank and step"),
               *figure(COMM_PNG, "communication by kind")]
    if _has_memory(result):
        blocks += figure(MEMORY_PNG, "memory over time")
    return [*blocks, Heading(2, "Details"), Blank(), Pre(format_summary(result)), Blank()]


def _run_blocks(result: AnalysisResult) -> list[Block]:
    """The run manifest's section: hosts, each window and why it was taken, files listed but missing."""
    if result.run is None:
        return []
    head, *rest = format_run(result.run)
    return [Heading(2, "Run"), Blank(), para(head), Blank(), *[Bullet(plain(line.strip())) for line in rest],
            *[Bullet(plain(f"Missing: {text}")) for text in result.run.missing_files], Blank()]


def _comm_blocks(result: AnalysisResult) -> list[Block]:
    """The per-kind communication table (mean over ranks) and the FSDP unit table."""
    if not result.comm_by_kind:
        return []
    fsdp = bool(result.comm_by_module)  # FSDP's forward/backward columns only where FSDP issued collectives
    unmeasured = bool(result.unmeasured_waits)  # (peers not traced where it matters: no late-peer figure)
    blocks: list[Block] = [
        Blank(),
        Heading(2, "Communication by collective kind"),
        Blank(),
        para("Per step, mean over ranks. Busy: the union of the collectives' spans. Exposed: not hidden behind "
             "computation (GPU: no computation kernel runs; CPU: the training thread waits), each moment counted once, "
             "so the rows add up to the headline's exposed communication. Late-peer wait: of the exposed time, waiting "
             "for the last rank to reach the same collective; the rest is the collective itself and a rank's time "
             "in it past its completion. % of step: "
             "of the step's wall time (GPU: its GPU span), mean over steps. Forward/backward: issued in FSDP's forward "
             "or backward."),
        Blank(),
        Table(["kind", "calls", "busy ms", "exposed ms", "late-peer wait ms", "exposed % of step",
               "late-peer wait % of step", "hidden % of busy"]
              + (["forward exposed ms", "backward exposed ms"] if fsdp else []),
              [[f"{row.kind} ({', '.join(row.kinds)})", f"{row.count_per_step:.1f}", f"{row.time_us / 1e3:.2f}",
                f"{row.exposed_us / 1e3:.2f}", "n/a" if unmeasured else f"{row.wait_us / 1e3:.2f}",
                f"{row.exposed_pct:.1f}", "n/a" if unmeasured else f"{row.wait_pct:.1f}",
                "-" if row.overlap_pct is None else f"{row.overlap_pct:.1f}"]
               + ([f"{row.forward_exposed_us / 1e3:.2f}", f"{row.backward_exposed_us / 1e3:.2f}"] if fsdp else [])
               for row in result.comm_by_kind]),
    ]
    if result.comm_by_module:
        blocks += [Blank(), Heading(3, "FSDP collectives per unit"), Blank(),
                   Table(["unit", "kind", "phase", "calls", "time ms", "exposed ms"],
                         [[unit.module or "(root)", unit.kind, unit.phase or "-", f"{unit.count_per_step:.1f}",
                           f"{unit.time_us / 1e3:.2f}", f"{unit.exposed_us / 1e3:.2f}"]
                          for unit in result.comm_by_module])]
    return blocks


def _bandwidth_blocks(result: AnalysisResult) -> list[Block]:
    """The collective bandwidth table, or the note saying how to get sizes."""
    note = missing_sizes_note(result)
    if not result.bandwidth and not note:
        return []
    blocks: list[Block] = [Blank(), Heading(2, "Collective bandwidth"), Blank()]
    if result.bandwidth:
        blocks += [
            para("GB/s, nccl-tests' definitions (algbw = size / time, busbw = algbw x 2(n-1)/n for all_reduce, "
                 "(n-1)/n for all_gather, reduce_scatter and all_to_all, 1 otherwise). Calls and time per rank. "
                 "Late-peer wait: the part of the time spent waiting for the last rank to arrive; transfer bandwidths "
                 "divide by the rest, the time data was moving."),
            Blank(),
            Table(["kind", "n", "size", "calls", "mean size", "time ms", "algbw", "busbw", "late-peer wait % of time",
                   "transfer algbw", "transfer busbw"],
                  [[row.kind, str(row.group_size or "-"), row.bucket, f"{row.count_per_rank:.1f}",
                    format_bytes(row.mean_bytes), f"{row.time_us / 1e3:.2f}", format_gbps(row.algbw_gbps),
                    format_gbps(row.busbw_gbps), "-" if row.wait_pct is None else f"{row.wait_pct:.1f}",
                    format_gbps(row.transfer_algbw_gbps), format_gbps(row.transfer_busbw_gbps)]
                   for row in result.bandwidth]),
        ]
    if note:
        blocks += [Blank(), para(note)] if result.bandwidth else [para(note)]
    reference = reference_lines(result)
    if reference:
        blocks += [Blank(), Heading(3, "Against the reference bandwidth (`--bandwidth-ref`)"), Blank(),
                   Pre("\n".join(reference))]
    return blocks


def write_report(result: AnalysisResult, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``report.md``, a self-contained ``report.html`` (PNGs inlined), the PNGs and ``analysis.json``.

    Args:
        result: The analysis to report.
        out_dir: Folder to write into (created if needed).

    Returns:
        The path of ``report.html``.

    Raises:
        OSError: ``out_dir`` cannot be created or written to. Each file is written atomically (temporary
            file, then rename), so a failed write never leaves a half-written file under a report name.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        BREAKDOWN_PNG: _breakdown_plot,
        STEPS_PNG: _steps_plot,
        PHASES_PNG: _phases_plot,
        LATENESS_PNG: _lateness_plot,
        COMM_PNG: _comm_plot,
    }
    if _has_memory(result):
        plots[MEMORY_PNG] = _memory_plot
    if result.critical_path:
        plots[CRITICAL_PATH_PNG] = plot_critical_path
    images = {name: out / name for name in plots} if result.ranks else {}
    for name, path in images.items():
        with atomic_path(path, suffix=".png") as tmp:  # matplotlib picks the format by suffix
            plots[name](result, tmp)
    blocks = _document(result, list(images))
    atomic_write_text(out / REPORT_MD, to_markdown(blocks))
    atomic_write_text(out / REPORT_HTML, to_html(blocks, images, "hf-distprof trace analysis"))
    with atomic_path(out / RESULT_JSON) as tmp:
        tmp.write_bytes(result.to_json())
    return out / REPORT_HTML
