"""Why the traces read miss waits that may matter, in words: lost files, ranks that took no window by choice."""

from __future__ import annotations

from hf_distprof.analysis.results.facts import Coverage
from hf_distprof.core.text import format_ranks


def unread_words(missing: list[int], coverage: Coverage | None,
                 ended: dict[int, str] | None = None) -> tuple[str, str]:
    """Why the traces read miss waits that may matter, and what to do: ranks that died (``ended``: crashed, or never
    reached train end), lost files (the rest of ``missing``), ranks that took no window by choice (``coverage``),
    each said as what it is."""
    whys, dos, waited = [], [], list(missing)
    ended = ended or {}
    crashed = [r for r in missing if ended.get(r) in ("crashed", "raised")]
    unfinished = [r for r in missing if ended.get(r) == "unfinished"]
    for how, name, what in (("crashed", "crash", "the stack"), ("raised", "exception", "the traceback")):
        died = [r for r in crashed if ended.get(r) == how]
        if died:
            files = ", ".join(f"rank{r}_{name}.txt" for r in died)
            whys.append(f"{format_ranks(died)} {'crashed' if how == 'crashed' else 'raised an exception'} and left "
                        f"no trace ({files} holds {what})")
    if crashed:
        dos.append("hf-distprof hang-report RUN_FOLDER says where it died; fix that, then profile again")
    if unfinished:
        whys.append(f"{format_ranks(unfinished)} never reached train end (it died or was stopped) and left no trace")
        dos.append("hf-distprof hang-report RUN_FOLDER says how it ended (killed, stopped), and rank<R>.log its last "
                   "words")
    missing = [r for r in missing if r not in crashed and r not in unfinished]
    if missing:
        unread = format_ranks(missing)
        traces = "the traces of" if len(missing) > 1 else "the trace of"
        whys.append(f"{traces} {unread} {'are' if len(missing) > 1 else 'is'} not among those read (not given, or "
                    "could not be read)")
        dos.append(f"analyse the run with {traces} {unread} (a file that could not be read is named with its reason)")
    if coverage is not None:
        named = f"rank {coverage.slow}, which the step timer names as holding the others back over the run,"
        if coverage.slow is None:
            waited += coverage.untraced
            whys.append(f"{format_ranks(coverage.untraced)} took no profiler window (--profile-ranks) and no step "
                        "timer verdict says whether a rank holds the others back")
            dos.append("keep the step timer on (its verdict over the run decides), or trace every rank")
        elif coverage.windows:
            waited.append(coverage.slow)
            spans = ", ".join(f"{a}-{b}" for a, b in coverage.windows)
            whys.append(f"{named} was not traced in the window{'s' if len(coverage.windows) > 1 else ''} of steps "
                        f"{spans} (--profile-ranks)")
            dos.append(f"trace rank {coverage.slow} in every window (--profile-ranks auto picks it once the step "
                       "timer has seen it)")
        else:
            waited.append(coverage.slow)
            whys.append(f"{named} took no profiler window (--profile-ranks)")
            dos.append(f"trace rank {coverage.slow} too (--profile-ranks auto picks it)")
    who = format_ranks(sorted(set(waited)))
    return (f"{'; and '.join(whys)}, so the other ranks' time in collectives cannot be told apart into waiting for "
            f"{who} and the transfer"), "; ".join(dos)
