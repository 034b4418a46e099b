"""The short box a person reads first, at the end of ``analyze``, of the demo and of ``--profiler-analyze`` (and at the
top of ``--report``): the verdict, why (its numbers), what to try. Its words do not say where the tables are: they are
above it in the terminal, below it in the report.

Pure text from an :class:`~hf_distprof.analysis.results.result.AnalysisResult`'s fields: the top finding (the slow
rank's causal chain when there is one) with its ``why`` and ``action``, or the all-clear with the headline figures, or
what the run could not decide (its ``why`` and ``to_decide``). It never reads a finding's sentences.
"""

from __future__ import annotations

import textwrap

from hf_distprof.analysis.results.findings import Finding
from hf_distprof.analysis.results.across import CrossRankResult
from hf_distprof.analysis.results.result import AnalysisResult
from hf_distprof.core.text import SHOWN_PCT, format_ranks, step_base, who
from hf_distprof.core.verdicts import QUIET_WHY

NO_FINDING = "nothing crosses its threshold in most steps, beyond the run's own noise"
"""What a run without a finding is told (the box, the text, the report, the trackers): a threshold crossed on the mean
but not in enough steps, or within the noise, is no finding."""


def no_finding(result: AnalysisResult) -> str:
    """The line the text, the report and a tracker's panel give when nothing was found, in the box's terms: with a
    question left undecided it is no clean verdict (the box says "not enough evidence"), and with ranks unread it is
    about the ranks read."""
    if result.undecided:
        return "No finding among what could be decided; the rest had not enough evidence: no verdict on the whole run."
    among = f" in the ranks read ({format_ranks(result.unread_ranks)}: no trace read)" if result.unread_ranks else ""
    return f"No finding{among}: {NO_FINDING}."

WIDTH = 100
"""Characters per line, borders included."""
MAX_LINES = 3
"""Lines per field at most; longer text is cut with an ellipsis (the full text is above the box)."""


def _why(f: Finding) -> str:
    return f.why + (f" (confidence {f.confidence:.2f})" if f.confidence is not None else "")


def verdict(result: AnalysisResult) -> str:
    """The box's ``Verdict`` line alone (what a one-line message at train end says, where the box goes elsewhere)."""
    return next((text for name, text in _fields(result) if name == "Verdict"), "")


def _fields(result: AnalysisResult) -> list[tuple[str, str]]:
    if not result.ranks:
        return [("Verdict", "no trace could be analysed"), ("Why", "; ".join(e.reason for e in result.errors[:2]))]
    return _answer(result) + _ended(result) + _skipped(result)


def _ended(result: AnalysisResult) -> list[tuple[str, str]]:
    """The ranks that ended before the run did, where a file of theirs says so (a crash stack, an exception, a stop):
    the answer above is of the steps traced before (trial U: "no finding ... nothing to fix" on a run whose rank 1 had
    raised, with no word of it but the manifest's "incomplete")."""
    run = result.run
    if run is None or not (run.crashed_ranks or run.raised_ranks or run.stopped_ranks):
        return []
    told = set(run.crashed_ranks) | set(run.raised_ranks) | set(run.stopped_ranks)
    parts = [f"{format_ranks(ranks)} {what}" for ranks, what in (
        (run.crashed_ranks, "died of a fatal signal"), (run.raised_ranks, "raised an exception"),
        (sorted(set(run.stopped_ranks) - set(run.crashed_ranks) - set(run.raised_ranks)),
         "were stopped by a signal" if len(set(run.stopped_ranks) - set(run.crashed_ranks) - set(run.raised_ranks)) > 1
         else "was stopped by a signal"),
        (sorted(set(run.unfinished_ranks) - told), "never reached train end")) if ranks]
    return [("Ended", f"{'; '.join(parts)}: hf-distprof hang-report RUN_FOLDER says how, where and in what order")]


def _skipped(result: AnalysisResult) -> list[tuple[str, str]]:
    """The files that could not be read, and the ranks the answer does not cover: a 2-rank run with one trace truncated
    read "no finding" with nothing saying that half the ranks were missing."""
    if not result.errors:
        return []
    read = len(result.ranks)
    covers = (f"no trace of {format_ranks(result.unread_ranks)} read: the answer covers the "
              f"{read} rank{'s' if read != 1 else ''} read") if result.unread_ranks else \
        f"the answer covers the {read} rank{'s' if read != 1 else ''} read"
    # The files and their reasons are said once, where the errors are (the CLI's stderr, the report's list).
    return [("Skipped", f"{len(result.errors)} file(s) skipped or read in part; {covers}")]


def _answer(result: AnalysisResult) -> list[tuple[str, str]]:
    findings = result.findings
    if findings:
        top = findings[0]  # the list's own order (hf_distprof.analysis.judge.findings.in_order)
        rows = [("Verdict", f"{top.title}{who(top.ranks, top.title)}"), ("Why", _why(top)), ("Try", top.action)]
        rest = [f.title for f in findings if f is not top]
        if rest:
            rows.append(("Also", f"{len(rest)} more finding(s): {'; '.join(rest)}"))
        return rows
    cross = result.cross_rank
    waits = sum(row.wait_pct for row in result.comm_by_kind)
    base = step_base(result.gpu)
    figures = (f"exposed communication {result.exposed_comm_pct:.1f}% of {base}"
               + (f" ({waits:.1f}% of {base}: late-peer wait)" if waits >= SHOWN_PCT else "")
               + (f", load imbalance {cross.imbalance_pct:.1f}% ({_busiest(cross)}busy time, traced steps)"
                  if cross is not None else ""))
    if result.undecided:
        first = result.undecided[0]
        about = "a slow-rank verdict" if first.question in ("straggler", "imbalance", "slow_rank") else \
            "a verdict across ranks"  # a finding withheld for the ranks whose traces were not read
        return [("Verdict", f"not enough evidence for {about}"), ("Why", first.why),
                *([("Try", first.to_decide)] if first.to_decide else []), ("Figures", figures)]
    verdicts = (("straggler", cross.straggler_verdict), ("imbalance", cross.imbalance_verdict)) if cross else ()
    quiet = [f"{name} {v.status}" for name, v in verdicts if v is not None]
    slowest = _slowest(result)
    # Ranks the manifest lists and the analysis did not read (not those --profile-ranks left untraced).
    among = f" in the ranks read ({format_ranks(result.unread_ranks)}: no trace read)" if result.unread_ranks else ""
    return [("Verdict", f"no finding{among}: {NO_FINDING}"),
            ("Why", figures + (f"; verdicts: {', '.join(quiet)}" if quiet else "") + slowest),
            ("Try", _largest_saving(result))]


def _busiest(cross: CrossRankResult) -> str:
    """"rank 0's ": whose busy time the load imbalance is (the slowest rank beside it may be another)."""
    busiest = max(cross.per_rank, key=lambda p: (p.busy_us, -p.rank), default=None)
    return f"rank {busiest.rank}'s " if busiest is not None else ""


_NAMED_BY = {
    "run": "the most own work over the run's judged steps, no verdict",
    "lateness": "the latest at the traced steps' collectives",
    "replay": "the most local work per traced step",
}
"""What the box says names the slowest rank when no verdict's candidate is that rank."""


def _slowest(result: AnalysisResult) -> str:
    """"; slowest rank 1 (+4.3% median excess per step, under the 10% threshold)": the rank the answer calls slowest
    (``cross_rank.slowest_rank``, which the what-if replays at its peers' pace), with the figure of the verdict whose
    candidate it is (its own work, else its lateness at the collectives: step by step, over the run when the step
    timer's records decide), not the headline's load imbalance of the traced steps' mean busy time; else what names
    it."""
    cross = result.cross_rank
    if cross is None or cross.slowest_rank is None:
        return ""
    v = {"imbalance": cross.imbalance_verdict, "straggler": cross.straggler_verdict}.get(cross.slowest_by or "")
    if v is None:
        return f"; slowest rank {cross.slowest_rank} ({_NAMED_BY.get(cross.slowest_by or '', 'no verdict')})"
    what = "excess" if cross.slowest_by == "imbalance" else "lateness"  # its arrival at the collectives
    why = QUIET_WHY.get(v.gate, "no verdict") if v.gate != "threshold" else f"under the {v.threshold_pct:g}% threshold"
    return f"; slowest rank {v.rank} ({v.effect_pct:+.1f}% median {what} per step, {why})"


def _largest_saving(result: AnalysisResult) -> str:
    """The all-clear's "Try": the largest saving the what-if predicts, and why it is not a finding."""
    top = result.what_if[0] if result.what_if else None  # the judge's order: the saving that counts, largest first
    if top is None or top.counted_pct <= 0:
        return "nothing to fix from these steps; the tables show where each step goes"
    held = f" over the run; {top.saving_pct:.1f}% in the traced steps alone" if top.held_to_run else ""
    if top.beyond_noise:
        held = f" ({held.strip()})" if held else ""
        return (f"nothing worth fixing: the largest saving the what-if predicts, {top.title}, is "
                f"{top.counted_pct:.1f}% of the step{held}, under the {result.options.what_if_pct:g}% worth fixing")
    why = {"verdict": "is not one the slow-rank verdict calls real",
           "one step": "cannot be told from noise in one traced step"}.get(top.not_counted or "",
                                                                           "is within the run's noise")
    return (f"nothing to fix: the largest saving the what-if predicts, {top.title} ({top.counted_pct:.1f}% of the "
            f"step{held}), {why}")


def format_box(result: AnalysisResult, title: str = "hf-distprof: in short") -> str:
    """The box: ``Verdict``, ``Why``, ``Try`` (and ``Also``: the other findings, by title), each wrapped to
    :data:`MAX_LINES` lines of :data:`WIDTH` characters."""
    label = max(len(name) for name, _ in _fields(result)) + 2
    inner = WIDTH - 4
    lines = [f"+- {title} " + "-" * (WIDTH - len(title) - 5) + "+"]
    for name, text in _fields(result):
        wrapped = textwrap.wrap(text, inner - label, break_on_hyphens=False) or [""]  # flags stay whole
        if len(wrapped) > MAX_LINES:
            wrapped = wrapped[:MAX_LINES]
            wrapped[-1] = textwrap.shorten(wrapped[-1] + " ...", inner - label - 1, placeholder=" ...")
        for i, line in enumerate(wrapped):
            head = f"{name}:".ljust(label) if i == 0 else " " * label
            lines.append(f"| {head}{line}".ljust(WIDTH - 1) + "|")
    lines.append("+" + "-" * (WIDTH - 2) + "+")
    return "\n".join(lines)
