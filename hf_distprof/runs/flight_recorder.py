"""The NCCL flight recorder's dumps (``flight_recorder_rank{R}_{host}.pkl``, written beside a hang dump where torch
records): each rank's last collective, and which ranks never reached the others' (:mod:`hf_distprof.runs.hang_report`
reads them). Plain-data pickles only; no torch import."""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RECORDER = re.compile(r"^flight_recorder_rank(?P<rank>\d+)_(?P<host>.+)\.pkl$")


@dataclass
class Recorder:
    """The last collective of one rank in its NCCL flight recorder."""

    rank: int
    seq: int | None
    name: str | None
    state: str | None
    sizes: Any = None


class _PlainUnpickler(pickle.Unpickler):
    """Loads only plain data (dicts, lists, strings, numbers): a flight-recorder dump holds nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain data is expected")


def parse_recorder(path: Path) -> Recorder:
    """The last collective of one rank's flight-recorder dump (plain-data pickle only).

    A field of another type than the recorder writes (a dump from another tool, or edited) is read as absent.

    Raises:
        ValueError: Not a readable flight-recorder dump (the message names the file).
    """
    match = _RECORDER.match(path.name)
    if match is None:
        raise ValueError(f"{path}: not a flight-recorder dump (expected flight_recorder_rank<R>_<host>.pkl)")
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: not a readable flight-recorder dump: {err}") from None
    except (AttributeError, IndexError, KeyError, OverflowError, TypeError) as err:  # malformed opcodes
        raise ValueError(f"{path}: not a readable flight-recorder dump: {err!r}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: no 'entries' list in the flight-recorder dump")
    numbered = [e for e in entries if isinstance(e, dict) and not e.get("is_p2p") and _seq(e) is not None]
    if not numbered:
        return Recorder(int(match["rank"]), None, None, None)
    last = max(numbered, key=lambda e: _seq(e) or 0)
    name, state = last.get("profiling_name"), last.get("state")
    return Recorder(
        int(match["rank"]), _seq(last), name if isinstance(name, str) else None,
        state if isinstance(state, str) else None, _shapes(last.get("input_sizes")),
    )


def _seq(entry: dict[str, Any]) -> int | None:
    seq = entry.get("collective_seq_id")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _shapes(sizes: Any) -> list[list[int]] | None:
    """Input sizes as the recorder writes them (a list of shapes, each a list of ints), else None."""
    if not isinstance(sizes, list) or not all(isinstance(s, list) for s in sizes):
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for s in sizes for d in s):
        return None
    return sizes


def recorder_lines(recorders: dict[int, Recorder]) -> list[str]:
    """The report's lines on the flight recorders: each rank's last collective, and who never reached the last."""
    if not recorders:
        return []
    lines = ["flight recorder (last collective per rank):"]
    for rank in sorted(recorders):
        r = recorders[rank]
        lines.append(f"  rank {rank}: #{r.seq} {r.name} ({r.state}), input sizes {r.sizes}")
    seqs = {r.seq for r in recorders.values() if r.seq is not None}
    if len(seqs) > 1:
        top = max(seqs)
        behind = sorted(rank for rank, r in recorders.items() if r.seq is not None and r.seq < top)
        lines.append(f"  => rank(s) {behind} never reached collective #{top}: the others wait for them there")
    else:
        at_top = [r for r in recorders.values() if r.seq is not None]
        if len({(r.name, str(r.sizes)) for r in at_top}) > 1:
            lines.append("  => mismatched collectives at the same sequence number: "
                         + "; ".join(f"rank {r.rank}: {r.name} {r.sizes}" for r in at_top))
    return lines
