"""The run section of ``analyze``'s text: hosts, each window and why it was taken, what is missing."""

from __future__ import annotations

from hf_distprof.analysis.results.run import RunSummary
from hf_distprof.core.job import describe_job
from hf_distprof.core.text import rank_spans


def format_run(run: RunSummary) -> list[str]:
    """The run section of ``analyze``'s text: hosts, each window and why it was taken, what is missing."""
    state = "complete" if run.complete else "incomplete (the run stopped before train end, or a rank was lost)"
    hosts = "; ".join(f"{h['host']}: ranks {rank_spans(h['ranks'])}" for h in run.hosts)
    lines = [f"Run manifest ({run.path}), {state}: {run.world_size} rank(s) on {len(run.hosts)} host(s): {hosts}"]
    job = describe_job(run.job) if run.job else ""
    if job:
        lines.append(f"  job: {job}")
    measured = [c for c in run.clocks if c.offset_us is not None and c.uncertainty_us is not None]
    if len({c.host for c in run.clocks}) > 1 and measured:
        worst = max(measured, key=lambda c: abs(c.offset_us or 0.0))
        offset = round(worst.offset_us or 0.0) or 0  # ("-0 us" for -0.11)
        lines.append(f"  clocks at start: largest offset from rank 0 {offset:+d} us (rank {worst.rank}, "
                     f"+/- {worst.uncertainty_us:.0f} us)")
    for w in run.windows:
        why = " + ".join(w.reasons) or "unknown"
        detail = f": {w.detail}" if w.detail else ""
        cut = f"; cut short on ranks {rank_spans(w.cut_short_ranks)}" if w.cut_short_ranks else ""
        lines.append(f"  window steps {w.first}-{w.last} on ranks {rank_spans(w.ranks)}, taken by {why}{detail}{cut}")
    if run.unfinished_ranks:
        lines.append(f"  ranks that never reached train end: {rank_spans(run.unfinished_ranks)}")
    if run.absent_ranks:
        lines.append(f"  ranks without a manifest part: {rank_spans(run.absent_ranks)}")
    if run.missing_files:
        # Listed one per line on stderr by the CLI, like the skipped files.
        lines.append(f"  {len(run.missing_files)} file(s) listed in the manifest are missing from the folder")
    return lines
