"""The profiling flags: one dataclass, the single source of truth for the CLI, ``--help`` and the docs.

``ProfilingArguments`` works with ``transformers.HfArgumentParser`` (both ``--enable-profiling`` and
``--enable_profiling``); ``add_profiling_args`` adds the same flags to a plain ``argparse`` parser;
``hf_distprof.callbacks.build_callbacks`` turns the parsed flags into the enabled ``TrainerCallback``
objects. This module imports none of them: the callbacks depend on the flags, never the reverse.

Validation happens in the argparse ``type`` of each field, so a bad value fails while the command line
is parsed: exit status 2, the flag's name and the valid range, no traceback (the types are
:mod:`hf_distprof.core.argtypes`, shared by every parser of the package). ``__post_init__`` runs the same checks
for code that builds ``ProfilingArguments`` directly, raising ``ValueError``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hf_distprof.core.argtypes import (
    VALIDATED,
    AboveOneFloat,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    RankList,
    RunName,
    str_to_bool,
    valid_values,
)
from hf_distprof.core.text import flag_name, flag_table


def parse_rank_list(spec: str) -> frozenset[int] | None:
    """Ranks named by a ``--profile-ranks`` value; None means all ranks (``auto``: every rank builds a profiler,
    and each window picks its ranks, see :mod:`hf_distprof.callbacks.profiler.window_policy`)."""
    spec = RankList(spec)
    return None if spec in ("all", "auto") else frozenset(int(r) for r in spec.split(","))


def _help(text: str) -> dict[str, Any]:
    return {"help": text}


@dataclass
class ProfilingArguments:
    """Flags of the hf_distprof callbacks. Every field is a ``--flag-name`` on the command line."""

    enable_profiling: bool = field(
        default=False,
        metadata=_help("Record a torch.profiler trace per rank over the scheduled window of optimizer steps."),
    )
    enable_memory_logging: bool = field(
        default=False,
        metadata=_help(
            "Log memory every --memory-log-steps optimizer steps (GPU: allocated/reserved/peak; CPU: process RSS) "
            "to TensorBoard (tags memory/...) and to memory_rank{R}.jsonl."
        ),
    )
    profiler_output_dir: str = field(
        default="./profiler_traces",
        metadata=_help("Folder for traces and logs; each run writes into its own sub-folder <run-name>/."),
    )
    profiler_run_name: RunName | None = field(
        default=None,
        metadata=_help(
            "Name of this run's sub-folder (default: start time YYYYmmdd-HHMMSS); a name already taken (on any rank's "
            "disk) gets a -1, -2, ... suffix, so no run overwrites another."
        ),
    )
    profiler_skip_first: NonNegativeInt = field(
        default=0, metadata=_help("Optimizer steps ignored before the first wait phase.")
    )
    profiler_wait_steps: NonNegativeInt = field(
        default=5, metadata=_help("Steps of each cycle spent idle before warmup (covers compile/alloc warm-up).")
    )
    profiler_warmup_steps: NonNegativeInt = field(
        default=2, metadata=_help("Steps traced but discarded before the active steps (profiler overhead settles).")
    )
    profiler_active_steps: PositiveInt = field(
        default=3,
        metadata=_help(
            "Steps recorded into each trace. The analysis weighs a window too short for a slow-rank verdict of "
            "its own (2 ranks: under 6 steps) together with the step timer's records of the run's other steps."
        ),
    )
    profiler_repeat: NonNegativeInt = field(
        default=1, metadata=_help("Number of wait/warmup/active cycles; 0 repeats until training ends.")
    )
    profile_ranks: RankList = field(
        default="all",
        metadata=_help(
            "Ranks that profile: 'all', a comma-separated list such as '0,3' (others build no profiler), or 'auto': "
            "each window is traced on the slowest rank and the median rank by pre-sync step time, as gathered at the "
            "last capture agreement before it (the same choice on every rank; agreements every 1-5 steps, "
            "whatever the logging interval: see the guide); before step times from every rank arrive, ranks 0 "
            "and the last; with 1 or 2 ranks, every rank. Each choice and its evidence go to the log and to "
            "profile_ranks.json. Needs step timing."
        ),
    )
    profiler_record_shapes: bool = field(
        default=False,
        metadata=_help(
            "Record operator input shapes (shape grouping in summaries, message sizes of gloo collectives). Off "
            "by default: on CPU it can slow the traced steps 1.5x and more (see the guide)."
        ),
    )
    profiler_profile_memory: bool = field(
        default=False, metadata=_help("Record tensor allocations in the trace (adds [memory] events and overhead).")
    )
    profiler_with_stack: bool = field(
        default=False,
        metadata=_help("Record Python/C++ stacks per op; traces grow (about 1.7x on the demo's model, more with deep "
                       "Python stacks) and export takes longer."),
    )
    profiler_with_flops: bool = field(
        default=False, metadata=_help("Estimate FLOPs of matmul/conv ops in the trace.")
    )
    max_trace_mb: PositiveFloat | None = field(
        default=None,
        metadata=_help(
            "Largest trace file (gzipped, decimal MB) a window may write. The first window is the measurement (kept "
            "whole, warned about when over); the largest rank's bytes per recorded step, agreed at the next capture "
            "agreement, shorten every later window to the active steps that fit, the same steps on every rank, or "
            "skip it when not one step fits; a warning says so and names the costliest option to turn off. Options are "
            "never changed mid-run. Default: no limit."
        ),
    )
    profile_on_demand: bool = field(
        default=False,
        metadata=_help(
            "Open one extra profiler window, on every profiling rank at the same step, when PROFILE_NOW appears in "
            "the run folder (the file is consumed) or any rank gets SIGUSR1; recording starts at most 5 + 1 + "
            "warm-up steps later, whatever the logging interval (capture agreements every 1-5 steps: a small "
            "non-blocking all-gather each). Needs --enable-profiling."
        ),
    )
    profile_on_anomaly: bool = field(
        default=False,
        metadata=_help(
            "Open one extra profiler window, on every profiling rank at the same step, when a step on any rank "
            "takes longer than --anomaly-factor times that rank's running median step time; recording starts at "
            "most 5 + 1 + warm-up steps later, whatever the logging interval (see --profile-on-demand). Needs "
            "--enable-profiling."
        ),
    )
    anomaly_factor: AboveOneFloat = field(
        default=2.0,
        metadata=_help(
            "--profile-on-anomaly: a step slower than this many times the median of the rank's last 20 untraced "
            "steps is an anomaly."
        ),
    )
    max_anomaly_captures: PositiveInt = field(
        default=1, metadata=_help("--profile-on-anomaly: at most this many windows are opened by anomalies.")
    )
    profiler_analyze: bool = field(
        default=False,
        metadata=_help(
            "When training ends, rank 0 analyses this run's traces (as `hf-distprof analyze` does), prints the "
            "findings, writes analysis.json into the run folder and logs analysis/ scalars to TensorBoard. "
            "Needs --enable-profiling."
        ),
    )
    memory_snapshot: bool = field(
        default=False,
        metadata=_help(
            "GPU: record the CUDA allocator's history (Python stacks) over each memory window (the profiler's "
            "active steps) and dump rank{R}_{host}_step{first}-{last}_memory_snapshot.pickle per rank and "
            "window, for https://pytorch.org/memory_viz; on a CUDA out-of-memory error also dump "
            "rank{R}_{host}_oom_step{N}_memory_snapshot.pickle. Needs CUDA (said once on CPU)."
        ),
    )
    memory_snapshot_max_entries: PositiveInt = field(
        default=100_000,
        metadata=_help("Allocator events kept by --memory-snapshot (a ring buffer: the oldest are dropped)."),
    )
    memory_tracker: bool = field(
        default=False,
        metadata=_help(
            "For one optimizer step (the first after the first memory window), attribute memory to modules "
            "with torch's MemTracker (FSDP2: FSDPMemTracker): parameters, gradients, optimizer state, "
            "activations per module and the step's peak by category (temporaries; FSDP: all-gather buffers); "
            "writes rank{R}_memory_modules.txt and .json. Slows that one step several times (marked profiler_busy "
            "in timing_rank{R}.jsonl: left out of the verdicts)."
        ),
    )
    memory_tracker_depth: PositiveInt = field(
        default=2,
        metadata=_help(
            "Module depth of --memory-tracker's table: 1 = the model alone, 2 = also its direct children, ... "
            "(FSDP2: every FSDP unit, whatever its depth)."
        ),
    )
    track_activation_memory: bool = field(
        default=False,
        metadata=_help(
            "Count the bytes autograd saves for backward (activations, not parameters) in each forward of the "
            "memory window's steps, with saved_tensors_hooks; into rank{R}_memory_stats.yaml."
        ),
    )
    memory_log_steps: PositiveInt = field(
        default=10,
        metadata=_help(
            "Sample memory every N optimizer steps; the samples reach rank 0 (TensorBoard, growth check) in one "
            "gather on the Trainer's logging steps (or once 10 wait)."
        ),
    )
    enable_step_timing: bool | None = field(
        default=None,
        metadata={
            **_help(
                "Time every optimizer step per rank (data, forward, backward incl. gradient sync, optimizer), log "
                "throughput and cross-rank imbalance on logging steps, write timing_rank{R}.jsonl and "
                "timing_summary.json. Default: on when --enable-profiling, --measure-comm-overhead or --nvtx is on."
            ),
            # HfArgumentParser gives a `bool | None` field no optional value; a bare flag must mean true.
            "nargs": "?",
            "const": True,
        },
    )
    imbalance_threshold_pct: NonNegativeFloat = field(
        default=10.0,
        metadata=_help(
            "Warn when one rank's pre-sync time (data + forward + backward compute) exceeds the median of the "
            "other ranks' by more than this percentage, in most steps and beyond the run's own step-to-step "
            "noise (see the guide). Also the trace analysis's --imbalance-pct under --profiler-analyze."
        ),
    )
    straggler_threshold_pct: NonNegativeFloat = field(
        default=10.0,
        metadata=_help(
            "Under --profiler-analyze: the trace analysis's --straggler-pct. A rank that reaches each step's "
            "collectives later than its peers by a median of more than this percentage of the step, in most "
            "steps and beyond the run's noise, is a straggler."
        ),
    )
    memory_imbalance_threshold_pct: NonNegativeFloat = field(
        default=20.0,
        metadata=_help(
            "Warn when one rank's peak memory exceeds the median of the other ranks' by more than this "
            "percentage (at two logging steps in a row while training)."
        ),
    )
    memory_growth_threshold_pct: NonNegativeFloat = field(
        default=20.0,
        metadata=_help(
            "Warn when a rank's memory in use (CUDA allocated; CPU: RSS) rises at most logging steps and ends "
            "more than this percentage above its first logging step (4 logging steps at least)."
        ),
    )
    profiler_slowdown_threshold: PositiveFloat = field(
        default=1.25,
        metadata=_help(
            "Warn when the steps the profiler traces take more than this many times as long as the steps "
            "outside its window (timing_summary.json: profiler_slowdown)."
        ),
    )
    measure_comm_overhead: NonNegativeInt = field(
        default=0,
        metadata=_help(
            "Before training, time N forward+backward passes on a real batch without gradient sync, then N with "
            "it, and report the communication overhead; model and optimizer state are left unchanged. 0 = off."
        ),
    )
    hang_timeout: NonNegativeFloat = field(
        default=0.0,
        metadata=_help(
            "Seconds without an optimizer step ending after which every rank dumps all its threads' Python "
            "stacks to hang_rank{R}_{host}.txt in the run folder (a watchdog thread, no collective); the first "
            "step gets 5x as long (start-up). 0 = off."
        ),
    )
    hang_abort: bool = field(
        default=False,
        metadata=_help(
            "Needs --hang-timeout: after dumping, exit the rank with status 3 so that the job fails instead of "
            "sitting until its wall-clock limit."
        ),
    )
    nvtx: bool = field(
        default=False,
        metadata=_help("CUDA: also emit the step phases (data, forward, backward, optimizer) as NVTX ranges."),
    )
    nsys_window: bool = field(
        default=False,
        metadata=_help(
            "CUDA: call cudaProfilerStart/Stop around the profiler's active steps, so that `nsys profile "
            "--capture-range=cudaProfilerApi` records exactly those."
        ),
    )
    peak_tflops: PositiveFloat | None = field(
        default=None,
        metadata=_help(
            "Peak TFLOPs of one device, for MFU. Default: a built-in table of common GPUs (dense BF16); on CPU "
            "or an unknown GPU MFU is not reported without this flag."
        ),
    )

    def __post_init__(self) -> None:
        # Same checks as the argparse types, for code that builds the dataclass directly.
        for f in dataclasses.fields(self):
            kind = _field_types()[f.name]
            if kind in VALIDATED and getattr(self, f.name) is not None:
                try:
                    setattr(self, f.name, kind(getattr(self, f.name)))
                except argparse.ArgumentTypeError as err:
                    _flag_error(f"{flag_name(f.name)}: {err}")
        if not str(self.profiler_output_dir).strip():  # (an empty value in a script's launcher line: meant nothing)
            _flag_error("--profiler-output-dir: an empty folder path; give a folder (default ./profiler_traces)")
        if self.profiler_analyze and not self.enable_profiling:
            _flag_error("--profiler-analyze analyses the run's traces: it needs --enable-profiling")
        for name in ("profile_on_demand", "profile_on_anomaly"):
            if getattr(self, name) and not self.enable_profiling:
                _flag_error(f"{flag_name(name)} opens profiler windows: it needs --enable-profiling")
        if self.max_trace_mb is not None and not self.enable_profiling:
            _flag_error("--max-trace-mb limits the profiler's traces: it needs --enable-profiling")
        if self.hang_abort and not self.hang_timeout:
            _flag_error("--hang-abort ends a rank the watchdog finds hung: it needs --hang-timeout SECONDS")
        if self.enable_step_timing is None:
            self.enable_step_timing = bool(self.enable_profiling or self.measure_comm_overhead > 0 or self.nvtx)
        elif not self.enable_step_timing and self.enable_profiling and self.profile_ranks == "auto":
            _flag_error(
                "--profile-ranks auto chooses ranks by their step times, but --enable-step-timing is false: drop one "
                "of the two"
            )
        elif not self.enable_step_timing and self.measure_comm_overhead > 0:
            _flag_error(
                f"--measure-comm-overhead {self.measure_comm_overhead} needs step timing, but "
                "--enable-step-timing is false: drop one of the two"
            )

    @property
    def profile_rank_set(self) -> frozenset[int] | None:
        """The ranks named by ``--profile-ranks``; None means every rank."""
        return parse_rank_list(self.profile_ranks)

    @property
    def memory_views_enabled(self) -> bool:
        """Whether any memory view (``--memory-snapshot``, ``--memory-tracker``, ...) is switched on."""
        return self.memory_snapshot or self.memory_tracker or self.track_activation_memory

    @property
    def any_enabled(self) -> bool:
        """Whether any callback is switched on (when :func:`~hf_distprof.callbacks.build_callbacks` builds one)."""
        return (
            self.enable_profiling or self.enable_memory_logging or bool(self.enable_step_timing)
            or self.memory_views_enabled or self.hang_timeout > 0 or self.nvtx or self.nsys_window
        )

    @classmethod
    def namespace_fields(cls, namespace: argparse.Namespace) -> dict[str, Any]:
        """The dataclass's fields as ``add_profiling_args`` left them in ``namespace``."""
        return {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def from_namespace(
        cls, namespace: argparse.Namespace, parser: argparse.ArgumentParser | None = None
    ) -> ProfilingArguments:
        """Build from a namespace filled by a parser that had ``add_profiling_args`` applied.

        Flags that contradict each other end the program as argparse ends it for a bad value: ``parser.error`` (the
        usage, ``error: ...``, exit 2), or without ``parser`` the message and exit 2; never a traceback."""
        try:
            return cls(**cls.namespace_fields(namespace))
        except ValueError as err:
            if parser is not None:
                parser.error(str(err))
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None


def _flag_error(message: str) -> NoReturn:
    """A bad flag or two that contradict each other: while an argument parser builds this dataclass from the command
    line (``HfArgumentParser.parse_args_into_dataclasses``), that parser's ``error``: the usage, ``error: <message>``,
    exit 2, no traceback, as for a value argparse rejects itself. Otherwise (built in code, a notebook, a test; a
    parser's ``parse_dict``; a parser made with ``exit_on_error=False``), a ``ValueError``."""
    frame = sys._getframe(1)
    for _ in range(8):  # __post_init__ <- __init__ <- the parser's method
        frame = frame.f_back
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, argparse.ArgumentParser):
            if frame.f_code.co_name == "parse_args_into_dataclasses" and getattr(owner, "exit_on_error", True):
                owner.error(message)
            break
    raise ValueError(message)


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(ProfilingArguments)
    out: dict[str, Any] = {}
    for name, hint in hints.items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        out[name] = args[0] if args else hint
    return out


def add_profiling_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add every ``ProfilingArguments`` flag to a plain argparse parser.

    Both spellings are accepted (``--enable-profiling`` and ``--enable_profiling``), booleans take an
    optional value (``--enable-profiling`` or ``--enable-profiling false``), exactly as with
    ``HfArgumentParser``. Read the result back with ``ProfilingArguments.from_namespace``.

    Args:
        parser: The parser to extend.

    Returns:
        The argument group holding the flags.
    """
    group = parser.add_argument_group("hf_distprof profiling")
    types = _field_types()
    for f in dataclasses.fields(ProfilingArguments):
        names = [flag_name(f.name), f"--{f.name}"]
        kind = types[f.name]
        # The default in the help, as the training script's HfArgumentParser shows it ("%(default)s" also keeps an
        # ArgumentDefaultsHelpFormatter from adding it twice); the help of a default resolved at run time says it.
        text = f.metadata["help"] + (" (default: %(default)s)" if f.default is not None else "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": text}
        if kind is bool:
            kwargs.update(type=str_to_bool, nargs="?", const=True, metavar="BOOL")
        else:
            kwargs["type"] = kind
        group.add_argument(*names, **kwargs)
    return group


# Valid values of the free-text flags, which their type cannot say.
_VALID_TEXT: dict[str, str] = {"profiler_output_dir": "folder path", "profiler_run_name": "a folder name, no '/'"}


# How the table shows defaults that are resolved at run time (the dataclass holds None for them).
_DEFAULT_TEXT: dict[str, str] = {
    "profiler_run_name": "(start time)",
    "enable_step_timing": "(on with --enable-profiling, --nvtx or --measure-comm-overhead)",
    "peak_tflops": "(GPU table)",
    "max_trace_mb": "(no limit)",
}


def flags_markdown() -> str:
    """The flag table in Markdown, as printed by ``hf-distprof flags`` and embedded in the guide."""
    types = _field_types()
    return flag_table(
        ProfilingArguments,
        valid=lambda f: _VALID_TEXT.get(f.name) or valid_values(types[f.name]),
        default=lambda f: f"`{_DEFAULT_TEXT.get(f.name, f.default)}`",
    )
