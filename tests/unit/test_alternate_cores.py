"""The scenario suite's crossover (``HF_DISTPROF_ALTERNATE_CORES``): each batch moves the calling thread, and
only it, to the next CPU, rank r on CPU (r + batch) mod n."""

from __future__ import annotations

import os
import threading

import pytest

from .training_script import load

CPUS = sorted(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs this process may use")


def cores_seen(rank: int, batches: int) -> tuple[list[set[int]], list[object]]:
    """Run ``batches`` batches through the wrapper on a thread of their own; the CPUs the inner collator ran on."""
    script = load()
    seen: list[set[int]] = []
    out: list[object] = []

    def inner(features):
        seen.append(os.sched_getaffinity(0))
        return {"n": len(features)}

    def work() -> None:
        collate = script.AlternateCores(inner, rank)
        out.extend(collate([1] * (i + 1)) for i in range(batches))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return seen, out


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_each_batch_runs_on_the_next_cpu_starting_from_the_rank(rank):
    seen, out = cores_seen(rank, 2 * len(CPUS) + 1)
    assert seen == [{CPUS[(rank + i) % len(CPUS)]} for i in range(2 * len(CPUS) + 1)]
    assert out == [{"n": i + 1} for i in range(2 * len(CPUS) + 1)]  # the inner collator's batches, unchanged


def test_only_the_calling_thread_moves():
    before = os.sched_getaffinity(0)
    cores_seen(0, 3)
    assert os.sched_getaffinity(0) == before == set(CPUS)


def test_two_ranks_never_share_a_cpu_in_the_same_batch():
    ranks = [cores_seen(r, 6)[0] for r in (0, 1)]
    assert all(a != b for a, b in zip(*ranks))
