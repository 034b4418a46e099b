"""``hf-distprof bench-collectives``: bus bandwidth of each collective over a range of sizes, nccl-tests style."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hf_distprof.collectives import bench as collbench
from hf_distprof.core import names
from hf_distprof.core.argtypes import checked, number


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench-collectives`` on the ``hf-distprof`` sub-parsers.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers``.

    Returns:
        The sub-parser.
    """
    parser = subparsers.add_parser(
        "bench-collectives",
        help="collective bandwidth benchmark, nccl-tests style (run it under torchrun or accelerate launch)",
        description=(
            "Time all_reduce, all_gather, reduce_scatter, broadcast and all_to_all over a range of message sizes "
            "on every rank (NCCL on GPU, gloo on CPU), check each result, and print time, algbw and busbw with "
            "nccl-tests' formulas, the time being the slowest rank's. Rank 0 prints the table and writes "
            f"{names.BENCH_CSV_NAME} and {names.BENCH_PNG_NAME}. Exit status 0 when every result was correct, "
            "1 when one was not, 2 on bad arguments or an unwritable --output-dir."
        ),
    )
    parser.add_argument("--ops", type=checked(collbench.parse_ops), default=collbench.OPS, metavar="OP[,OP...]",
                        help=f"collectives to run (default: all: {','.join(collbench.OPS)})")
    parser.add_argument("--sizes", type=checked(collbench.parse_sizes), default=None, metavar="SIZES",
                        help=f"message sizes S: {collbench.SIZES_HELP} (default: {collbench.DEFAULT_SIZES_GPU} "
                             f"on GPU, {collbench.DEFAULT_SIZES_CPU} on CPU)")
    parser.add_argument("--dtype", choices=tuple(collbench.DTYPE_BYTES), default="float32",
                        help="element type (default: float32)")
    parser.add_argument("--warmup", type=number(int, 0, 10_000), default=5, metavar="N",
                        help="untimed runs per op and size, after the checked one (0 to 10000, default: 5)")
    parser.add_argument("--iters", type=number(int, 1, 100_000), default=20, metavar="N",
                        help="timed runs per op and size (1 to 100000, default: 20)")
    parser.add_argument("--output-dir", default=".", metavar="DIR",
                        help=f"folder for {names.BENCH_CSV_NAME} and {names.BENCH_PNG_NAME} (default: .)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on rank 0 (default: shown when stderr is a terminal)")
    return parser


def _write(rows: list[collbench.BenchRow], output_dir: str) -> int:
    """Rank 0: the CSV and the PNG; 2 when they cannot be written."""
    folder = Path(output_dir)
    csv_path, png_path = folder / names.BENCH_CSV_NAME, folder / names.BENCH_PNG_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        collbench.write_csv(rows, csv_path)
        collbench.plot_busbw(rows, png_path)
    except OSError as exc:
        print(f"hf-distprof bench-collectives: error: --output-dir {output_dir}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    print(f"wrote {csv_path} and {png_path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark on this rank (every rank of the launch runs this).

    Returns:
        0 when every checked result was right, 1 when one was wrong (on every rank), 2 when rank 0 cannot
        write its files.
    """
    import torch.distributed as dist

    from hf_distprof.collectives.run import BenchConfig, init_group, run_benchmark

    group = init_group()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        # The folder rank 0 writes to, checked before the benchmark (not after it, its table printed and its files
        # lost), and said on every rank, so that all of them stop together.
        from hf_distprof.cli.analyze import unwritable_folder

        problem = [unwritable_folder(Path(args.output_dir)) if rank == 0 else None]
        if world > 1:
            dist.broadcast_object_list(problem, src=0)
        if problem[0] is not None:
            if rank == 0:
                print(f"hf-distprof bench-collectives: error: --output-dir {args.output_dir}: {problem[0]}",
                      file=sys.stderr)
            return 2
        default = collbench.DEFAULT_SIZES_GPU if group.device.type == "cuda" else collbench.DEFAULT_SIZES_CPU
        progress = sys.stderr.isatty() if args.progress is None else args.progress
        config = BenchConfig(ops=args.ops, sizes=args.sizes or collbench.parse_sizes(default), dtype=args.dtype,
                             warmup=args.warmup, iters=args.iters, progress=progress)
        if rank == 0:
            print(f"hf-distprof bench-collectives: {world} rank(s), backend {group.backend} on {group.device.type}, "
                  f"{config.dtype}, {config.warmup} warm-up + {config.iters} timed runs per op and size; time: the "
                  "slowest rank's mean per run; GB/s = 1e9 bytes/s; busbw = algbw x 2(n-1)/n (all_reduce), "
                  "(n-1)/n (all_gather, reduce_scatter, all_to_all), 1 (broadcast)", flush=True)
        rows = run_benchmark(config, group)
        status = 1 if any(row.status == collbench.STATUS_FAILED for row in rows) else 0
        if rank == 0:
            print(collbench.format_table(rows), flush=True)
            status = _write(rows, args.output_dir) or status
            if any(row.status == collbench.STATUS_FAILED for row in rows):
                print("hf-distprof bench-collectives: FAILED: a collective gave a wrong result", file=sys.stderr)
        return status
    finally:
        if group.owned:
            dist.destroy_process_group()
