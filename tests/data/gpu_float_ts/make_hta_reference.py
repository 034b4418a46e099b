"""Write ``hta_reference/hta_0.5.0.json``: what Holistic Trace Analysis 0.5.0 reports for the traces beside this file.

Not run by the tests (HTA needs pandas and is not a dependency); run it by hand in its own environment::

    python3 -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0
    /tmp/htavenv/bin/python tests/data/gpu_float_ts/make_hta_reference.py

It calls HTA's analyses with their defaults (``visualize=False``): ``get_temporal_breakdown``,
``get_comm_comp_overlap``, ``get_gpu_kernel_breakdown`` (the kernel-type table and the per-kernel table) and
``get_idle_time_breakdown``, and stores their rows as lists of objects, one per DataFrame row.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _rows(df: Any) -> list[dict[str, Any]]:
    out = []
    for row in df.reset_index(drop=df.index.name is None).to_dict(orient="records"):
        clean = {}
        for key, value in row.items():
            value = value.item() if hasattr(value, "item") else value
            clean[str(key)] = None if isinstance(value, float) and math.isnan(value) else value
        out.append(clean)
    return out


def main() -> None:
    from hta.trace_analysis import TraceAnalysis
    from importlib.metadata import version

    analyzer = TraceAnalysis(trace_dir=str(HERE))
    kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)
    idle, _ = analyzer.get_idle_time_breakdown(visualize=False)
    reference = {
        "hta_version": version("HolisticTraceAnalysis"),
        "temporal_breakdown": _rows(analyzer.get_temporal_breakdown(visualize=False)),
        "comm_comp_overlap": _rows(analyzer.get_comm_comp_overlap(visualize=False)),
        "kernel_type_breakdown": _rows(kernel_types),
        "kernel_breakdown": _rows(kernels),
        "idle_time_breakdown": _rows(idle),
    }
    # In a folder of its own: HTA reads every *.json beside the traces as one more trace.
    (HERE / "hta_reference" / "hta_0.5.0.json").write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
