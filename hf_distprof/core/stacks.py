"""Every thread's Python stack as text, in the format ``hf-distprof hang-report`` reads (the hang dumps, the stop
files): no torch import."""

from __future__ import annotations

import sys
import threading
import traceback
from typing import Any


def format_stacks(frames: dict[int, Any] | None = None) -> str:
    """Every thread's Python stack, innermost frame last, under a ``Thread <name> (ident N[, main])`` line."""
    frames = sys._current_frames() if frames is None else frames
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    # The main thread first: that is where training runs.
    for ident in sorted(frames, key=lambda i: (i != main, i)):
        flag = ", main" if ident == main else ""
        where = frames[ident]  # a live frame, or a stack taken earlier (a signal's arrival)
        stack = "".join(traceback.format_list(where) if isinstance(where, traceback.StackSummary)
                        else traceback.format_stack(where))
        parts.append(f"Thread {names.get(ident, '?')} (ident {ident}{flag}):\n{stack}")
    return "\n".join(parts)
