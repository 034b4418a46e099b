"""Where the step timer attaches: input counting, model hooks, the timed data loader, the probe's batch."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from hf_distprof.timing import instrument
from hf_distprof.timing.clock import CpuClock
from hf_distprof.timing.instrument import (
    ModelHooks,
    batch_size_and_tokens,
    instrument_loader,
    peak_memory_bytes,
    sample_batch,
)
from hf_distprof.timing.recorder import StepRecorder


def test_tokens_are_non_padding_when_a_mask_is_given():
    ids = torch.ones(3, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    samples, tokens = batch_size_and_tokens((), {"input_ids": ids, "attention_mask": mask})
    # The mask itself, summed by the recorder on a logging step: no kernel in the step.
    assert samples == 3 and tokens is mask and int(tokens.sum()) == 9
    assert batch_size_and_tokens((), {"input_ids": ids}) == (3, 15)
    assert batch_size_and_tokens((ids,), {}) == (3, 15)
    # A 4-D mask (some collators) does not match the inputs: count every position.
    assert batch_size_and_tokens((), {"input_ids": ids, "attention_mask": torch.ones(3, 1, 5, 5)}) == (3, 15)
    assert batch_size_and_tokens((), {"inputs_embeds": torch.zeros(2, 7, 4)}) == (2, 14)
    assert batch_size_and_tokens((), {"pixel_values": torch.zeros(2, 3)}) == (0, 0)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.out = nn.Linear(8, 11)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        logits = self.out(self.emb(input_ids))
        return {"loss": logits.float().logsumexp(-1).mean(), "logits": logits}


def test_model_hooks_feed_the_recorder_inside_steps_only():
    model = TinyLM()
    rec = StepRecorder(CpuClock())
    hooks = ModelHooks(model, rec)
    batch = {"input_ids": torch.randint(0, 11, (4, 6)), "attention_mask": torch.ones(4, 6, dtype=torch.long)}
    batch["attention_mask"][0, 3:] = 0

    model(**batch)["loss"].backward()  # outside a step (evaluation, the probe): ignored
    assert rec.resolve() == []

    rec.boundary()
    rec.step_begin()
    model(**batch)["loss"].backward()
    rec.optimizer_begin()
    rec.optimizer_end()
    rec.step_end(1)
    (s,) = rec.resolve()
    assert s.samples == 4 and s.tokens == 21 and s.micro_batches == 1
    assert s.forward_s is not None and s.backward_compute_s is not None
    assert s.backward_compute_s <= s.backward_s  # the last gradient is ready before backward returns

    hooks.remove()
    rec.step_begin()
    model(**batch)["loss"].backward()
    rec.optimizer_begin()
    rec.step_end(2)
    (s2,) = rec.resolve()
    assert s2.micro_batches == 0 and s2.forward_s is None


def test_the_model_hooks_add_no_graph_break_under_torch_compile():
    # A trial: the Trainer's torch_compile=True traced our hooks with the model (12 graph breaks without them, 32 with
    # them, one "Failed to handle graph break gracefully ... falling back to eager"). Run eagerly, they add none, and
    # still feed the recorder. (The "eager" backend: Dynamo's tracing without compiling kernels.)
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    model = TinyLM()
    rec = StepRecorder(CpuClock())
    hooks = ModelHooks(model, rec)
    batch = {"input_ids": torch.randint(0, 11, (4, 6)), "attention_mask": torch.ones(4, 6, dtype=torch.long)}
    torch._dynamo.reset()
    counters.clear()
    backend = CompileCounter()
    compiled = torch.compile(model, backend=backend)
    rec.boundary()
    rec.step_begin()
    compiled(**batch)["loss"].backward()
    rec.optimizer_begin()
    rec.optimizer_end()
    rec.step_end(1)
    (s,) = rec.resolve()
    assert s.samples == 4 and s.tokens == 24 and s.forward_s is not None
    assert backend.frame_count == 1 and sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    hooks.remove()
    torch._dynamo.reset()


class FakeTime:
    """perf_counter that only moves when the collator says so."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


def slow_collate(items: list[int]) -> torch.Tensor:
    FakeTime.now += 0.25 * len(items)
    return torch.tensor(items)


def test_instrumented_loader_reports_each_next_and_undoes_cleanly(monkeypatch):
    monkeypatch.setattr(instrument, "time", types.SimpleNamespace(perf_counter=FakeTime.perf_counter))
    loader = DataLoader(list(range(10)), batch_size=2, collate_fn=slow_collate)
    seen: list[float] = []
    undo = instrument_loader(loader, seen.append)
    assert undo is not None
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert seen == [0.5] * 5 + [0.0]  # five batches, then the StopIteration
    assert instrument_loader(loader, seen.append) is None  # never stacked twice
    undo()
    assert "_get_iterator" not in vars(loader)
    list(loader)
    assert len(seen) == 6


def test_instrumented_loader_sees_through_accelerate_shards(monkeypatch):
    from accelerate.data_loader import DataLoaderShard

    monkeypatch.setattr(instrument, "time", types.SimpleNamespace(perf_counter=FakeTime.perf_counter))
    shard = DataLoaderShard(list(range(6)), batch_size=3, collate_fn=slow_collate)
    seen: list[float] = []
    undo = instrument_loader(shard, seen.append)
    assert undo is not None and len(list(shard)) == 2
    assert sum(seen) == pytest.approx(1.5)
    undo()


def test_the_copy_a_resumed_epoch_iterates_is_timed_too_and_undone(monkeypatch):
    import transformers.trainer as trainer_module
    from accelerate.data_loader import DataLoaderShard

    monkeypatch.setattr(instrument, "time", types.SimpleNamespace(perf_counter=FakeTime.perf_counter))
    original = trainer_module.skip_first_batches
    shard = DataLoaderShard(list(range(6)), batch_size=2, collate_fn=slow_collate)
    other = DataLoaderShard(list(range(6)), batch_size=2, collate_fn=slow_collate)
    seen: list[float] = []
    undo = instrument_loader(shard, seen.append)
    assert undo is not None and trainer_module.skip_first_batches is not original
    copy = trainer_module.skip_first_batches(shard, 1)  # as the Trainer calls it on resume
    assert [b.tolist() for b in copy] == [[2, 3], [4, 5]] and sum(seen) == pytest.approx(1.0)
    list(trainer_module.skip_first_batches(other, 1))  # not the Trainer's loader: not timed
    assert sum(seen) == pytest.approx(1.0)
    undo()
    assert trainer_module.skip_first_batches is original and "_get_iterator" not in vars(copy)


def test_non_dataloaders_are_left_alone():
    assert instrument_loader([1, 2, 3], lambda s: None) is None


def test_sample_batch_uses_the_collator_on_a_per_rank_slice_without_iterating():
    loader = DataLoader(list(range(100, 110)), batch_size=3, collate_fn=lambda xs: torch.tensor(xs))
    loader._get_iterator = None  # type: ignore[method-assign]  # iterating would fail the test
    assert sample_batch(loader, 3, rank=0).tolist() == [100, 101, 102]
    assert sample_batch(loader, 3, rank=1).tolist() == [103, 104, 105]
    assert sample_batch(loader, 3, rank=3).tolist() == [101, 102, 103]  # wraps inside the dataset


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5, 9))


def test_sample_batch_of_an_iterable_dataset_is_its_first_batch():
    assert sample_batch(DataLoader(Stream(), batch_size=2), 2, rank=1).tolist() == [5, 6]


def test_peak_memory_is_the_process_peak_rss_on_cpu():
    import psutil

    assert peak_memory_bytes(torch.device("cpu")) >= psutil.Process().memory_info().rss * 0.5


def test_gradient_hooks_are_pruned_to_the_last_parameter_after_the_first_backward() -> None:
    """One Python call per parameter and backward is the step timer's costliest instrument on a large model: after
    the first backward only the hook of the parameter whose gradient came last stays, and the backward's end is still
    marked at that gradient; a backward in which that parameter gets no gradient puts every hook back."""
    from hf_distprof.timing.clock import CpuClock
    from hf_distprof.timing.instrument import ModelHooks
    from hf_distprof.timing.recorder import StepRecorder

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

        def forward(self, x: torch.Tensor, skip_first_layer: bool = False) -> torch.Tensor:
            h = self.first(x)
            return self.second(torch.relu(h.detach() if skip_first_layer else h))

    torch.manual_seed(0)
    model = Net()
    order: list[int] = []  # which parameter's hook ran, by index, in each backward
    params = list(model.parameters())
    rec = StepRecorder(CpuClock())
    calls = []
    real = rec.grad_ready
    rec.grad_ready = lambda: (calls.append(1), real())[1]  # type: ignore[method-assign]
    hooks = ModelHooks(model, rec)
    for index, p in enumerate(params):  # a second hook of ours, to see the order the gradients come in
        p.register_post_accumulate_grad_hook(lambda t, i=index: order.append(i))

    def step(x: torch.Tensor, skip_first_layer: bool = False) -> int:
        calls.clear()
        rec.step_begin()
        model(x, skip_first_layer=skip_first_layer).sum().backward()
        rec.optimizer_begin()
        rec.step_end(len(order))
        return len(calls)

    assert step(torch.randn(3, 4)) == 4  # the first backward: every parameter's hook
    last = order[-1]
    assert step(torch.randn(3, 4)) == 1 and len(hooks._grad_handles) == 1  # pruned at the next forward
    assert hooks._last_grad is params[last]
    timing = rec.resolve()[-1]
    assert timing.backward_compute_s is not None and timing.backward_compute_s > 0
    # The first layer left out of the graph: the kept hook (the first layer's) does not fire, every hook comes back.
    assert step(torch.randn(3, 4), skip_first_layer=True) == 0
    assert step(torch.randn(3, 4)) == 4 and len(hooks._grad_handles) == 4
    assert step(torch.randn(3, 4)) == 1
    hooks.remove()
    assert step(torch.randn(3, 4)) == 0
