"""--strategy and its --fsdp-* flags: the FSDP units, the two routes' configs, the accelerate config file kept
equal to the script's defaults, and flag errors that exit 2 before anything runs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import ModernBertForMaskedLM, TrainingArguments

from hf_distprof.recipe.models import tiny_modernbert_config
from hf_distprof.recipe.strategy import StrategyArguments, fsdp_blocks, fsdp_config, fsdp_plan, shards_at_load

from ..conftest import REPO_ROOT
from . import training_script

YAML = REPO_ROOT / "local_scripts" / "accelerate" / "fsdp2.yaml"


@pytest.fixture(scope="module")
def bert() -> torch.nn.Module:
    with torch.device("meta"):
        return ModernBertForMaskedLM(tiny_modernbert_config(num_layers=3))


def test_units_are_the_encoder_layers_not_the_embeddings(bert):
    # ModernBERT's _no_split_modules also names ModernBertEmbeddings, which holds the input embeddings.
    assert sorted(type(bert)._no_split_modules) == ["ModernBertEmbeddings", "ModernBertEncoderLayer"]
    assert fsdp_blocks(bert) == ["ModernBertEncoderLayer"]
    assert fsdp_plan(bert, reshard_after_forward=True) == {"model.layers.*": "free_full_weight"}
    assert fsdp_plan(bert, reshard_after_forward=False) == {"model.layers.*": "keep_full_weight"}


def test_a_model_without_blocks_cannot_be_sharded():
    with pytest.raises(ValueError, match="names no _no_split_modules block to shard with FSDP; use --strategy ddp"):
        fsdp_blocks(torch.nn.Linear(2, 2))


def test_the_accelerate_config_file_says_what_the_script_does_by_default(bert):
    config = yaml.safe_load(YAML.read_text())
    assert config["distributed_type"] == "FSDP"
    from_file = {key.removeprefix("fsdp_"): value for key, value in config["fsdp_config"].items()}
    from_file["cpu_offload"] = from_file.pop("offload_params")
    from_file["transformer_layer_cls_to_wrap"] = [from_file["transformer_layer_cls_to_wrap"]]
    assert from_file == fsdp_config(StrategyArguments(strategy="fsdp"), fsdp_blocks(bert))


def test_fsdp_config_carries_every_flag(bert):
    args = StrategyArguments(strategy="fsdp", fsdp_reshard_after_forward=False, fsdp_cpu_offload=True,
                             fsdp_activation_checkpointing=True)
    config = fsdp_config(args, ["ModernBertEncoderLayer"])
    assert (config["reshard_after_forward"], config["cpu_offload"], config["activation_checkpointing"]) == (
        False, True, True
    )


def test_only_fsdp_trained_on_the_cpu_shards_at_load(monkeypatch):
    def trainer(use_cpu: bool, world_size: int):
        return SimpleNamespace(use_cpu=use_cpu, world_size=world_size)

    fsdp, ddp = StrategyArguments(strategy="fsdp"), StrategyArguments(strategy="ddp")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert shards_at_load(fsdp, trainer(True, 2))
    assert not shards_at_load(fsdp, trainer(True, 1))  # nothing to shard over
    assert not shards_at_load(ddp, trainer(True, 2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not shards_at_load(fsdp, trainer(False, 2))  # accelerate shards on GPU
    assert shards_at_load(fsdp, trainer(True, 2))  # --use-cpu on a GPU machine: the CPU route


def _trainer_args(tmp_path: Path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kw)


@pytest.mark.parametrize(
    ("flags", "trainer", "cuda", "message"),
    [
        (dict(fsdp_cpu_offload=True), {}, True, "--fsdp-cpu-offload applies to --strategy fsdp, but --strategy is ddp"),
        (dict(strategy="fsdp", fsdp_cpu_offload=True), {}, False,
         "--fsdp-cpu-offload needs a GPU (accelerate's FSDP plugin), and this machine has none"),
        (dict(strategy="fsdp", fsdp_activation_checkpointing=True), {}, False,
         "--fsdp-activation-checkpointing needs a GPU (accelerate's FSDP plugin), and this machine has none; use "
         "--activation-checkpointing"),
        (dict(strategy="fsdp", fsdp_activation_checkpointing=True), dict(activation_checkpointing=True), True,
         "--fsdp-activation-checkpointing and --activation-checkpointing: pick one"),
        (dict(strategy="fsdp"), dict(save_strategy="steps"), False,
         "add --save-only-model true or --save-strategy no"),
    ],
)
def test_flags_that_do_not_go_together(tmp_path, flags, trainer, cuda, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StrategyArguments(**flags).check(_trainer_args(tmp_path, **trainer), cuda=cuda)


def test_flags_that_go_together(tmp_path):
    StrategyArguments(strategy="fsdp").check(_trainer_args(tmp_path, save_strategy="steps", save_only_model=True),
                                             cuda=False)
    StrategyArguments(strategy="fsdp", fsdp_cpu_offload=True).check(_trainer_args(tmp_path), cuda=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--strategy", "zero3"), "argument --strategy: invalid choice: 'zero3' (choose from "),
        (("--strategy", "fsdp", "--fsdp-cpu-offload"), "--fsdp-cpu-offload needs a GPU"),
        (("--fsdp",), "--fsdp is set through --strategy fsdp here"),
    ],
)
def test_bad_strategy_flags_exit_2_naming_the_flag(args, message):
    if torch.cuda.is_available() and args != ("--strategy", "zero3"):
        pytest.skip("a CPU-machine message: with a GPU offload is valid, and TrainingArguments judges --fsdp first")
    status, err = training_script.parse(*args)
    assert status == 2, err[-2000:]
    assert message in err and "Traceback" not in err
    if args == ("--strategy", "zero3"):  # the valid choices, however this Python's argparse quotes them
        choices = err.split("choose from ", 1)[1]
        assert "ddp" in choices and "fsdp" in choices


def test_the_launcher_rejects_an_unknown_strategy_before_launching(tmp_path):
    proc = subprocess.run(["bash", str(REPO_ROOT / "local_scripts" / "train_lambda.sh"), "--strategy=zero3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "train_lambda.sh: --strategy must be ddp or fsdp, got 'zero3'"


def test_the_launcher_prints_the_help_once_without_launching(tmp_path):
    # A trial: --help printed the whole help three times (the flag check, then each of the 2 ranks).
    script = tmp_path / "train.py"
    script.write_text("import argparse, sys\nargparse.ArgumentParser(prog='train').parse_args()\n"
                      "sys.exit('launched')\n")
    import os

    env = {**os.environ, "TRAIN_SCRIPT": str(script), "NPROC": "2"}
    for flag in ("--help", "-h"):
        proc = subprocess.run(["bash", str(REPO_ROOT / "local_scripts" / "train_lambda.sh"), "--max-steps", "5", flag],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0 and proc.stdout.count("usage: train") == 1, (proc.stdout, proc.stderr)


def test_guide_strategy_flag_table_matches_the_dataclass():
    import re

    from hf_distprof.recipe.strategy import strategy_flags_markdown

    text = (REPO_ROOT / "PROFILING_GUIDE.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- strategy-flags:start -->\n(.*?)<!-- strategy-flags:end -->", text, re.S)
    assert match, "PROFILING_GUIDE.md has no <!-- strategy-flags:start --> ... <!-- strategy-flags:end --> table"
    assert match.group(1) == strategy_flags_markdown()
