"""The training script's data-parallel strategy: DDP, or FSDP2 that really shards on every machine.

``--strategy fsdp`` takes one of two routes, chosen by the machine, with the same flags on both:

- **GPU**: accelerate's FSDP2. :func:`fsdp_training_arguments` fills ``TrainingArguments.fsdp`` and
  ``fsdp_config``, which the Trainer turns into accelerate's ``FullyShardedDataParallelPlugin``: each
  transformer block of the model (:func:`fsdp_blocks`; ModernBERT: every encoder layer) becomes an FSDP
  unit, accelerate puts the input embeddings, the final norm and the (tied) output head into one unit of
  their own, kept gathered after forward, then the root.
- **CPU**: accelerate runs ``DistributedType.MULTI_CPU`` there and ignores its FSDP plugin, wrapping the model
  in DDP without a word. So the model is sharded when it is loaded instead, by transformers
  (``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=WORLD))``, see :func:`load_sharded`),
  with the same blocks as units (the embeddings stay in the root); the Trainer recognises such a model and
  does not wrap it again.

Mixed precision is the Trainer's ``--bf16`` on both routes (FSDP2 then all-gathers bf16 parameters);
activation checkpointing is the Trainer's ``--activation-checkpointing``, or FSDP's own
(``--fsdp-activation-checkpointing``) on GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from hf_distprof.core.text import flag_table

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainingArguments

STRATEGIES = ("ddp", "fsdp")


@dataclass
class StrategyArguments:
    """How the training script spreads the model over the ranks. Every field is a ``--flag-name``."""

    strategy: Literal["ddp", "fsdp"] = field(
        default="ddp",
        metadata={
            "help": (
                "ddp: every rank holds the whole model, gradients are all-reduced. fsdp: FSDP2, parameters, "
                "gradients and optimizer state sharded over the ranks (all-gather before each unit's forward "
                "and backward, reduce-scatter of its gradients); on GPU through accelerate's FSDP plugin, on "
                "CPU sharded at load time by transformers' DistributedConfig."
            )
        },
    )
    fsdp_reshard_after_forward: bool = field(
        default=True,
        metadata={
            "help": (
                "FSDP: free each unit's gathered parameters after its forward and all-gather them again for "
                "its backward (less memory, one more all-gather per unit); false keeps them until the backward."
            )
        },
    )
    fsdp_cpu_offload: bool = field(
        default=False,
        metadata={"help": "FSDP on GPU: keep parameters, gradients and optimizer state in host memory."},
    )
    fsdp_activation_checkpointing: bool = field(
        default=False,
        metadata={
            "help": (
                "FSDP on GPU: FSDP's own activation checkpointing of every unit (accelerate). On CPU, or with "
                "DDP, use the Trainer's --activation-checkpointing."
            )
        },
    )

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")

    def check(self, training_args: TrainingArguments, cuda: bool) -> None:
        """Cross-field checks that need the Trainer's flags and the machine.

        Args:
            training_args: The parsed Trainer flags.
            cuda: Whether this machine has a CUDA device.

        Raises:
            ValueError: Naming the flags that do not go together, and what would.
        """
        fsdp_only = [("--fsdp-cpu-offload", self.fsdp_cpu_offload),
                     ("--fsdp-activation-checkpointing", self.fsdp_activation_checkpointing)]
        for flag, on in fsdp_only:
            if on and self.strategy != "fsdp":
                raise ValueError(f"{flag} applies to --strategy fsdp, but --strategy is {self.strategy}")
            if on and not cuda:
                hint = "; use --activation-checkpointing" if "activation" in flag else ""
                raise ValueError(f"{flag} needs a GPU (accelerate's FSDP plugin), and this machine has none{hint}")
        if self.fsdp_activation_checkpointing and training_args.activation_checkpointing:
            raise ValueError("--fsdp-activation-checkpointing and --activation-checkpointing: pick one")
        if training_args.fsdp:
            raise ValueError("--fsdp is set through --strategy fsdp here (and its --fsdp-* flags); drop --fsdp")
        if (
            self.strategy == "fsdp"
            and not cuda
            and str(training_args.save_strategy) not in ("no", "SaveStrategy.NO")
            and not training_args.save_only_model
        ):
            raise ValueError(
                "--strategy fsdp on CPU shards the model at load time, and transformers cannot checkpoint the "
                "optimizer of such a model: add --save-only-model true or --save-strategy no"
            )


def strategy_flags_markdown() -> str:
    """The strategy flags as a Markdown table, as embedded in PROFILING_GUIDE.md (a test compares them)."""
    return flag_table(
        StrategyArguments, valid=lambda f: ", ".join(STRATEGIES) if f.name == "strategy" else "true/false"
    )


def fsdp_blocks(model: torch.nn.Module) -> list[str]:
    """Class names of the blocks that become FSDP units: the model's ``_no_split_modules`` (its transformer
    layers), except a block that holds the input embeddings.

    accelerate puts the input embeddings (with the final norm and the tied output head) into a unit of
    their own; wrapping a block around them as well makes its FSDP2 preparation fail (accelerate 1.15:
    ``fully_shard`` of an already sharded embedding). On the CPU route the embeddings stay in the root unit.

    Args:
        model: The model, or a skeleton of it on the meta device.

    Returns:
        The class names, sorted.

    Raises:
        ValueError: The model names no such block.
    """
    try:
        embeddings = model.get_input_embeddings()  # type: ignore[operator]
    except (AttributeError, NotImplementedError):  # not a transformers model, or one without embeddings
        embeddings = None
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = {
        type(m).__name__
        for m in model.modules()
        if type(m).__name__ in names and (embeddings is None or all(sub is not embeddings for sub in m.modules()))
    }
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} names no _no_split_modules block to shard with FSDP; use --strategy ddp"
        )
    return sorted(blocks)


def fsdp_config(args: StrategyArguments, blocks: list[str]) -> dict[str, Any]:
    """``TrainingArguments.fsdp_config`` for accelerate's FSDP2 (the GPU route).

    Args:
        args: The strategy flags.
        blocks: The classes to wrap (:func:`fsdp_blocks`).
    """
    return {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": blocks,
        "reshard_after_forward": args.fsdp_reshard_after_forward,
        "cpu_offload": args.fsdp_cpu_offload,
        "activation_checkpointing": args.fsdp_activation_checkpointing,
        "cpu_ram_efficient_loading": False,
        "state_dict_type": "SHARDED_STATE_DICT",
    }


def on_gpu(training_args: TrainingArguments) -> bool:
    """Whether the Trainer will train on CUDA: a device is there and ``--use-cpu`` is not set."""
    return torch.cuda.is_available() and not training_args.use_cpu


def fsdp_training_arguments(
    args: StrategyArguments, training_args: TrainingArguments, model: torch.nn.Module
) -> TrainingArguments:
    """The Trainer's flags with accelerate's FSDP2 switched on (GPU route); unchanged unless it applies.

    Call it with the model built, before the Trainer: the wrapped classes come from the model.

    Args:
        args: The strategy flags.
        training_args: The parsed Trainer flags.
        model: The (not yet wrapped) model.

    Returns:
        A new ``TrainingArguments`` with ``fsdp=True`` and :func:`fsdp_config`, or ``training_args`` itself
        for DDP or when training on the CPU (see :func:`load_sharded`).
    """
    if args.strategy != "fsdp" or not on_gpu(training_args):
        return training_args
    return dataclasses.replace(training_args, fsdp=True, fsdp_config=fsdp_config(args, fsdp_blocks(model)))


def shards_at_load(args: StrategyArguments, training_args: TrainingArguments) -> bool:
    """Whether the model is sharded when it is loaded: ``--strategy fsdp`` training on the CPU.

    One process has nothing to shard over: then the model is loaded whole (and the parallelism report says
    that no FSDP was built).
    """
    return args.strategy == "fsdp" and not on_gpu(training_args) and training_args.world_size > 1


def fsdp_plan(model: torch.nn.Module, reshard_after_forward: bool) -> dict[str, str]:
    """transformers' FSDP plan sharding each :func:`fsdp_blocks` block of ``model`` (layers as ``*``).

    Args:
        model: The model, or a skeleton of it on the meta device (only module names and classes are read).
        reshard_after_forward: Free each block's gathered parameters after its forward.

    Returns:
        Module name pattern -> ``free_full_weight`` or ``keep_full_weight``.

    Raises:
        ValueError: The model names no block to shard.
    """
    blocks = set(fsdp_blocks(model))
    style = "free_full_weight" if reshard_after_forward else "keep_full_weight"
    plan: dict[str, str] = {}
    for name, module in model.named_modules():
        if name and type(module).__name__ in blocks:
            parts = name.split(".")
            # model.layers.3 -> model.layers.*: one rule for every layer of a ModuleList.
            pattern = ".".join(parts[:-1] + ["*"]) if parts[-1].isdigit() else name
            plan[pattern] = style
    return plan


def load_sharded(
    model_class: Any, path: str | Path, world_size: int, reshard_after_forward: bool, bf16: bool
) -> PreTrainedModel:
    """Load a model sharded with FSDP2 over ``world_size`` ranks, by transformers (the CPU route).

    Every rank reads only its shard. Call it on every rank, with the process group initialised.

    Args:
        model_class: ``AutoModelForMaskedLM`` or a concrete model class with ``from_pretrained``.
        path: A checkpoint folder or hub id.
        world_size: Ranks to shard over (all of them).
        reshard_after_forward: See :func:`fsdp_plan`.
        bf16: All-gather and compute in bf16, reduce gradients in fp32 (FSDP2's mixed precision).

    Returns:
        The sharded model: its parameters are DTensors.
    """
    from transformers import AutoConfig
    from transformers.distributed import DistributedConfig

    config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        skeleton = model_class.from_config(config) if hasattr(model_class, "from_config") else model_class(config)
    plan = fsdp_plan(skeleton, reshard_after_forward)
    # The plan replaces transformers' generic default (embed_tokens / layers.* / norm), whose rules would
    # otherwise be merged in and, on models that name their modules differently, warned about as unused.
    config.base_model_fsdp_plan = {}
    distributed = DistributedConfig(fsdp_size=world_size, fsdp_plan=plan, fsdp_mixed_precision=bf16)
    return model_class.from_pretrained(str(path), config=config, distributed_config=distributed)
