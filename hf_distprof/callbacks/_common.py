"""Checks shared by the callbacks."""

from __future__ import annotations

from transformers import TrainingArguments
from transformers.training_args import ParallelMode

from hf_distprof import dist

logger = dist.get_logger(__name__)
_warned = False


def warn_if_not_data_parallel(args: TrainingArguments) -> None:
    """Warn once when several ranks run but the Trainer does not train them as one DDP/FSDP job.

    On a machine without GPUs, ``TrainingArguments`` without ``use_cpu=True`` reports
    ``DistributedType.NO`` even under ``accelerate launch --multi_gpu``: each rank then trains its own
    model with no gradient all-reduce, and its traces show no communication at all.
    """
    global _warned
    if _warned or dist.get_world_size() <= 1 or args.parallel_mode == ParallelMode.DISTRIBUTED:
        return
    _warned = True
    logger.warning(
        f"{dist.get_world_size()} ranks are running but the Trainer's parallel mode is {args.parallel_mode.value}: "
        "each rank trains alone, without gradient synchronisation. On a machine without GPUs pass --use-cpu "
        "(TrainingArguments(use_cpu=True)) so that accelerate runs MULTI_CPU data parallelism on gloo."
    )
