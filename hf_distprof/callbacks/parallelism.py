"""What data parallelism the Trainer built, what was asked for, and a loud warning when they differ.

A request for FSDP can be silently turned into something else: on a machine without GPUs accelerate runs
``DistributedType.MULTI_CPU``, ignores its FSDP plugin and wraps the model in DDP, and neither accelerate
nor transformers says so. At train start the callbacks call :func:`report_parallelism` once: it inspects
the model the Trainer trains (FSDP2 modules, FSDP1 wrappers, the DDP wrapper, DTensor parameters and their
shard sizes), gathers every rank's shard size once, logs one line, writes ``parallelism.json`` into the run
folder, and warns, naming what was asked, what was built and why, when FSDP was asked for but not built.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hf_distprof import dist, paths
from hf_distprof.timing.clock import training_device

logger = dist.get_logger(__name__)

NONE, DDP, FSDP1, FSDP2 = "none", "ddp", "fsdp1", "fsdp2"
_LABELS = {NONE: "no data parallelism", DDP: "DDP", FSDP1: "FSDP1", FSDP2: "FSDP2"}

# One report per train() call: id(state) -> (state, report); the state is kept so its id is not reused.
_REPORTS: dict[int, tuple[object, Parallelism | None]] = {}


@dataclass
class Parallelism:
    """The data parallelism in effect, as seen from the model at train start.

    Attributes:
        built: ``none``, ``ddp``, ``fsdp1`` or ``fsdp2``.
        asked: ``fsdp`` (any version), ``fsdp1`` or ``fsdp2`` when FSDP was requested somewhere, else None.
        asked_by: Where FSDP was requested (TrainingArguments.fsdp, the accelerate config, DistributedConfig).
        sharded_by: Who sharded the model, for FSDP: ``accelerate``, ``transformers DistributedConfig`` (at
            load time) or ``fully_shard/FullyShardedDataParallel`` (the user's code).
        world_size: Ranks in the process group.
        backend: Its backend (``gloo``, ``nccl``), None without one.
        device_type: Where the parameters live (``cpu``, ``cuda``).
        distributed_type: accelerate's ``DistributedType`` (``MULTI_CPU``, ``MULTI_GPU``, ``FSDP`` ...).
        param_tensors: Parameter tensors of the model.
        dtensor_params: How many of them are DTensors (sharded by FSDP2).
        numel: Parameters of the whole model.
        local_numel: Parameter elements this rank holds.
        local_numel_per_rank: ``local_numel`` of every rank (filled by :func:`report_parallelism`).
        fsdp_units: Module names of the FSDP units (``""`` is the root).
        reshard_after_forward: Per FSDP2 unit (the root excepted: it keeps its parameters for the backward
            anyway), whether it frees its gathered parameters after forward; empty when unknown or not FSDP2.
        param_dtype: The dtype FSDP2 all-gathers and computes in (mixed precision), None when unset.
        warning: The mismatch warning, or None when what was built is what was asked.
    """

    built: str
    asked: str | None
    asked_by: list[str]
    sharded_by: str | None
    world_size: int
    backend: str | None
    device_type: str
    distributed_type: str | None
    param_tensors: int
    dtensor_params: int
    numel: int
    local_numel: int
    local_numel_per_rank: list[int] = field(default_factory=list)
    fsdp_units: list[str] = field(default_factory=list)
    reshard_after_forward: dict[str, bool] = field(default_factory=dict)
    param_dtype: str | None = None
    warning: str | None = None

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded over the ranks."""
        return self.built in (FSDP1, FSDP2)

    def summary(self) -> str:
        """One line for the log."""
        text = (
            f"parallelism: {_LABELS[self.built]}"
            + (f" (sharded by {self.sharded_by})" if self.sharded_by else "")
            + f", {self.world_size} rank(s) on {self.backend or 'no process group'}/{self.device_type}"
            + (f", accelerate {self.distributed_type}" if self.distributed_type else "")
            + f"; {self.numel / 1e6:.2f} M parameters"
        )
        if self.sharded:
            per_rank = self.local_numel_per_rank or [self.local_numel]
            text += (
                f", {min(per_rank) / 1e6:.2f}-{max(per_rank) / 1e6:.2f} M per rank; {self.dtensor_params} of "
                f"{self.param_tensors} parameter tensors are DTensors; {len(self.fsdp_units)} FSDP units"
            )
            values = set(self.reshard_after_forward.values())
            if len(values) == 1:
                text += f", reshard_after_forward={values.pop()}"
            elif values:
                kept = [unit for unit, reshard in self.reshard_after_forward.items() if not reshard]
                text += f", reshard_after_forward=True except {', '.join(kept)}"
            if self.param_dtype:
                text += f", param dtype {self.param_dtype}"
        return text

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def find_wrapper(model: nn.Module, wrapper_class: type[nn.Module]) -> Any:
    """The ``wrapper_class`` instance (DDP, FSDP1) that wraps ``model`` in this process, or None.

    Trainer callbacks receive the unwrapped model under DDP (and the FSDP1 wrapper itself under FSDP1); the
    wrapper is found by a one-time scan of live objects (at train start, or when the user asks for a
    measurement), which works for any Trainer subclass without access to the Trainer.
    """
    if isinstance(model, wrapper_class):
        return model
    # The wrapper holds the model in its submodule dict, which its __dict__ holds: the wrapper is found within three
    # levels of referrers through dicts, each level one heap traversal in C (a Python loop over every live object took
    # 150-350 ms at each train start with a dataset in memory).
    frontier: list[Any] = [model]
    for _ in range(3):
        holders: list[Any] = []
        for obj in gc.get_referrers(*frontier):
            # type(), not isinstance(): isinstance reads obj.__class__, on which some deprecated torch objects warn.
            if issubclass(type(obj), wrapper_class) and getattr(obj, "module", None) is model:
                return obj
            if type(obj) is dict:
                holders.append(obj)
        if not holders:
            break
        frontier = holders
    return None


def find_ddp_wrapper(model: nn.Module) -> DistributedDataParallel | None:
    """The ``DistributedDataParallel`` that wraps ``model``, if one exists in this process."""
    return find_wrapper(model, DistributedDataParallel)  # type: ignore[no-any-return]


def find_fsdp1_wrapper(model: nn.Module) -> Any:
    """The outermost FSDP1 ``FullyShardedDataParallel`` of ``model``: itself under the Trainer, else the one
    wrapping it, else one inside it; None without FSDP1."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    outer = find_wrapper(model, FullyShardedDataParallel)
    if outer is not None:
        return outer
    return next((m for m in model.modules() if isinstance(m, FullyShardedDataParallel)), None)


def _clean(name: str) -> str:
    # FSDP1 and activation checkpointing insert wrapper modules into the names.
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removesuffix("._fsdp_wrapped_module").removesuffix("._checkpoint_wrapped_module")


def _fsdp2_units(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """FSDP2's units: one per FSDP state, named by its modules (``fully_shard([a, b])`` makes one unit of
    two modules, named ``"a, b"`` as FSDP's own annotations name it), wrapper segments removed."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return []
    by_state: dict[int, tuple[list[str], list[nn.Module]]] = {}
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        try:
            key = id(m._get_fsdp_state())
        except (AttributeError, AssertionError):
            key = id(m)
        names, modules = by_state.setdefault(key, ([], []))
        if _clean(name) not in names:
            names.append(_clean(name))
        modules.append(m)
    # A checkpoint wrapper and the module inside it, each sharded, are one unit under one cleaned name.
    units: dict[str, list[nn.Module]] = {}
    for names, modules in by_state.values():
        units.setdefault(", ".join(names), []).extend(modules)
    return list(units.items())


def _fsdp2_settings(units: list[tuple[str, list[nn.Module]]]) -> tuple[dict[str, bool], str | None]:
    """(reshard_after_forward per non-root unit, param dtype), read from FSDP2's state; empty if unreadable."""
    reshard: dict[str, bool] = {}
    dtypes: set[str] = set()
    for name, modules in units:
        try:
            for module in modules:
                state = module._get_fsdp_state()  # type: ignore[operator]
                groups = getattr(state, "_fsdp_param_groups", None)
                if groups is None:
                    group = getattr(state, "_fsdp_param_group", None)
                    groups = [group] if group is not None else []
                for group in groups:
                    if name:  # the root keeps its parameters after forward whatever it was told
                        reshard[name] = group.post_forward_mesh_info is not None
                    if group.mp_policy.param_dtype is not None:
                        dtypes.add(str(group.mp_policy.param_dtype).removeprefix("torch."))
        except (AttributeError, AssertionError):
            return {}, None
    return reshard, ",".join(sorted(dtypes)) or None


def requested(args: Any, model: nn.Module | None) -> tuple[str | None, list[str]]:
    """Whether, and where, FSDP was asked for: ``(fsdp | fsdp1 | fsdp2 | None, sources)``.

    Args:
        args: The Trainer's ``TrainingArguments`` (or None).
        model: The model (its config may carry a transformers ``DistributedConfig``).
    """
    versions: set[int] = set()
    sources: list[str] = []
    if args is not None and getattr(args, "fsdp", None):
        config = getattr(args, "fsdp_config", None) or {}
        version = int(config.get("version", config.get("fsdp_version", 2))) if isinstance(config, dict) else 2
        versions.add(version)
        sources.append(f"TrainingArguments.fsdp (fsdp_version {version})")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        version = int(os.environ.get("FSDP_VERSION", "1") or 1)
        versions.add(version)
        sources.append(f"the accelerate config (ACCELERATE_USE_FSDP=true, FSDP_VERSION={version})")
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    fsdp_size = getattr(distributed, "fsdp_size", None) or 1
    if fsdp_size > 1:
        versions.add(2)
        sources.append(f"transformers DistributedConfig(fsdp_size={fsdp_size})")
    if not sources:
        return None, []
    return (f"fsdp{versions.pop()}" if len(versions) == 1 else "fsdp"), sources


def _distributed_type() -> str | None:
    try:
        from accelerate.state import PartialState

        state = PartialState()
        return str(state.distributed_type).removeprefix("DistributedType.")
    except Exception:  # noqa: BLE001 - accelerate absent or not set up: the report just lacks this field
        return None


def detect(model: nn.Module, args: Any = None) -> Parallelism:
    """This rank's view of the data parallelism around ``model`` (no collective).

    Args:
        model: The model the Trainer trains (callbacks get it as ``kwargs["model"]``).
        args: The Trainer's ``TrainingArguments``, for what was asked.

    Returns:
        The report, with ``warning`` set when FSDP was asked for but not built.
    """
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    dtensors = [p for p in params if isinstance(p, DTensor)]
    units2 = _fsdp2_units(model)
    fsdp1 = None if units2 else find_fsdp1_wrapper(model)  # a scan of live objects: only when needed
    reshard: dict[str, bool] = {}
    param_dtype = None
    units: list[str] = []
    if units2:
        built = FSDP2
        units = [name for name, _ in units2]
        reshard, param_dtype = _fsdp2_settings(units2)
    elif fsdp1 is not None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        built = FSDP1
        units = [_clean(n) for n, m in fsdp1.named_modules() if isinstance(m, FullyShardedDataParallel)]
    elif find_ddp_wrapper(model) is not None:
        built = DDP
    else:
        built = NONE
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    distributed_type = _distributed_type()
    sharded_by = None
    if built in (FSDP1, FSDP2):
        if getattr(model, "is_distributed_loading_by_transformers", False):
            sharded_by = "transformers DistributedConfig"
        elif distributed_type == "FSDP":
            sharded_by = "accelerate"
        else:
            sharded_by = "fully_shard" if built == FSDP2 else "FullyShardedDataParallel"
    asked, asked_by = requested(args, model)
    report = Parallelism(
        built=built,
        asked=asked,
        asked_by=asked_by,
        sharded_by=sharded_by,
        world_size=dist.get_world_size(),
        backend=torch.distributed.get_backend() if dist.is_distributed() else None,
        device_type=training_device(args, params).type,  # the GPU's with CPU offload too
        distributed_type=distributed_type,
        param_tensors=len(params),
        dtensor_params=len(dtensors),
        numel=sum(p.numel() for p in params) if built != FSDP1 else local,
        local_numel=local,
        fsdp_units=units,
        reshard_after_forward=reshard,
        param_dtype=param_dtype,
    )
    report.warning = mismatch_warning(report)
    return report


def mismatch_warning(report: Parallelism) -> str | None:
    """What to tell the user when the parallelism built is not the one asked for; None when it is.

    Args:
        report: The detected parallelism (``asked``, ``built``, ``distributed_type`` are read).

    Returns:
        A warning naming what was asked, what was built, the cause and the fix, or None.
    """
    if report.asked is not None and not report.sharded:
        if report.distributed_type == "MULTI_CPU":
            cause = (
                "accelerate runs DistributedType.MULTI_CPU on a machine without GPUs and ignores its FSDP plugin "
                "there, without a warning from accelerate or transformers"
            )
        else:
            cause = f"accelerate's distributed type is {report.distributed_type or 'unknown'}, not FSDP"
        return (
            f"FSDP was asked for ({'; '.join(report.asked_by)}) but the model is trained with "
            f"{_LABELS[report.built]}: {cause}. Nothing is sharded: every rank holds all "
            f"{report.numel / 1e6:.2f} M parameters, their gradients and optimizer state. To shard on CPU, "
            "load the model with from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=WORLD_SIZE)) "
            "(transformers.distributed) before building the Trainer, or run train_lambda.sh --strategy fsdp."
        )
    if report.asked in (FSDP1, FSDP2) and report.sharded and report.asked != report.built:
        asked_by = "; ".join(report.asked_by)
        return f"{_LABELS[report.asked]} was asked for ({asked_by}) but {_LABELS[report.built]} was built"
    if report.built == NONE and report.world_size > 1 and report.dtensor_params == 0:
        return (
            f"{report.world_size} ranks are running but the model is wrapped neither in DDP nor in FSDP: each "
            "rank trains alone, without gradient synchronisation. On a machine without GPUs pass --use-cpu "
            "(TrainingArguments(use_cpu=True)) so that accelerate runs MULTI_CPU data parallelism on gloo."
        )
    return None


def report_parallelism(
    model: nn.Module | None, args: Any, owner: object, run_dir: Path | None
) -> Parallelism | None:
    """Report the parallelism once per ``owner`` (the Trainer's ``state``: one per ``train()`` call).

    Every rank must call it at the same point (it gathers every rank's shard size once): the callbacks do
    at train start. Rank 0 logs the summary, warns on a mismatch and writes ``parallelism.json`` into
    ``run_dir``; a failure to write is one warning.

    Args:
        model: The model the Trainer trains; nothing is reported without one.
        args: The Trainer's ``TrainingArguments``.
        owner: What one run is; later calls with the same owner return the first report.
        run_dir: The run folder, or None for no file.

    Returns:
        The report, or None without a model.
    """
    key = id(owner)
    if key in _REPORTS:
        # Every outcome is cached, None included: a rank that gathered again would pair its extra gather
        # with its peers' next collective.
        return _REPORTS[key][1]
    report: Parallelism | None = None
    if model is not None:
        try:
            report = detect(model, args)
        except Exception as err:  # noqa: BLE001 - a model this does not understand must not stop training
            logger.warning(f"could not tell the parallelism of {type(model).__name__}: {err!r}; training goes on")
    # Every rank reaches this gather, whatever happened above.
    gathered = dist.all_gather_object(report.local_numel if report is not None else None)
    _REPORTS[key] = (owner, report)
    if report is None:
        return None
    report.local_numel_per_rank = [int(n) if n is not None else 0 for n in gathered]
    if report.built == FSDP1:
        report.numel = sum(report.local_numel_per_rank)
    if dist.get_rank() == 0:
        logger.info(report.summary())
        if report.warning:
            logger.warning(report.warning)
        if run_dir is not None:
            target = run_dir / paths.PARALLELISM_NAME
            try:
                paths.atomic_write_text(target, json.dumps(report.to_json(), indent=2) + "\n")
            except OSError as err:
                logger.warning(f"could not write {target}: {err!r}; training goes on")
    return report
