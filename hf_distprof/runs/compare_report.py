"""A :class:`~hf_distprof.runs.compare.Comparison` as a terminal table, and as a report folder (Markdown, PNG,
JSON)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hf_distprof.core import names
from hf_distprof.runs.compare import ONE_PROCESS, Comparison, Row
from hf_distprof.core.difference import MIN_EFFECT_POINTS, ONE_VALUE, PROFILED
from hf_distprof.core.stats import ALPHA
from hf_distprof.core.verdicts import MATERIAL_PCT
from hf_distprof.core.files import atomic_path, atomic_write_text

# Phases drawn in the report's plot, in step order, with the key the step timer writes.
PLOT_PHASES: tuple[tuple[str, str], ...] = (
    ("data_load_s", "data loading"),
    ("data_s", "data wait"),
    ("forward_s", "forward"),
    ("backward_compute_s", "backward compute"),
    ("sync_s", "gradient sync"),
    ("optimizer_s", "optimizer"),
    ("wait_s", "wait"),
    ("step_s", "step"),
)
_STATUS = {"significant": "YES", "not significant": "no", "too few steps": "few steps", "one value": "-",
           ONE_PROCESS: "-"}


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.4f}"
    return f"{value:.1f}"


def _delta(row: Row) -> tuple[str, str]:
    d = row.diff
    if d.delta is None:
        return "n/a", "n/a"
    delta = f"{d.delta:+.4f}" if row.unit == "s" else f"{d.delta:+.1f}"
    if row.unit == "%":
        return delta + " pts", ""
    return delta, "n/a" if d.delta_pct is None else f"{d.delta_pct:+.1f}%"


def table_lines(comparison: Comparison, only_significant: bool = False) -> list[list[str]]:
    """The table's cells: metric, rank, A, B, delta, delta %, significant?, why."""
    out = []
    for row in comparison.rows:
        if only_significant and not row.diff.significant:
            continue
        delta, pct = _delta(row)
        out.append([
            f"{row.label} ({row.unit})",
            "all" if row.rank is None else str(row.rank),
            _value(row.diff.median_a, row.unit),
            _value(row.diff.median_b, row.unit),
            delta,
            pct,
            _STATUS.get(row.diff.status, row.diff.status),
            row.diff.reason,
        ])
    return out


def format_comparison(comparison: Comparison, only_significant: bool = False) -> str:
    """The terminal view: the two runs, the table (medians per step), the headline.

    Args:
        comparison: The comparison.
        only_significant: Show only the significant rows.

    Returns:
        Multi-line text.
    """
    c = comparison
    header = ["metric", "rank", "A", "B", "delta", "delta %", "significant?", "why"]
    cells = table_lines(c, only_significant)
    widths = [max(len(x) for x in col) for col in zip(header, *cells)]
    lines = [
        f"A: {c.run_a}  (ranks {c.ranks_a}, {c.steps_a} step{'s' if c.steps_a != 1 else ''} compared)",
        f"B: {c.run_b}  (ranks {c.ranks_b}, {c.steps_b} step{'s' if c.steps_b != 1 else ''} compared)",
        "medians over steps (warm-up and profiled steps left out); delta = B - A",
        "",
    ]
    for cells_row in [header, ["-" * w for w in widths], *cells]:
        text = [cells_row[0].ljust(widths[0]), cells_row[1].rjust(widths[1])]
        text += [x.rjust(w) for x, w in zip(cells_row[2:6], widths[2:6])]
        text += [cells_row[6].ljust(widths[6]), cells_row[7]]
        lines.append("  ".join(text).rstrip())
    if only_significant and not cells:
        lines.append("(no significant row)")
    lines += [""] + [f"note: {n}" for n in c.notes]
    lines.append(_count(c) + ".")
    lines.append(f"What changed most: {c.headline.text}")
    return "\n".join(lines)


def _plot(comparison: Comparison, out: Path) -> None:
    """Per rank: each phase's median seconds per step, A and B side by side; significant changes starred."""
    import matplotlib

    matplotlib.use("Agg")  # no display: written on headless hosts too
    import matplotlib.pyplot as plt

    rows = {(r.metric, r.rank): r for r in comparison.rows}
    ranks = sorted({r.rank for r in comparison.rows if r.rank is not None})
    fig, axes = plt.subplots(len(ranks), 1, figsize=(10, 2.8 * max(1, len(ranks))), squeeze=False)
    for ax, rank in zip(axes[:, 0], ranks):
        phases = [(key, label) for key, label in PLOT_PHASES if (key, rank) in rows]
        xs = range(len(phases))
        a = [rows[(key, rank)].diff.median_a or 0.0 for key, _ in phases]
        b = [rows[(key, rank)].diff.median_b or 0.0 for key, _ in phases]
        ax.bar([x - 0.2 for x in xs], a, width=0.4, label="A", color="#4c72b0")
        ax.bar([x + 0.2 for x in xs], b, width=0.4, label="B", color="#dd8452")
        labels = [label + (" *" if rows[(key, rank)].diff.significant else "") for key, label in phases]
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("s per step (median)")
        ax.set_title(f"rank {rank}", fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle("per-phase step time, A vs B (* significant)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _markdown(comparison: Comparison) -> str:
    c = comparison
    header = ["metric", "rank", "A", "B", "delta", "delta %", "significant?", "why"]
    lines = [
        "# Run comparison",
        "",
        f"- A: `{c.run_a}` (ranks {c.ranks_a}, {c.steps_a} step{'s' if c.steps_a != 1 else ''} compared)",
        f"- B: `{c.run_b}` (ranks {c.ranks_b}, {c.steps_b} step{'s' if c.steps_b != 1 else ''} compared)",
        "",
        f"**What changed most:** {c.headline.text}",
        "",
        f"{_count(c)}. Medians over steps, warm-up "
        "and profiled steps left out; delta = B - A. Significant: beyond both runs' step-to-step noise, at least "
        f"{c.min_effect_pct:g}% ({MIN_EFFECT_POINTS:g} points for shares), at least {MATERIAL_PCT:g}% of the step "
        f"time for a phase, and a rank-sum p below {ALPHA:g}.",
        "",
        *[f"> note: {n}" for n in c.notes],
        "",
        f"![per-phase step time, A vs B]({names.COMPARE_PNG})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_lines(c)]
    return "\n".join(lines) + "\n"


def write_compare_report(comparison: Comparison, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``compare.md``, ``compare_phases.png`` and ``compare.json`` to ``out_dir``.

    Args:
        comparison: The comparison.
        out_dir: Folder to write into (created if needed).

    Returns:
        The Markdown file's path.

    Raises:
        OSError: ``out_dir`` cannot be created or written to (each file is written atomically).
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / names.COMPARE_PNG, suffix=".png") as tmp:  # matplotlib picks the format by suffix
        _plot(comparison, tmp)
    atomic_write_text(out / names.COMPARE_JSON, json.dumps(comparison.to_json(), indent=2) + "\n")
    atomic_write_text(out / names.COMPARE_MD, _markdown(comparison))
    return out / names.COMPARE_MD


def _count(c: Comparison) -> str:
    """"2 significant difference(s) of 53 compared (13 more shown, not judged)": the rows judged, not every row shown
    (a peak, the profiled steps' figures, a one-process run's waits are shown with their delta and never judged)."""
    shown = sum(1 for r in c.rows if r.diff.status in (ONE_VALUE, PROFILED, ONE_PROCESS))
    more = f" ({shown} more shown, not judged)" if shown else ""
    return f"{len(c.significant)} significant difference(s) of {len(c.rows) - shown} compared{more}"
