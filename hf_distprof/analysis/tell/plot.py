"""What every figure of the report shares: matplotlib without a display, and one tail (laid out, written, closed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (the report is written on headless hosts too), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path) -> None:
    """The tail of every plot of the report: laid out, written at 110 dpi, closed."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
