"""The step timer's per-step records beside the traces (``timing_rank{R}.jsonl``), read once for the analysis.

Rows the step timer writes say whether the profiler traced their step and whether it was the timer's warm-up
(``traced``, ``warmup``) and what the ranks are compared on (``own_work_s``). Older files say neither: their
first row per file is the warm-up, and the run's verdict is not judged again from them (``timing_summary.json``'s
``imbalance_verdict`` stands in). What the rows say is computed across ranks
(:func:`hf_distprof.analysis.across.evidence.timer_figures`) and judged in :mod:`hf_distprof.analysis.judge.verdicts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hf_distprof.analysis.results.timer import TimerRecords
from hf_distprof.core import names
from hf_distprof.core.names import TIMING_RE
from hf_distprof.core.records import RecordsError, read_records_skipping


def read_timer_records(files: Iterable[str | Path]) -> TimerRecords:
    """The step timer's records in the folders of ``files`` (the traces); empty without any.

    Each line is read by the rule ``compare`` reads it by (:mod:`hf_distprof.core.records`): a line that breaks it is
    left out and listed in ``skipped`` with why (the other lines read), a file that cannot be read likewise.
    """
    out = TimerRecords()
    marks: list[bool] = []
    for folder in sorted({Path(f).parent for f in files}):
        for log in sorted(folder.glob(names.TIMING_LOG_NAME.format(rank="*"))):
            found = TIMING_RE.match(log.name)
            if not found:
                continue
            try:
                rows, bad = read_records_skipping(log)
            except RecordsError as err:
                out.skipped.append((str(log), f"{str(err).removeprefix(str(log)).lstrip(', :')}; the step timer's "
                                    "records of this rank are left out"))
                continue
            if bad:  # the other lines read; the skipped ones said
                more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
                those = "that line is" if len(bad) == 1 else "those lines are"
                kept = "the others read" if rows else "no record of this rank read"
                out.skipped.append((str(log), f"{'; '.join(bad[:3])}{more}: {those} left out, {kept}"))
            rank = int(found.group(1))
            first = True
            for row in rows:
                step = row["step"]
                out.rows.setdefault(rank, {})[step] = row
                marked = isinstance(row.get("warmup"), bool) and isinstance(row.get("traced"), bool)
                marks.append(marked)
                if ((row.get("warmup") is True) if marked else first) or row.get("after_pause") is True:
                    out.warmup.add(step)  # (the step after a checkpoint or an evaluation: left out alike)
                if marked and row["traced"]:
                    out.traced.add(step)
                if row.get("profiler_busy") is True:
                    out.busy.add(step)
                first = False
    out.marked = bool(marks) and all(marks)
    return out
