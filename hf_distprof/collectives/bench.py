"""The collective bandwidth benchmark's pure parts: sizes, input patterns, result rows, CSV, table, plot.

``hf-distprof bench-collectives`` (:mod:`hf_distprof.cli.bench_collectives`) times each collective over a
range of message sizes, like nccl-tests' ``*_perf`` programs; :mod:`hf_distprof.collectives.run` does the
timing with torch. Everything here is plain Python, so that it is unit-tested without a process group and
the trace analysis can read a saved CSV as its reference bandwidth (``analyze --bandwidth-ref``).

The size S of a row, algbw = S / t and busbw = algbw x the kind's factor are the ones the trace analysis
uses (:func:`hf_distprof.analysis.read.message_sizes.message_bytes`,
:func:`~hf_distprof.analysis.across.bandwidth.bus_factor`), so a benchmark row and a trace's bandwidth row compare
directly.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hf_distprof.analysis.across.bandwidth import bus_factor
from hf_distprof.analysis.read.message_sizes import message_bytes
from hf_distprof.analysis.results.across import ReferencePoint
from hf_distprof.core.files import atomic_path, atomic_write_text

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
# Bytes per element of each --dtype.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
# Every integer up to this is exact in the dtype (24, 8 and 11 significand bits), so sums of small integers
# that stay below it come out exact whatever order the backend adds them in.
EXACT_INT_LIMIT: dict[str, int] = {"float32": 2**24, "bfloat16": 2**8, "float16": 2**11}
# Gathered, broadcast and exchanged values cycle through 1..TAGS: exact in every dtype.
TAGS = 251
# Defaults: nccl-tests' usual sweep on GPU; on CPU a smaller one, ~10 s on 2 gloo ranks.
DEFAULT_SIZES_GPU = "1K:64M"
DEFAULT_SIZES_CPU = "1K:1M:4"
MIN_SIZE = 4
MAX_SIZE = 8 << 30
MAX_SIZES = 64
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)
SIZES_HELP = (
    f"a list like 1K,1M,16M or a range START:END[:FACTOR] like 1K:64M (x2 steps) or 1K:64M:4; "
    f"K/M/G are binary; each size from {MIN_SIZE} B to 8G, at most {MAX_SIZES} sizes"
)
STATUS_OK, STATUS_FAILED, STATUS_SKIPPED = "ok", "FAILED", "skipped"


def parse_size(text: str) -> int:
    """One size like ``4096``, ``64K``, ``16M``, ``1G`` (binary units; ``KiB``/``KB`` read as ``K``).

    Raises:
        ValueError: Not a size, or outside [MIN_SIZE, MAX_SIZE].
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size ({SIZES_HELP})")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"{text.strip()} is out of range ({SIZES_HELP})")
    return size


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: a comma list of sizes, or a range ``START:END[:FACTOR]`` (geometric, END included when hit).

    Returns:
        The sizes in bytes, ascending, without duplicates.

    Raises:
        ValueError: A bad size, an empty list, a range with END < START or FACTOR < 2, or too many sizes.
    """
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"{text!r} is not a range ({SIZES_HELP})")
        start, end = parse_size(parts[0]), parse_size(parts[1])
        factor_text = parts[2].strip() if len(parts) == 3 else "2"
        factor = int(factor_text) if factor_text.isdigit() else 0
        if factor < 2 or end < start:
            raise ValueError(f"{text!r}: a range needs START <= END and an integer FACTOR >= 2 ({SIZES_HELP})")
        sizes = [start]
        while sizes[-1] * factor <= end and len(sizes) <= MAX_SIZES:
            sizes.append(sizes[-1] * factor)
    else:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
        if not sizes:
            raise ValueError(f"no size given ({SIZES_HELP})")
    sizes = sorted(set(sizes))
    if len(sizes) > MAX_SIZES:
        raise ValueError(f"{text!r} gives {len(sizes)} sizes ({SIZES_HELP})")
    return sizes


def parse_ops(text: str) -> tuple[str, ...]:
    """``--ops``: a comma list of :data:`OPS`, run in :data:`OPS`' order.

    Raises:
        ValueError: An unknown op, or none.
    """
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [op for op in asked if op not in OPS]
    if not asked:
        raise ValueError(f"names no op; choose from {','.join(OPS)}")
    if unknown:
        raise ValueError(f"{', '.join(unknown)} {'is not an op' if len(unknown) == 1 else 'are not ops'}; choose "
                         f"from {','.join(OPS)}")
    return tuple(op for op in OPS if op in asked)


def size_label(size: int) -> str:
    """A size in the largest binary unit that divides it: "64 KiB", "1536 B"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def element_count(op: str, size: int, elem_bytes: int, world: int) -> int:
    """Elements of the op's full buffer for a requested size: a multiple of the world size for the ops that
    split it into one block per rank (as nccl-tests round their counts), at least one block."""
    count = max(1, size // elem_bytes)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(world, count - count % world)
    return count


def buffer_bytes(op: str, count: int, elem_bytes: int, world: int) -> tuple[int, int]:
    """(input, output) bytes on one rank for a full buffer of ``count`` elements."""
    full = count * elem_bytes
    if op == "all_gather":
        return full // world, full
    if op == "reduce_scatter":
        return full, full // world
    return full, full


def message_size(op: str, count: int, elem_bytes: int, world: int) -> int:
    """The row's size S, as the trace analysis defines it (:func:`message_bytes`)."""
    size = message_bytes(op, *buffer_bytes(op, count, elem_bytes, world), world)
    assert size is not None  # both sides are known
    return size


def reduction_values(world: int, dtype: str) -> list[int]:
    """Each rank's value in a reduction: 1 + rank % k, with the largest k (at most the world size) whose sum,
    doubled (reduce_scatter weighs blocks by 1 or 2), stays exact in ``dtype``; 1 on the first ranks and 0 on
    the rest in a world too large even for all ones.

    Every partial sum of non-negative integers below the limit is exact, so the result does not depend on
    the order the backend adds in and is checked for equality.
    """
    limit = EXACT_INT_LIMIT[dtype] // 2
    if world > limit:
        return [1 if rank < limit else 0 for rank in range(world)]
    k = max(k for k in range(1, world + 1) if sum(1 + r % k for r in range(world)) <= limit)
    return [1 + rank % k for rank in range(world)]


def tag(*index: int) -> int:
    """A value in 1..TAGS for a rank (or a (sender, receiver) pair): exact in every dtype."""
    flat = 0
    for i in index:
        flat = flat * 65_599 + i
    return flat % TAGS + 1


@dataclass(frozen=True)
class Pattern:
    """What a rank puts in and must get out, as equal blocks of constant values.

    ``inputs`` split the input buffer (of an in-place op, the buffer before it), ``expected`` the output.
    """

    inputs: tuple[int, ...]
    expected: tuple[int, ...]


def pattern(op: str, rank: int, world: int, dtype: str) -> Pattern:
    """Rank-dependent inputs of ``op`` and the exact output they must give on ``rank``.

    - all_reduce: rank r holds v_r everywhere; every rank gets sum(v).
    - all_gather: rank r contributes tag(r); block i of the output is tag(i).
    - reduce_scatter: block j of rank r's input is v_r x w_j (w_j = 1 + j % 2); rank r gets w_r x sum(v).
    - broadcast (root 0): rank r starts with tag(r); every rank ends with tag(0).
    - all_to_all: rank r sends tag(r, j) to rank j; block i of rank r's output is tag(i, r).
    """
    if op == "all_reduce":
        values = reduction_values(world, dtype)
        return Pattern((values[rank],), (sum(values),))
    if op == "all_gather":
        return Pattern((tag(rank),), tuple(tag(i) for i in range(world)))
    if op == "reduce_scatter":
        values = reduction_values(world, dtype)
        weights = [1 + j % 2 for j in range(world)]
        return Pattern(tuple(values[rank] * w for w in weights), (weights[rank] * sum(values),))
    if op == "broadcast":
        return Pattern((tag(rank),), (tag(0),))
    if op == "all_to_all":
        return Pattern(tuple(tag(rank, j) for j in range(world)), tuple(tag(i, rank) for i in range(world)))
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


@dataclass(frozen=True)
class RankOutcome:
    """One rank's measurement of one op and size."""

    time_us: float | None
    """Mean time per iteration; None when the op did not run."""
    wrong: str | None = None
    """What differed from the expected result, when something did."""
    unsupported: str | None = None
    """The backend's refusal, when the op is not supported."""


@dataclass(frozen=True)
class BenchRow:
    """One op and size, over all ranks: a row of the table and the CSV."""

    op: str
    bytes: int
    """S as nccl-tests define it (:func:`message_size`)."""
    elements: int
    """Elements of the full buffer (the all_gather output, the reduce_scatter input)."""
    dtype: str
    world_size: int
    backend: str
    iters: int
    time_us: float | None
    """The slowest rank's mean time per iteration (nccl-tests' ``-a 3``; their default averages the ranks)."""
    algbw_gbps: float | None
    busbw_gbps: float | None
    status: str
    """ok, FAILED (a rank got a wrong result) or skipped (the backend does not support the op)."""
    note: str = ""


CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRow))


def make_row(op: str, count: int, dtype: str, backend: str, iters: int, outcomes: list[RankOutcome]) -> BenchRow:
    """Combine every rank's outcome (in rank order) into one row.

    Time is the slowest rank's; the row FAILED when any rank's result was wrong, skipped when the backend
    refused the op.
    """
    world = len(outcomes)
    size = message_size(op, count, DTYPE_BYTES[dtype], world)

    def row(time_us: float | None, algbw: float | None, busbw: float | None, status: str, note: str) -> BenchRow:
        return BenchRow(op, size, count, dtype, world, backend, iters, time_us, algbw, busbw, status, note)

    refused = next((o.unsupported for o in outcomes if o.unsupported), None)
    if refused is not None:
        return row(None, None, None, STATUS_SKIPPED, f"not supported by {backend}: {refused}")
    times = [o.time_us for o in outcomes if o.time_us is not None]
    time_us = max(times) if len(times) == world else None
    algbw = size / time_us / 1e3 if time_us else None  # bytes per us = MB/s
    factor = bus_factor(op, world)
    busbw = algbw * factor if algbw is not None and factor is not None else None
    wrong = [f"rank {rank}: {o.wrong}" for rank, o in enumerate(outcomes) if o.wrong]
    return row(time_us, algbw, busbw, STATUS_FAILED if wrong else STATUS_OK, "; ".join(wrong))


def csv_text(rows: list[BenchRow]) -> str:
    """The rows as CSV text with a header of :data:`CSV_COLUMNS`; None is an empty cell."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else v for v in asdict(row).values()])
    return out.getvalue()


def write_csv(rows: list[BenchRow], path: Path) -> None:
    """Write the rows to ``path`` atomically."""

    atomic_write_text(path, csv_text(rows))


def _cell(path: Path, line: int, column: str, text: str, kind: type) -> object:
    if kind is str:
        return text
    if text == "" and kind is float:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{path}: line {line}: column {column}: {text!r} is not a{'n' if kind is int else ''} "
                         f"{kind.__name__}") from None


def read_csv(path: str | Path) -> list[BenchRow]:
    """Read a CSV written by :func:`write_csv`.

    Raises:
        OSError: The file cannot be read.
        ValueError: It is not such a CSV (the message names the file, and the line and column at fault).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file ({exc.reason})") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != CSV_COLUMNS:
        raise ValueError(f"{path}: not a bench-collectives CSV: the header must be {','.join(CSV_COLUMNS)}")
    kinds = {"bytes": int, "elements": int, "world_size": int, "iters": int, "time_us": float,
             "algbw_gbps": float, "busbw_gbps": float}
    rows = []
    for line, cells in enumerate(reader, start=2):
        if not cells:
            continue
        if len(cells) != len(CSV_COLUMNS):
            raise ValueError(f"{path}: line {line}: {len(cells)} cells, expected {len(CSV_COLUMNS)}")
        values = {col: _cell(path, line, col, text, kinds.get(col, str)) for col, text in zip(CSV_COLUMNS, cells)}
        rows.append(BenchRow(**values))  # type: ignore[arg-type]
    if not rows:
        raise ValueError(f"{path}: a bench-collectives CSV without a row")
    return rows


def load_reference(path: str | Path) -> list[ReferencePoint]:
    """A saved CSV as the trace analysis' reference bandwidth: its correct rows with a positive busbw.

    Raises:
        OSError: The file cannot be read.
        ValueError: It is not a bench-collectives CSV, or no row can serve (the message names the file).
    """
    points = [ReferencePoint(r.op, r.bytes, r.busbw_gbps, r.world_size) for r in read_csv(path)
              if r.status == STATUS_OK and r.busbw_gbps]
    if not points:
        raise ValueError(f"{path}: no correct row with a positive busbw (a world of one measures a busbw of 0 "
                         "for every op but broadcast: run the benchmark on 2+ ranks)")
    return points


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def format_table(rows: list[BenchRow]) -> str:
    """The terminal table, one line per op and size; an op the backend refused is one line."""
    head = f"{'op':<15} {'size':>9} {'elements':>10} {'time us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10}  check"
    out = [head, "-" * len(head)]
    noted: set[str] = set()
    for row in rows:
        if row.status == STATUS_SKIPPED:
            if row.op not in noted:
                out.append(f"{row.op:<15} skipped: {row.note}")
                noted.add(row.op)
            continue
        time = "-" if row.time_us is None else f"{row.time_us:.1f}"
        check = row.status if row.status == STATUS_OK else f"{row.status}: {row.note}"
        out.append(f"{row.op:<15} {size_label(row.bytes):>9} {row.elements:>10} {time:>10} "
                   f"{_gbps(row.algbw_gbps):>10} {_gbps(row.busbw_gbps):>10}  {check}")
    return "\n".join(out)


def plot_busbw(rows: list[BenchRow], path: Path) -> None:
    """Bus bandwidth against size, one line per op (correct rows only), to a PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")  # headless hosts
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter


    fig, ax = plt.subplots(figsize=(7, 4))
    for op in OPS:
        points = [(r.bytes, r.busbw_gbps) for r in rows if r.op == op and r.status == STATUS_OK and r.busbw_gbps]
        if points:
            ax.plot(*zip(*points), marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(int(x)) if x >= 1 else ""))
    ax.set_xlabel("message size S (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    first = rows[0] if rows else None
    if first is not None:
        ax.set_title(f"bus bandwidth: {first.world_size} rank(s), {first.backend}, {first.dtype}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:  # matplotlib picks the format by suffix
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
