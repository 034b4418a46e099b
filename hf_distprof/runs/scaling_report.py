"""A :class:`~hf_distprof.runs.scaling.ScalingResult` as files: ``scaling.csv``, ``scaling.json``, ``scaling.png``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hf_distprof.core import names
from hf_distprof.runs.scaling import ScalingResult, scaling_csv
from hf_distprof.core.files import atomic_path, atomic_write_text


def _plot(result: ScalingResult, out: Path) -> None:
    """Throughput against process count next to the ideal linear line, and the efficiency under it."""
    import matplotlib

    matplotlib.use("Agg")  # no display: written on headless hosts too
    import matplotlib.pyplot as plt

    n = [p.nproc for p in result.points]
    base = result.points[0]
    measured = [p.samples_per_s for p in result.points]
    ideal = [base.samples_per_s * k / base.nproc for k in n]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(n, ideal, "--", color="grey", label=f"ideal (linear from {base.nproc})")
    left.plot(n, measured, "o-", color="#4c72b0", label="measured")
    left.set_xlabel("processes")
    left.set_ylabel("samples/s (all ranks)")
    left.set_xticks(n)
    left.set_ylim(bottom=0)
    left.set_title(f"{result.mode} scaling: throughput", fontsize=10)
    left.legend(fontsize=8)
    right.axhline(100.0, linestyle="--", color="grey", label="ideal")
    right.plot(n, [p.efficiency_pct for p in result.points], "o-", color="#dd8452", label="efficiency")
    right.set_xlabel("processes")
    right.set_ylabel("efficiency %")
    right.set_xticks(n)
    right.set_ylim(0, max(110.0, max(p.efficiency_pct for p in result.points) * 1.1))
    right.set_title("efficiency = speedup / (n / n0)", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_scaling_files(result: ScalingResult, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``scaling.csv``, ``scaling.json`` and ``scaling.png`` into ``out_dir`` (atomically).

    Args:
        result: The study.
        out_dir: The study's ``--output-dir``.

    Returns:
        File kind (``csv``, ``json``, ``png``) -> path.

    Raises:
        OSError: A file cannot be written.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": out / names.SCALING_CSV, "json": out / names.SCALING_JSON, "png": out / names.SCALING_PNG}
    atomic_write_text(files["csv"], scaling_csv(result))
    atomic_write_text(files["json"], json.dumps(result.to_json(), indent=2) + "\n")
    with atomic_path(files["png"], suffix=".png") as tmp:  # matplotlib picks the format by suffix
        _plot(result, tmp)
    return files
