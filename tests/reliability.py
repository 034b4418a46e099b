"""The reliability table: every fault a test injects, whether the run survived it and what it cost in files.

Fault tests call :func:`record`; ``tests/conftest.py`` prints the table at the end of the session (pytest's
terminal summary), and DEVELOPING.md quotes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One injected fault.

    Attributes:
        fault: What was done to the run.
        survived: The run behaved as promised (training went on, or the process ended with the signal's status).
        expected: Files that should exist afterwards (traces, summaries, written before or during the fault).
        present: How many of those exist, whole.
        temp_left: Temporary files left behind.
    """

    fault: str
    survived: bool
    expected: int
    present: int
    temp_left: int

    @property
    def lost(self) -> int:
        return self.expected - self.present


ROWS: list[Row] = []


def record(fault: str, *, survived: bool, expected: int, present: int, temp_left: int) -> None:
    """Add one fault's outcome to the table (call it before asserting, so failures show too)."""
    ROWS.append(Row(fault, survived, expected, present, temp_left))


def table(rows: list[Row]) -> str:
    """The Markdown table of ``rows`` plus a totals line."""
    lines = [
        "| fault injected | survived | files expected | files written | files lost | temp files left |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.fault} | {'yes' if r.survived else 'NO'} | {r.expected} | {r.present} | {r.lost} "
                     f"| {r.temp_left} |")
    survived = sum(r.survived for r in rows)
    lines.append(f"| **{len(rows)} faults** | **{survived} survived** | {sum(r.expected for r in rows)} "
                 f"| {sum(r.present for r in rows)} | {sum(r.lost for r in rows)} | {sum(r.temp_left for r in rows)} |")
    return "\n".join(lines)
