"""Parsing: one trace file -> the few compact event lists the analyzers need.

Only complete events (``ph == "X"``) that some analyzer reads are kept, as tuples of plain numbers and
interned names: profiler steps, CPU ops and annotations per thread, ``gloo:*`` collective spans, GPU
kernels/memcpy/memset, and the correlation id -> timestamp of each CUDA launch. A 50 MB trace becomes a
few MB of tuples.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_distprof.analysis.trace_io import TraceReadError, iter_trace_events, trace_rank

# Event categories on CPU threads that can never be GPU activity; any other category is a GPU event when
# its args carry an integer "stream" (HTA's rule), so new Kineto GPU categories are not missed.
_CPU_CATS = frozenset(
    {
        "cpu_op",
        "user_annotation",
        "python_function",
        "cuda_runtime",
        "cuda_driver",
        "cpu_instant_event",
        "Trace",
        "fwdbwd",
        "ac2g",
        "overhead",
        "gpu_user_annotation",
        "Runtime",
        "Kernel launch",
    }
)
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
STEP_PREFIX = "ProfilerStep#"

# (start_us, end_us, name)
Span = tuple[float, float, str]


@dataclass(frozen=True)
class Step:
    """One ``ProfilerStep#N`` annotation: the CPU-side extent of a profiled step."""

    number: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Wall time of the step on the CPU, in microseconds."""
        return self.end - self.start


@dataclass
class GpuEvent:
    """GPU activity columns (kernels, memcpy, memset), one list entry per event, in file order."""

    start: list[int | float] = field(default_factory=list)
    end: list[int | float] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    correlation: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class ParsedTrace:
    """What the analyzers read from one rank's trace. Timestamps are the trace's own, in microseconds."""

    path: str
    rank: int
    world_size: int | None
    backend: str | None
    host: str | None
    base_time_ns: int
    steps: list[Step]
    main_tid: Any
    main_ops: list[Span]  # cpu_op and user_annotation events on the thread that runs the steps
    comm_spans: list[Span]  # gloo:* spans (any thread): the time collectives take on CPU backends
    c10d_ops: list[Span]  # c10d::* ops on the main thread: they name the collectives
    gpu: GpuEvent
    launches: dict[int, float]  # correlation id -> CPU timestamp of the CUDA launch
    n_events: int


def _round_like_hta(ts: float, dur: float) -> tuple[int | float, int | float]:
    # HTA rounds nanosecond-resolution timestamps inward (ceil start, floor end) so that back-to-back
    # kernels do not overlap by a fraction of a microsecond (pytorch/pytorch#122425); do the same so
    # that our numbers match its numbers.
    if isinstance(ts, float):
        end = ts + dur
        return math.ceil(ts), math.floor(end)
    return ts, ts + dur


def parse_trace(path: str | os.PathLike[str]) -> ParsedTrace:
    """Read one trace file into a :class:`ParsedTrace`.

    Args:
        path: A Kineto trace (``.json`` or ``.json.gz``).

    Returns:
        The compact events of that trace.

    Raises:
        TraceReadError: The file cannot be read or parsed, has no rank, or has no ``ProfilerStep#N``.
    """
    path = Path(path)
    meta: dict[str, Any] = {}
    by_tid: dict[Any, list[Span]] = {}
    steps_by_tid: dict[Any, list[Step]] = {}
    comm_spans: list[Span] = []
    gpu = GpuEvent()
    launches: dict[int, float] = {}
    n_events = 0
    intern = sys.intern
    for chunk in iter_trace_events(path, meta):
        n_events += len(chunk)
        for ev in chunk:
            if type(ev) is not dict:
                raise TraceReadError(path, f"not a trace: traceEvents holds a {type(ev).__name__}")
            cat = ev.get("cat")
            if cat == "cpu_op" or cat == "user_annotation":
                dur = ev.get("dur")
                if dur is None:
                    continue
                ts = ev["ts"]
                name = intern(ev["name"])
                tid = ev.get("tid")
                spans = by_tid.get(tid)
                if spans is None:
                    spans = by_tid[tid] = []
                spans.append((ts, ts + dur, name))
                if cat == "user_annotation":
                    if name.startswith(STEP_PREFIX):
                        number = _step_number(name)
                        if number is not None:
                            steps_by_tid.setdefault(tid, []).append(Step(number, ts, ts + dur))
                    elif name.startswith("gloo:"):
                        comm_spans.append((ts, ts + dur, name))
            elif cat in _GPU_CATS or (cat not in _CPU_CATS and cat is not None):
                dur = ev.get("dur")
                args = ev.get("args")
                if dur is None or not isinstance(args, dict):
                    continue
                stream = _as_int(args.get("stream"))
                if stream is None:
                    continue
                start, end = _round_like_hta(ev["ts"], dur)
                gpu.start.append(start)
                gpu.end.append(end)
                gpu.name.append(intern(ev["name"]))
                gpu.stream.append(stream)
                corr = _as_int(args.get("correlation"))
                gpu.correlation.append(-1 if corr is None else corr)
            elif cat in _LAUNCH_CATS:
                args = ev.get("args")
                if isinstance(args, dict):
                    corr = args.get("correlation")
                    if corr is not None:
                        launches[corr] = ev["ts"]
    if n_events == 0:
        raise TraceReadError(path, "trace has no events")
    rank = trace_rank(path, meta)
    if not steps_by_tid:
        raise TraceReadError(
            path,
            f"no ProfilerStep#N events among {n_events} events (record with torch.profiler and "
            "call prof.step() once per training step)",
        )
    # The thread that annotates the steps is the training loop's thread.
    main_tid = max(steps_by_tid, key=lambda t: len(steps_by_tid[t]))
    steps = sorted(steps_by_tid[main_tid], key=lambda s: s.start)
    main_ops = by_tid.get(main_tid, [])
    main_ops.sort()
    c10d_ops = [s for s in main_ops if s[2].startswith("c10d::")]
    comm_spans.sort()
    raw_info = meta.get("distributedInfo")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    return ParsedTrace(
        path=str(path),
        rank=rank,
        world_size=_as_int(info.get("world_size")),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        host=meta.get("host_name") if isinstance(meta.get("host_name"), str) else None,
        base_time_ns=_as_int(meta.get("baseTimeNanoseconds")) or 0,
        steps=steps,
        main_tid=main_tid,
        main_ops=main_ops,
        comm_spans=comm_spans,
        c10d_ops=c10d_ops,
        gpu=gpu,
        launches=launches,
        n_events=n_events,
    )


def _step_number(name: str) -> int | None:
    try:
        return int(name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def _as_int(value: Any) -> int | None:
    """``int(value)`` for ints and integer strings (HTA's stream normalisation), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None
