"""2-rank check of the comm-overhead probe: ``torchrun --nproc_per_node=2 ... OUT_DIR {ddp,fsdp1,fsdp2}``.

Builds a tiny ModernBERT from its config, wraps it in DDP, in FSDP1 (``FullyShardedDataParallel`` per
encoder layer, then the root) or shards it with FSDP2 (``fully_shard`` per encoder layer, then the root),
on gloo; takes one AdamW step and leaves gradients in place (non-empty optimizer state, gradients
mid-accumulation), then runs ``measure_comm_overhead`` on the model as the callback sees it (the
*unwrapped* one under DDP, the wrapper under FSDP1, as the Trainer passes them). Each rank writes
``rank{R}.json``: the result, whether parameters, gradients, buffers, optimizer state and RNG are
bit-identical before and after, what ``hf_distprof.callbacks.parallelism.detect`` sees, and the model state's size.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import ModernBertForMaskedLM

from hf_distprof.callbacks.memory.logger import model_state_memory
from hf_distprof.recipe.models import tiny_modernbert_config
from hf_distprof.callbacks.parallelism import detect
from hf_distprof.timing.comm_overhead import measure_comm_overhead


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of a tensor (FSDP2 parameters, gradients and optimizer state are DTensors)."""
    return t.to_local() if t is not None and hasattr(t, "to_local") else t


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(local(a), local(b)))


def main(out_dir: Path, mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = tiny_modernbert_config(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, seq_len=64)
    model = ModernBertForMaskedLM(config)
    if mode == "ddp":
        wrapped = DDP(model)
    elif mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = FSDP(layer, device_id=torch.device("cpu"), use_orig_params=True)
        wrapped = model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(rank + 1)
    ids = torch.randint(5, 512, (4, 64))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    wrapped(**batch).loss.backward()
    opt.step()
    wrapped(**batch).loss.backward()  # gradients present when the probe starts

    params = [p.detach().clone() for p in model.parameters()]
    grad_objects = [p.grad for p in model.parameters()]
    grads = [None if g is None else g.detach().clone() for g in grad_objects]
    buffers = [b.clone() for b in model.buffers()]
    opt_state = copy.deepcopy(opt.state_dict())
    rng = torch.get_rng_state()

    seen = detect(model)
    memory = model_state_memory(model, opt)
    result = measure_comm_overhead(model, batch, passes=3)

    after = opt.state_dict()
    checks = {
        "params": all(same(a, p) for a, p in zip(params, model.parameters(), strict=True)),
        "grads": all(
            p.grad is g and same(a, g)
            for a, g, p in zip(grads, grad_objects, model.parameters(), strict=True)
        ),
        "grads_present": sum(g is not None for g in grad_objects),
        "buffers": all(same(a, b) for a, b in zip(buffers, model.buffers(), strict=True)),
        "optimizer": after["param_groups"] == opt_state["param_groups"]
        and all(
            same(v, after["state"][k][name]) for k, s in opt_state["state"].items() for name, v in s.items()
        ),
        "optimizer_entries": len(opt_state["state"]),
        "rng": torch.equal(torch.get_rng_state(), rng),
    }
    # The model still trains in sync after the probe: one more DDP step leaves the ranks' weights equal.
    opt.zero_grad()
    wrapped(**batch).loss.backward()
    opt.step()
    if mode == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(wrapped):  # FSDP1's parameters are this rank's shard of a flat parameter
            flat = torch.cat([p.detach().flatten().clone() for p in wrapped.parameters()])
    else:
        full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        flat = torch.cat([p.detach().flatten() for p in full])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    checks["ranks_in_sync_after"] = all(torch.equal(gathered[0], g) for g in gathered)
    out = {"result": result.to_json(), "checks": checks, "parallelism": seen.to_json(), "memory": memory}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Even after destroy_process_group, about 1 FSDP2 run in 4 aborted at interpreter teardown here
    # ("terminate called without an active exception", a joinable C++ thread destroyed): the results are
    # written by then, so leave without running the C++ static destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
