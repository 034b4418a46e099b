"""What parallelism was built and asked for: DDP, FSDP1 and FSDP2 on a real (1-rank) process group, the
mismatch warning, the once-per-run report and its JSON; the GPU paths on a real device (marked gpu).

The 2-rank cases (sharded shard sizes, the Trainer's silent DDP fallback) run in tests/integration.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
import torch
import torch.distributed as torch_dist
from torch import nn

from hf_distprof import dist
from hf_distprof.callbacks import parallelism
from hf_distprof.callbacks.parallelism import Parallelism, detect, mismatch_warning, report_parallelism, requested


@pytest.fixture
def one_rank_group(tmp_path: Path):
    """A real 1-rank process group (gloo, or NCCL when a GPU is there) for DDP and FSDP wrappers."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch_dist.init_process_group(backend, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    torch_dist.destroy_process_group()


def model(device: str | torch.device = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)  # 144 + 68 = 212 params


def test_plain_model_in_one_process_is_none_without_warning():
    report = detect(model())
    assert (report.built, report.asked, report.warning) == ("none", None, None)
    assert (report.numel, report.local_numel, report.param_tensors, report.dtensor_params) == (212, 212, 4, 0)


def test_ddp_is_found_from_the_unwrapped_model(one_rank_group):
    inner = model(one_rank_group)
    wrapped = nn.parallel.DistributedDataParallel(inner)
    report = detect(inner)  # callbacks get the unwrapped model
    assert (report.built, report.sharded, report.fsdp_units, report.warning) == ("ddp", False, [], None)
    assert report.backend == torch_dist.get_backend() and report.world_size == 1
    del wrapped


def test_fsdp2_units_dtensors_and_settings(one_rank_group):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    m = model(one_rank_group)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    fully_shard(m[0], reshard_after_forward=False, mp_policy=mp)
    fully_shard(m[2], reshard_after_forward=False, mp_policy=mp)
    fully_shard(m, mp_policy=mp)
    report = detect(m)
    assert (report.built, report.sharded_by) == ("fsdp2", "fully_shard")
    assert report.fsdp_units == ["", "0", "2"]
    assert (report.dtensor_params, report.param_tensors, report.numel) == (4, 4, 212)
    assert (report.reshard_after_forward, report.param_dtype) == ({"0": False, "2": False}, "bfloat16")
    assert "reshard_after_forward=False, param dtype bfloat16" in report.summary()
    m[2].set_reshard_after_forward(True)
    assert "reshard_after_forward=True except 0," in detect(m).summary()
    assert "FSDP2 (sharded by fully_shard)" in report.summary() and "3 FSDP units" in report.summary()


def test_fsdp1_units(one_rank_group):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    m = model(one_rank_group)
    m[0] = FSDP(m[0], device_id=one_rank_group, use_orig_params=True)
    wrapped = FSDP(m, device_id=one_rank_group, use_orig_params=True)
    report = detect(wrapped)  # under the Trainer, FSDP1's model is the wrapper
    assert report.built == "fsdp1" and report.fsdp_units == ["", "0"]
    assert report.local_numel == 212


def _report(**kw) -> Parallelism:
    base = dict(built="ddp", asked="fsdp2", asked_by=["TrainingArguments.fsdp (fsdp_version 2)"], sharded_by=None,
                world_size=2, backend="gloo", device_type="cpu", distributed_type="MULTI_CPU", param_tensors=4,
                dtensor_params=0, numel=1_730_000, local_numel=1_730_000)
    return Parallelism(**{**base, **kw})


def test_fsdp_asked_ddp_built_on_cpu_names_both_and_the_cause():
    text = mismatch_warning(_report())
    assert text is not None
    assert text.startswith("FSDP was asked for (TrainingArguments.fsdp (fsdp_version 2)) but the model is trained "
                           "with DDP: accelerate runs DistributedType.MULTI_CPU on a machine without GPUs and "
                           "ignores its FSDP plugin there")
    assert "every rank holds all 1.73 M parameters" in text
    assert "DistributedConfig(fsdp_size=WORLD_SIZE)" in text and "--strategy fsdp" in text
    other = mismatch_warning(_report(distributed_type="MULTI_GPU"))
    assert other is not None and "accelerate's distributed type is MULTI_GPU, not FSDP" in other


def test_other_mismatches_and_the_silent_cases():
    assert mismatch_warning(_report(built="fsdp2")) is None
    assert mismatch_warning(_report(built="fsdp1", asked="fsdp")) is None  # a version was not named
    assert mismatch_warning(_report(built="fsdp2", asked="fsdp1", asked_by=["x"])) == (
        "FSDP1 was asked for (x) but FSDP2 was built"
    )
    assert mismatch_warning(_report(asked=None, asked_by=[])) is None  # DDP asked (by default), DDP built
    alone = mismatch_warning(_report(built="none", asked=None, asked_by=[]))
    assert alone is not None and "each rank trains alone" in alone and "--use-cpu" in alone
    assert mismatch_warning(_report(built="none", asked=None, asked_by=[], world_size=1)) is None
    # Tensor parallelism: DTensors without FSDP is not "each rank alone".
    assert mismatch_warning(_report(built="none", asked=None, asked_by=[], dtensor_params=4)) is None


def test_where_fsdp_was_asked_for(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert requested(SimpleNamespace(fsdp=None), model()) == (None, [])
    args = SimpleNamespace(fsdp=True, fsdp_config={"version": 2})
    assert requested(args, model()) == ("fsdp2", ["TrainingArguments.fsdp (fsdp_version 2)"])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    got = requested(args, model())
    assert got == ("fsdp", ["TrainingArguments.fsdp (fsdp_version 2)",
                            "the accelerate config (ACCELERATE_USE_FSDP=true, FSDP_VERSION=1)"])
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    m = model()
    m.config = SimpleNamespace(distributed_config=SimpleNamespace(fsdp_size=4))
    assert requested(None, m) == ("fsdp2", ["transformers DistributedConfig(fsdp_size=4)"])


def test_report_once_per_run_with_json_and_log(tmp_path, monkeypatch, caplog):
    gathers = []

    def gather(obj):
        gathers.append(obj)
        return [obj]

    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    owner = object()
    args = SimpleNamespace(fsdp=True, fsdp_config={"version": 2})
    with caplog.at_level(logging.INFO):
        first = report_parallelism(model(), args, owner, tmp_path)
        again = report_parallelism(model(), args, owner, tmp_path)
    assert first is again and gathers == [212]  # one gather per run, whoever asks
    assert first is not None and first.local_numel_per_rank == [212]
    data = json.loads((tmp_path / "parallelism.json").read_text())
    assert data == first.to_json()
    assert (data["built"], data["asked"], data["numel"]) == ("none", "fsdp2", 212)
    assert data["warning"] is not None and data["warning"].startswith("FSDP was asked for")
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("[RANK 0] parallelism: no data parallelism") for m in messages) == 1
    assert sum("FSDP was asked for" in m for m in messages) == 1


def test_a_model_it_cannot_read_is_one_warning_and_the_gather_still_happens(tmp_path, monkeypatch, caplog):
    gathers = []
    monkeypatch.setattr(dist, "all_gather_object", lambda obj: gathers.append(obj) or [obj])

    def broken(*a, **k):
        raise RuntimeError("odd model")

    monkeypatch.setattr(parallelism, "detect", broken)
    owner = object()
    with caplog.at_level(logging.WARNING):
        # Every callback calls it at train start: the failed outcome is cached like a good one, so this rank
        # gathers once, as its peers do (an extra gather would pair with their next collective).
        for _ in range(3):
            assert report_parallelism(model(), None, owner, tmp_path) is None
        assert report_parallelism(None, None, object(), tmp_path) is None  # no model: still one gather
    assert gathers == [None, None]
    assert [r.getMessage() for r in caplog.records] == [
        "[RANK 0] could not tell the parallelism of Sequential: RuntimeError('odd model'); training goes on"
    ]
    assert not (tmp_path / "parallelism.json").exists()


@pytest.mark.gpu
def test_fsdp2_on_a_real_gpu(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    assert one_rank_group.type == "cuda"
    m = model(one_rank_group)
    fully_shard(m[0])
    fully_shard(m)
    report = detect(m)
    assert (report.built, report.backend, report.device_type) == ("fsdp2", "nccl", "cuda")
    assert report.reshard_after_forward == {"0": True}


@pytest.mark.gpu
def test_strategy_fsdp_on_gpu_fills_the_trainers_fsdp_config(tmp_path):
    from transformers import ModernBertForMaskedLM, TrainingArguments

    from hf_distprof.recipe.models import tiny_modernbert_config
    from hf_distprof.recipe.strategy import StrategyArguments, fsdp_training_arguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    with torch.device("meta"):
        bert = ModernBertForMaskedLM(tiny_modernbert_config())
    strategy = StrategyArguments(strategy="fsdp", fsdp_reshard_after_forward=False)
    out = fsdp_training_arguments(strategy, args, bert)
    assert out.fsdp and out.fsdp_config["version"] == 2 and out.fsdp_config["reshard_after_forward"] is False
    assert out.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "ModernBertEncoderLayer"
    assert out.fsdp_plugin_args["reshard_after_forward"] is False and out.fsdp_plugin_args["fsdp_version"] == 2


def _fsdp1(m: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    m[0] = FSDP(m[0], device_id=torch.device("cpu"), use_orig_params=True)
    return FSDP(m, device_id=torch.device("cpu"), use_orig_params=True)


def _fsdp2(m: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    fully_shard(m[0])
    return fully_shard(m)


@pytest.mark.parametrize(("wrap", "built"), [(_fsdp1, "fsdp1"), (_fsdp2, "fsdp2")])
def test_every_callback_works_on_an_fsdp_model(tmp_path, monkeypatch, caplog, wrap, built):
    """Trace names, schedule, step timer and memory logger under FSDP1 and FSDP2 (1 CPU rank, real wrappers)."""
    from hf_distprof import ProfilingArguments, build_callbacks, tensorboard

    from . import fake_trainer

    if torch.cuda.is_available():
        pytest.skip("the fake trainer's model and batches live on the CPU")
    torch_dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    try:
        args = ProfilingArguments(enable_profiling=True, enable_memory_logging=True, memory_log_steps=3,
                                  profiler_wait_steps=1, profiler_warmup_steps=1, profiler_active_steps=2,
                                  profiler_record_shapes=False, profiler_output_dir=str(tmp_path / "out"),
                                  profiler_run_name="run", memory_tracker=True, track_activation_memory=True)
        callbacks = build_callbacks(args)
        with caplog.at_level(logging.WARNING):
            fake_trainer.run(callbacks, 6, tmp_path, wrap=wrap)
    finally:
        tensorboard.close_writers()
        torch_dist.destroy_process_group()
    run_dir = tmp_path / "out" / "run"
    host = dist.get_hostname()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"rank0_{host}_step3-4.pt.trace.json.gz", f"rank0_{host}_step3-4.pt.trace.json.gz.compact.msgpack",
         f"rank0_{host}_step3-4_summary.txt", "memory_rank0.jsonl",
         "memory_summary.json", "timing_rank0.jsonl", "timing_summary.json", "parallelism.json",
         "rank0_memory_stats.yaml", "rank0.log", f"manifest_rank0_{host}.json", "manifest.json"]
        + (["rank0_memory_modules.txt", "rank0_memory_modules.json"] if built == "fsdp2" else [])
    )
    assert json.loads((run_dir / "parallelism.json").read_text())["built"] == built
    if built == "fsdp2":
        modules = json.loads((run_dir / "rank0_memory_modules.json").read_text())
        assert modules["tracker"] == "FSDPMemTracker" and modules["step"] == 5
        assert [r["name"] for r in modules["modules"]] == ["FSDPSequential", "FSDPSequential.0"]
        assert modules["modules"][0]["params"] == 2632 * 4
    else:  # torch's trackers cannot hook FSDP1's flat-parameter views: skipped with a reason, training goes on
        assert sum("--memory-tracker skipped: FSDP1" in r.getMessage() for r in caplog.records) == 1
    stats = yaml.safe_load((run_dir / "rank0_memory_stats.yaml").read_text())
    assert sorted(stats["steps"]) == [3, 4] and all(
        f["activation_bytes"] > 0 for entry in stats["steps"].values() for f in entry["forward"]
    )
    rows = [json.loads(line) for line in (run_dir / "memory_rank0.jsonl").read_text().splitlines()]
    # One rank holds all of the fake model's 2632 float32 parameters, however it is wrapped.
    assert [(r["step"], r["params_mb"]) for r in rows] == [(3, 2632 * 4 / 2**20), (6, 2632 * 4 / 2**20)]
    timing = [json.loads(line) for line in (run_dir / "timing_rank0.jsonl").read_text().splitlines()]
    assert [t["step"] for t in timing] == [1, 2, 3, 4, 5, 6]
    assert all(t["forward_s"] > 0 for t in timing)  # the step timer's hooks saw the wrapped model's forward


def test_a_checkpoint_wrapped_unit_is_listed_once(one_rank_group):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    m = model(one_rank_group)
    fully_shard(m[0])
    m[0] = fully_shard(checkpoint_wrapper(m[0]))  # as accelerate's FSDP2 with activation checkpointing ends up
    fully_shard(m)
    report = detect(m)
    assert report.fsdp_units == ["", "0"]
    assert list(report.reshard_after_forward) == ["0"]


def test_modules_sharded_together_are_one_unit(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    m = model(one_rank_group)
    fully_shard([m[0], m[2]], reshard_after_forward=False)  # as accelerate groups embeddings, norm and head
    fully_shard(m)
    report = detect(m)
    assert report.fsdp_units == ["", "0, 2"] and report.reshard_after_forward == {"0, 2": False}
