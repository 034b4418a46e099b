"""Write the small synthetic 4-rank NCCL GPU traces ``rank-N.json.gz`` beside this file.

Run from the repository root (deterministic: the same bytes every time)::

    python tests/data/gpu_float_ts/make_traces.py

What the traces hold, per rank (4 ranks, ``distributedInfo`` backend nccl, world size 4), over 3 steps
(``ProfilerStep#5`` to ``#7``):

- Timestamps and durations in float microseconds with fractional parts, relative to
  ``baseTimeNanoseconds`` (as recent Kineto writes them). Back-to-back kernels on the compute stream overlap
  by 0.375 us, as Kineto's rounded timestamps make them (pytorch/pytorch#122425): an analyzer that does not
  round GPU times inward like HTA does counts that overlap and gets other idle and overlap times.
- ``cudaLaunchKernel`` / ``cudaMemcpyAsync`` runtime events with correlation ids, one per GPU event.
- Compute kernels (a GEMM and an elementwise kernel per layer), a host-to-device copy per step, and two
  collectives per step on stream 20, launched under ``nccl:*`` annotations: an all-reduce whose kernel uses
  the newer naming (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``) and an all-gather with the older one
  (``ncclKernel_AllGather_RING_LL_Sum_int8_t``). A real trace has one naming scheme; here both are read.
- Rank 2 computes 40% longer than the others, so it is the last to reach each collective: its peers wait
  inside the NCCL kernels, which all end together, and its busy time stands out.

``hta_reference/hta_0.5.0.json`` is what Holistic Trace Analysis 0.5.0 reports for these files
(``make_hta_reference.py``; not run by the tests).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLD = 4
STEPS = (5, 6, 7)
SLOW_RANK, SLOW = 2, 1.4
STEP_US = 3000.0
LAYERS = 3
COMPUTE_STREAM, NCCL_STREAM = 7, 20
OVERLAP_US = 0.375  # back-to-back kernels overlapping by a rounding error
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ALLGATHER = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, Func, Array)"
MEMCPY = "Memcpy HtoD (Pinned -> Device)"


class Rank:
    """One rank's event list, with its CPU clock (the main thread) and its two GPU stream clocks."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.pid = 4000 + rank
        self.events: list[dict] = []
        self.corr = 100 * (rank + 1)
        self.stream_free = {COMPUTE_STREAM: 0.0, NCCL_STREAM: 0.0}

    def cpu(self, cat: str, name: str, ts: float, dur: float, **args: object) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.pid, "ts": round(ts, 3),
                            "dur": round(dur, 3), "args": args})

    def launch(self, ts: float, cat: str, name: str, dur: float, stream: int, delay: float = 6.125,
               start: float | None = None) -> tuple[float, float]:
        """A runtime call at ``ts`` and its GPU event: queued behind the stream, else ``delay`` after the call."""
        self.corr += 1
        runtime = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.cpu("cuda_runtime", runtime, ts, 4.25, correlation=self.corr, cbid=211)
        free = self.stream_free[stream]
        if start is None:
            start = free - OVERLAP_US if free > ts + delay else ts + delay
        start, dur = round(start, 3), round(dur, 3)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.rank, "tid": stream, "ts": start,
                            "dur": dur, "args": {"device": self.rank, "stream": stream, "correlation": self.corr}})
        self.stream_free[stream] = start + dur
        return start, start + dur


def compute_us(rank: int, base: float) -> float:
    return base * (SLOW if rank == SLOW_RANK else 1.0)


def build() -> list[Rank]:
    ranks = [Rank(r) for r in range(WORLD)]
    for i, step in enumerate(STEPS):
        t0 = 1000.0 + i * STEP_US
        # Each rank's CPU reaches the all-reduce when its backward has been issued; the kernel of the last
        # rank to launch sets the collective's end for everyone (times on one host share a clock).
        arrive: dict[int, float] = {}
        for rk in ranks:
            r = rk.rank
            rk.cpu("user_annotation", f"ProfilerStep#{step}", t0 + 0.5 + 0.25 * r, STEP_US - 20.125)
            t = t0 + 3.5
            rk.cpu("cpu_op", "aten::copy_", t, 9.5)
            rk.launch(t + 2.0, "gpu_memcpy", MEMCPY, 12.625, COMPUTE_STREAM)
            t += 14.0
            for layer in range(LAYERS):  # forward
                rk.cpu("cpu_op", "aten::mm", t, 11.75)
                rk.launch(t + 3.0, "kernel", GEMM, compute_us(r, 140.4375 + 10 * layer), COMPUTE_STREAM)
                rk.cpu("cpu_op", "aten::gelu", t + 14.0, 8.5)
                rk.launch(t + 15.5, "kernel", ELEMENTWISE, compute_us(r, 20.3125), COMPUTE_STREAM)
                t += 26.0
            for layer in range(LAYERS):  # backward: two GEMMs per layer
                rk.cpu("cpu_op", "autograd::engine::evaluate_function: MmBackward0", t, 20.0)
                rk.launch(t + 2.0, "kernel", GEMM, compute_us(r, 150.8125 + 5 * layer), COMPUTE_STREAM)
                rk.launch(t + 9.0, "kernel", GEMM, compute_us(r, 130.0625), COMPUTE_STREAM)
                t += 24.0
            # The all-reduce is issued behind the last backward kernels: its kernel starts when they are done.
            arrive[r] = rk.stream_free[COMPUTE_STREAM] + 1.5
        end = max(arrive.values()) + 180.6875
        for rk in ranks:
            r = rk.rank
            t = t0 + 14.0 + 26.0 * LAYERS + 24.0 * LAYERS + 2.0
            rk.cpu("user_annotation", "nccl:all_reduce", t, 18.25)
            rk.cpu("cpu_op", "record_param_comms", t + 1.0, 16.0)
            rk.launch(t + 5.0, "kernel", ALLREDUCE, end - arrive[r], NCCL_STREAM, start=arrive[r])
            # The optimizer overlaps the all-reduce's tail on the compute stream (it waits for nothing here).
            t += 22.0
            rk.cpu("cpu_op", "aten::_foreach_add_", t, 15.0)
            rk.launch(t + 2.0, "kernel", ELEMENTWISE, compute_us(r, 60.5625), COMPUTE_STREAM)
            # The all-gather of the next step's parameters, after the all-reduce on the same stream.
            gather_start = max(end, rk.stream_free[COMPUTE_STREAM]) + 3.25
            rk.cpu("user_annotation", "nccl:_all_gather_base", t + 20.0, 12.5)
            rk.launch(t + 22.0, "kernel", ALLGATHER, 90.3125 + 0.5 * r, NCCL_STREAM, start=gather_start)
    return ranks


def document(rk: Rank) -> dict:
    meta = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": rk.pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": rk.rank, "tid": 0, "args": {"labels": f"GPU {rk.rank}"}},
    ] + [
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": rk.rank, "tid": s, "args": {"name": f"stream {s} "}}
        for s in (COMPUTE_STREAM, NCCL_STREAM)
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": rk.rank, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045379072}],
        "distributedInfo": {"backend": "nccl", "rank": rk.rank, "world_size": WORLD},
        "traceEvents": meta + sorted(rk.events, key=lambda e: (e["ts"], e["pid"], e["tid"])),
        "traceName": f"rank-{rk.rank}.json",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }


def main() -> None:
    for rk in build():
        # ": " as Kineto writes it: HTA finds the rank with the pattern '"rank":\\s+(\\d+)'.
        data = json.dumps(document(rk), separators=(",", ": ")).encode()
        # mtime=0: the same bytes on every run.
        (HERE / f"rank-{rk.rank}.json.gz").write_bytes(gzip.compress(data, mtime=0))


if __name__ == "__main__":
    main()
