"""The no_sync A/B leaves parameters, gradients, buffers and RNG bit-identical.

Here on a module with FSDP2's ``set_requires_gradient_sync`` interface and no process group; the DDP
path runs on 2 real ranks in tests/integration/test_step_timing.py. ``measure_comm_overhead`` never
receives the optimizer and steps nothing, so there is no optimizer state to compare here;
tests/integration/comm_overhead_probe.py checks on 2 ranks that a real optimizer step after the probe
leaves the ranks' weights equal.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_distprof.timing.report import unresolved_note
from hf_distprof.timing.comm_overhead import (
    _loss_of,
    measure_comm_overhead,
    passes_noise,
    summarize_ranks,
    sync_switch,
)


class FakeFsdpModel(nn.Module):
    """Dropout (draws RNG), BatchNorm (writes buffers in train mode), and FSDP2's sync switch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(6, 1)
        self.sync = True
        self.sync_seen: list[bool] = []

    def set_requires_gradient_sync(self, flag: bool) -> None:
        self.sync = flag

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        self.sync_seen.append(self.sync)
        pred = self.head(self.drop(self.norm(self.lin(x)))).squeeze(-1)
        return {"loss": ((pred - labels) ** 2).mean()}


def trained_model() -> tuple[FakeFsdpModel, torch.optim.Optimizer, dict]:
    torch.manual_seed(0)
    model = FakeFsdpModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = {"x": torch.randn(8, 6), "labels": torch.randn(8)}
    model(**batch)["loss"].backward()
    opt.step()  # optimizer state (exp_avg, step) is not empty
    model(**batch)["loss"].backward()  # gradients are present, as mid-accumulation
    model.eval()  # a mode the probe must give back
    return model, opt, batch


def test_state_is_bit_identical_after_the_measurement():
    model, _, batch = trained_model()
    params = [p.detach().clone() for p in model.parameters()]
    grad_objects = [p.grad for p in model.parameters()]
    grads = [g.clone() for g in grad_objects]
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()

    result = measure_comm_overhead(model, batch, passes=3)

    assert all(torch.equal(a, p) for a, p in zip(params, model.parameters(), strict=True))
    assert all(
        p.grad is g for p, g in zip(model.parameters(), grad_objects, strict=True)
    )  # same tensors (DDP views)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model.training and model.sync is True

    # one warm-up per mode, then 3 timed passes per mode, no-sync first
    assert model.sync_seen[-8:] == [True, False, False, False, False, True, True, True]
    assert result.method == "fsdp2.set_requires_gradient_sync" and result.passes == 3
    assert len(result.no_sync_passes_s) == 3 and len(result.sync_passes_s) == 3
    assert result.noise_s == passes_noise(result.no_sync_passes_s, result.sync_passes_s)
    assert result.resolved == (result.comm_s > result.noise_s)
    assert result.compute_s == min(result.no_sync_passes_s) and result.with_sync_s == min(
        result.sync_passes_s
    )
    assert result.comm_s == pytest.approx(result.with_sync_s - result.compute_s)
    assert result.overhead_pct == pytest.approx(result.comm_s / result.with_sync_s * 100)


def test_the_measurement_would_have_changed_state_without_the_restore():
    """Guards the test above: a forward+backward does move buffers, RNG and grads."""
    model, _, batch = trained_model()
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    grads = [p.grad.clone() for p in model.parameters()]
    model.train()
    model(**batch)["loss"].backward()
    assert not all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert not torch.equal(torch.get_rng_state(), rng)
    assert not all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters(), strict=True))


def test_a_plain_module_cannot_switch_sync_off():
    with pytest.raises(ValueError, match="neither wrapped in DistributedDataParallel or FSDP1"):
        sync_switch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="passes must be >= 1"):
        measure_comm_overhead(FakeFsdpModel(), {}, passes=0)


def test_loss_fallbacks():
    loss = torch.tensor(2.0)
    assert _loss_of({"loss": loss}) is loss
    assert float(_loss_of({"logits": torch.ones(2, 3) * 4})) == 4.0
    assert float(_loss_of((torch.arange(3), torch.full((2,), 5.0)))) == 5.0
    with pytest.raises(ValueError, match="no floating-point tensor"):
        _loss_of({"ids": torch.arange(3)})


def test_ranks_combine_by_median():
    ranks = [
        {
            "passes": 3,
            "method": "ddp.no_sync",
            "compute_s": c,
            "with_sync_s": c + 1,
            "comm_s": 1.0,
            "overhead_pct": p,
        }
        for c, p in ((1.0, 10.0), (2.0, 30.0), (9.0, 20.0))
    ]
    combined = summarize_ranks(ranks)
    assert combined["compute_s"] == 2.0 and combined["overhead_pct"] == 20.0 and combined["per_rank"] == ranks


def test_a_difference_within_the_passes_spread_is_not_resolved():
    # The spread is, over the two modes, the largest median pass less the fastest: 0.02 s (sync 0.30, 0.32, 0.33).
    assert passes_noise([0.20, 0.21, 0.205], [0.30, 0.33, 0.32]) == pytest.approx(0.02)
    assert passes_noise([0.2], [0.3]) == 0.0 and passes_noise() == 0.0
    # Each rank's resolved = comm_s > noise_s; the run's: the median comm_s against the median noise_s.
    ranks = [{"passes": 3, "method": "ddp.no_sync", "compute_s": 0.2, "with_sync_s": 0.2 + c, "comm_s": c,
              "overhead_pct": 100 * c / (0.2 + c), "noise_s": n} for c, n in ((-0.0013, 0.004), (0.002, 0.003),
                                                                             (0.010, 0.001))]
    combined = summarize_ranks(ranks)
    assert (combined["comm_s"], combined["noise_s"], combined["resolved"]) == (0.002, 0.003, False)
    assert unresolved_note(combined) == ("; not resolved: within the passes' own spread (0.0030s), run more passes "
                                         "or on a quieter machine")
    ranks[1]["noise_s"] = 0.0019
    assert summarize_ranks(ranks)["resolved"] is True and unresolved_note(summarize_ranks(ranks)) == ""
    # A summary written before the spread was measured reads as resolved.
    assert unresolved_note({"comm_s": 0.1}) == ""
