"""``hf_distprof.dist.all_gather_json_async``: one JSON object per rank in one non-blocking collective of
fixed-size buffers (an 8-byte length, then the encoded bytes), read later; an object that does not fit its buffer
makes every rank gather buffers of the largest length once more. Tried on 2 real gloo ranks, and without a process
group."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from hf_distprof import dist

WORKER = """
import json, sys
import torch.distributed as dist
from hf_distprof import dist as ours

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
out = {}
# 1. Small objects: one all-gather of 16 KiB buffers, nothing more.
calls = []
real, real_tensors = dist.all_gather_object, dist.all_gather
dist.all_gather_object = lambda *a, **k: calls.append("all_gather_object") or real(*a, **k)
dist.all_gather = lambda out, t, **k: calls.append(("all_gather", t.numel())) or real_tensors(out, t, **k)
pending = ours.all_gather_json_async({"rank": rank, "rows": [[rank, 0.5]] * 3})
out["small"] = pending.result()
out["small_cap"], out["small_next"], out["small_calls"] = pending.cap, pending.next_cap, list(calls)
# 2. Rank 1's object is larger than the buffer: both ranks learn it from the lengths and gather once more.
big = {"rank": rank, "blob": "x" * (40000 if rank == 1 else 10)}
pending = ours.all_gather_json_async(big, pending.next_cap)
out["big"] = [(o["rank"], len(o["blob"])) for o in pending.result()]
out["big_calls"], out["big_next"] = list(calls), pending.next_cap
# 3. The next gather at that size fits again, in one collective.
pending = ours.all_gather_json_async(big, pending.next_cap)
out["again"] = [(o["rank"], len(o["blob"])) for o in pending.result()]
out["again_calls"] = list(calls)
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_two_gloo_ranks_gather_their_objects_and_grow_the_buffer_together(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(store)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    for out in outs:
        assert out["small"] == [{"rank": 0, "rows": [[0, 0.5]] * 3}, {"rank": 1, "rows": [[1, 0.5]] * 3}]
        one = [["all_gather", 16384 + 8]]
        assert (out["small_cap"], out["small_next"], out["small_calls"]) == (16384, 16384, one)
        # Rank 1's object did not fit: both ranks gather buffers of its length once more (no pickle).
        size = len('{"rank":1,"blob":""}') + 40000
        assert out["big"] == [[0, 10], [1, 40000]] and out["big_calls"] == [*one, *one, ["all_gather", size + 8]]
        # 1.5 x the largest encoded object (~40 kB), to the next power of two: the same on both ranks.
        assert out["big_next"] == 65536
        assert out["again"] == [[0, 10], [1, 40000]]
        assert out["again_calls"] == [*one, *one, ["all_gather", size + 8], ["all_gather", 65536 + 8]]


def test_without_a_process_group_the_object_comes_back_as_is():
    obj = {"a": [1, 2]}
    pending = dist.all_gather_json_async(obj)
    # Decoded from its JSON as with several ranks: a tuple comes back a list, whatever the world size.
    assert pending.done() is True and pending.result() == [obj] and pending.result()[0] is not obj
    assert dist.all_gather_json_async({"t": (1, 2)}).result() == [{"t": [1, 2]}]
    assert pending.cap == dist.OBJECT_CAP_MIN == 16384 and pending.next_cap == 16384


def test_the_next_buffer_is_the_power_of_two_at_or_above_one_and_a_half_times_the_largest_object():
    pending = dist.all_gather_json_async(None)
    for largest, cap in ((0, 16384), (10922, 16384), (10924, 32768), (40000, 65536), (690_000, 1 << 20),
                         (700_000, 1 << 21)):
        pending.max_len = largest
        assert pending.next_cap == cap, largest


def test_numpy_and_torch_scalars_travel_as_numbers_and_anything_else_as_null_with_one_warning(caplog, monkeypatch):
    import numpy as np
    import torch

    assert dist.all_gather_json_async({"a": np.float32(0.5), "b": torch.tensor(3)})._payload == b'{"a":0.5,"b":3}'
    monkeypatch.setattr(dist, "_WARNED_JSON", False)
    with caplog.at_level("WARNING"):
        pending = dist.all_gather_json_async({"a": object()})
        looped: list = []
        looped.append(looped)
        again = dist.all_gather_json_async(looped)  # ValueError (a circular reference): also null, not said again
    assert pending.result() == [None] and pending._payload == b"null" and again.result() == [None]
    assert [r.getMessage() for r in caplog.records] == [
        "cannot send a dict to the other ranks: TypeError('object is not JSON serialisable'); sent null instead "
        "(said once)"]


def test_on_nccl_the_buffers_travel_on_this_ranks_gpu_and_only_result_waits(monkeypatch):
    """A CPU build has no CUDA tensor to make: the GPU's steps are fakes that record what happened, in order."""
    import torch

    seen: list[tuple] = []
    d = dist.dist
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_world_size", lambda: 2)
    monkeypatch.setattr(d, "get_backend", lambda: "nccl")
    monkeypatch.setattr(dist.torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: seen.append(("pin",)) or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, non_blocking=False: seen.append(
        ("upload", str(device), non_blocking)) or self)
    real_empty = torch.empty
    monkeypatch.setattr(dist.torch, "empty", lambda *shape, pin_memory=False, **kw: seen.append(
        ("host buffer", pin_memory)) or real_empty(*shape, **kw))
    peer = {"rank": 1, "rows": [[1, 0.25]]}

    def all_gather(out: list, local: torch.Tensor, async_op: bool) -> object:
        seen.append(("all_gather", async_op))
        encoded = json.dumps(peer, separators=(",", ":")).encode()
        other = bytearray(local.numel())
        other[:8] = len(encoded).to_bytes(8, "little")
        other[8:8 + len(encoded)] = encoded
        out[0].copy_(local)
        out[1].copy_(torch.frombuffer(other, dtype=torch.uint8))

        class Work:
            def wait(self) -> None:
                seen.append(("stream waits",))

        return Work()

    class Event:
        def record(self) -> None:
            seen.append(("event recorded",))

        def query(self) -> bool:
            return False

        def synchronize(self) -> None:
            seen.append(("host waits for the event",))

    monkeypatch.setattr(d, "all_gather", all_gather)
    monkeypatch.setattr(dist.torch.cuda, "Event", Event)
    pending = dist.all_gather_json_async({"rank": 0, "rows": []})
    assert seen == [("pin",), ("upload", "cuda:1", True), ("all_gather", True), ("stream waits",),
                    ("host buffer", True), ("host buffer", True), ("event recorded",)]
    assert pending.done() is False  # asks the event, never waits
    assert pending.result() == [{"rank": 0, "rows": []}, peer]
    assert seen[-1] == ("host waits for the event",)  # result() is the one place that may wait


def test_the_first_buffer_fits_the_trainer_s_logging_interval_of_rows():
    # 80 bytes per row and 4 KiB besides, to a power of two; at least 16 KiB.
    assert [dist.json_cap(rows) for rows in (0, 10, 150, 200, 500, 4096)] == [16384, 16384, 16384, 32768, 65536,
                                                                               524288]


def test_another_accelerator_s_backend_takes_torch_s_blocking_object_gather(monkeypatch):
    import torch

    d = dist.dist
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_world_size", lambda: 2)
    monkeypatch.setattr(d, "get_backend", lambda: "xccl")
    monkeypatch.setattr(d, "all_gather", lambda *a, **k: pytest.fail("no async gather of host tensors on xccl"))
    monkeypatch.setattr(dist, "all_gather_object", lambda obj: [obj, obj + 1])
    pending = dist.all_gather_floats_async([1.0, 2.5])
    assert pending.done() is True and pending.result() == [[1.0, 2.5], [2.0, 3.5]]
    assert torch.is_tensor(pending.tensors()[1])


@pytest.mark.parametrize("recording", [False, True])
def test_on_gloo_a_gather_started_while_the_profiler_records_is_finished_before_it_can_stop(monkeypatch, recording):
    import torch

    d = dist.dist
    waits = []

    class Work:
        def wait(self):
            waits.append(1)

        def is_completed(self):
            return False

    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_world_size", lambda: 2)
    monkeypatch.setattr(d, "get_backend", lambda: "gloo")
    monkeypatch.setattr(d, "all_gather", lambda out, local, async_op: Work())
    monkeypatch.setattr(torch._C._autograd, "_profiler_enabled", lambda: recording)
    pending = dist.all_gather_floats_async([1.0, 2.5])
    # Recording: waited at once (no work of ours outlives the recording, whose stop it could outlive); else in flight.
    assert (waits, pending.done()) == (([1], True) if recording else ([], False))


def test_what_orjson_refuses_travels_through_json_and_nan_as_null():
    """orjson writes the gathered objects; what it refuses and json writes still travels (a lone surrogate, an integer
    beyond 64 bits, which comes back a float, nesting deeper than orjson's 254 levels); NaN and infinities are null, as
    strict JSON has neither."""
    deep: list = []
    inner = deep
    for _ in range(300):
        inner.append([])
        inner = inner[0]
    got = dist.all_gather_json_async({"s": "\ud800", "big": 2**64, "deep": deep}).result()[0]
    assert got["s"] == "\ud800" and got["big"] == float(2**64) and got["deep"] == deep
    assert dist.all_gather_json_async([float("nan"), float("inf"), -float("inf"), 1.5]).result() == [[None] * 3 + [1.5]]
