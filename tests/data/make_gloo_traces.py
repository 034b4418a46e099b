"""Regenerate the small 2-rank CPU/gloo test traces under ``tests/data/<scenario>/rank-N.json.gz``.

Run from the repository root::

    python tests/data/make_gloo_traces.py            # every scenario
    python tests/data/make_gloo_traces.py slow_rank1 # one scenario
    GLOO_TRACES_OUT=/tmp/x python tests/data/make_gloo_traces.py slow_rank1  # elsewhere (integration test)

Each scenario trains a tiny MLP under DDP on 2 gloo ranks (spawned with torch.multiprocessing) and
records steps with ``torch.profiler`` (schedule wait=WAIT (1), warmup=1, active=ACTIVE: six ``ProfilerStep#N``
per trace, enough for a 2-rank verdict; ``fsdp2`` was recorded with two). Scenarios:

- ``clean``: both ranks do the same work; no straggler, no imbalance.
- ``slow_rank1``: rank 1 sleeps ``SLOW_MS`` in its forward every step, so rank 0 waits for it inside
  the gradient all-reduce. The analyzer must name rank 1, not rank 0.
- ``slow_data``: both ranks' data loader sleeps ``SLOW_MS`` per batch, so the step is data-loading bound.
- ``fsdp2``: the same MLP sharded with FSDP2 (``fully_shard`` on each Linear, then the root) instead of
  DDP: all-gathers before each unit's forward and backward, reduce-scatters of its gradients, and FSDP's
  ``FSDP::all_gather (net.0)``-style annotations.

The traces are committed; the tests read them and never run this script (it takes ~20 s).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("GLOO_TRACES_OUT", HERE))
SCENARIOS = ("clean", "slow_rank1", "slow_data", "fsdp2")
# The committed traces were recorded with 30 ms; the integration test sleeps longer (GLOO_TRACES_SLOW_MS), well
# above what a busy machine does to the other rank for a few steps.
SLOW_MS = int(os.environ.get("GLOO_TRACES_SLOW_MS", "30"))
# Active steps per trace: 2 ranks need 6 or more for any verdict (hf_distprof.core.verdicts.min_steps). The committed
# traces hold 6; the integration test asks for more (GLOO_TRACES_ACTIVE), so that one step in which the slow rank
# happens not to be last (a descheduled rank 0 on a busy machine) does not take the verdict away.
ACTIVE = int(os.environ.get("GLOO_TRACES_ACTIVE", "6"))
# Untraced steps before the profiler's warm-up step: 1 for the committed traces; the integration test skips more,
# because the first steps of the suite's first run (cold page cache, first imports) are not the program's.
WAIT = int(os.environ.get("GLOO_TRACES_WAIT", "1"))
WORLD_SIZE = 2
BATCH = 2048
WIDTH = 256


class RandomBatches(Dataset):
    """Fixed random batches (one item = one batch, so loading costs nothing unless ``sleep_s`` says so)."""

    def __init__(self, n_batches: int, sleep_s: float) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n_batches, BATCH, WIDTH, generator=gen)
        self.y = torch.randn(n_batches, BATCH, 1, generator=gen)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


class TinyMLP(nn.Module):
    """A few Linear layers; ``sleep_s`` makes the forward slow on purpose."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)
        )
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.net(x)


def _worker(rank: int, scenario: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.manual_seed(0)
        slow_forward = SLOW_MS / 1000 if (scenario == "slow_rank1" and rank == 1) else 0.0
        slow_data = SLOW_MS / 1000 if scenario == "slow_data" else 0.0
        if scenario == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            model = TinyMLP(0.0)
            for layer in model.net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
        else:
            # bucket_cap_mb small enough that DDP issues several all-reduces per step.
            model = DDP(TinyMLP(slow_forward), bucket_cap_mb=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        # The batch is large enough that compute, not the gradient all-reduce, dominates a clean step.
        loader = DataLoader(RandomBatches(WAIT + ACTIVE + 2, slow_data), batch_size=None)
        out_dir = OUT / scenario
        out_dir.mkdir(exist_ok=True)
        out = out_dir / f"rank-{rank}.json.gz"
        schedule = torch.profiler.schedule(wait=WAIT, warmup=1, active=ACTIVE, repeat=1)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=schedule,
            # Shapes give the gloo collectives their message sizes (the bandwidth table); fsdp2 has none.
            record_shapes=scenario != "fsdp2",
            on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
        ) as prof:
            for step, (x, y) in enumerate(loader):
                if step == WAIT + ACTIVE + 2:
                    break
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()
    # The traces are written and closed. Skip the interpreter's C++ teardown: about 1 run in 8 here died
    # at exit with "terminate called without an active exception" (SIGABRT) even after the destroy.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str]) -> None:
    for scenario in argv or SCENARIOS:
        if scenario not in SCENARIOS:
            raise SystemExit(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")
        mp.spawn(_worker, args=(scenario, _free_port()), nprocs=WORLD_SIZE, join=True)
        for rank in range(WORLD_SIZE):
            path = OUT / scenario / f"rank-{rank}.json.gz"
            print(f"{path}: {path.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main(sys.argv[1:])
