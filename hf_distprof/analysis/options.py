"""The analysis's options: each a field of :class:`AnalysisOptions` and a ``hf-distprof analyze`` flag alike."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

# Values of AnalysisOptions.message_sizes.
MESSAGE_SIZES = ("auto", "shapes")


PROFILER_SLOWDOWN_THRESHOLD = 1.25
"""The profiler-slowdown threshold when neither the flag nor the run's ``timing_summary.json`` gives one (the
training flag's default)."""


@dataclass
class AnalysisOptions:
    """Thresholds and knobs of ``analyze_paths``.

    Each field is also a ``hf-distprof analyze`` option (``comm_bound_pct`` -> ``--comm-bound-pct``), with
    the ``help`` in its metadata as the option's help, so the CLI and this class cannot disagree.
    """

    comm_bound_pct: float = field(
        default=30.0,
        metadata={
            "help": ("Exposed communication above this % of step time is a communication-bound finding.")
        },
    )
    imbalance_pct: float = field(
        default=10.0,
        metadata={
            "help": (
                "Load imbalance: the busiest rank's busy time over the median of the other ranks', per step. "
                "A finding when its median is above this %, beyond the run's step-to-step noise, and the same "
                "rank is the busiest in most steps (more often than chance; see the guide). Under "
                "--profiler-analyze: the training's --imbalance-threshold-pct."
            )
        },
    )
    memory_imbalance_pct: float = field(
        default=20.0,
        metadata={
            "help": (
                "Peak memory imbalance: the highest rank's peak allocated memory over the median of the other "
                "ranks' peaks, per device type, over the traced steps. A finding above this % (traces recorded "
                "with --profiler-profile-memory, whose [memory] events give the peaks)."
            )
        },
    )
    straggler_pct: float = field(
        default=10.0,
        metadata={
            "help": (
                "A rank arriving at each step's collectives later than its peers by a median of more than this % "
                "of step time, last in most steps (more often than chance) and beyond the run's noise, is a "
                "straggler (the traced window's verdict: with the step timer's records beside the traces, its verdict "
                "over the run's untraced steps decides, at --imbalance-pct). Under --profiler-analyze: the training's "
                "--straggler-threshold-pct."
            )
        },
    )
    straggler_min_us: float = field(
        default=1000.0,
        metadata={
            "help": ("... and by more than this many microseconds (absolute floor against scheduler noise).")
        },
    )
    step_outlier_pct: float = field(
        default=10.0,
        metadata={
            "help": (
                "A rank whose mean step time exceeds the median rank's by more than this % (and by "
                "more than 3 scaled median absolute deviations of the ranks' step times) is a "
                "step-time outlier. Needs 3+ ranks: of two, neither stands out from the other."
            )
        },
    )
    low_util_pct: float = field(
        default=80.0,
        metadata={
            "help": (
                "GPU busy below this % of the step's GPU span is a low-utilisation finding (GPU traces only)."
            )
        },
    )
    data_loading_pct: float = field(
        default=10.0,
        metadata={"help": ("Data loading above this % of step time is a data-loading-bound finding.")},
    )
    fsdp_exposed_pct: float = field(
        default=10.0,
        metadata={
            "help": (
                "FSDP all-gathers, or reduce-scatters, exposed (not hidden behind computation) for more than this % "
                "of step time, median over a rank's steps, are a finding."
            )
        },
    )
    what_if_pct: float = field(
        default=10.0,
        metadata={
            "help": (
                "A what-if scenario (the traced steps replayed across ranks with one fix) that saves more than this "
                "% of the step, and more than the model's error and the run's own noise, is the finding 'what to fix "
                "first' (listed right after the slow rank's, when there is one)."
            )
        },
    )
    profiler_slowdown_threshold: float | None = field(
        default=None,
        metadata={
            "help": (
                "Traced steps slower than this many times the run's other steps (from timing_rank*.jsonl "
                "beside the traces) are a finding about the profiler itself."
            ),
            "default_text": f"the run's own, from timing_summary.json; else {PROFILER_SLOWDOWN_THRESHOLD}",
        },
    )
    tiny_kernel_us: float = field(
        default=10.0,
        metadata={"help": ("Kernels shorter than this count as tiny for the launch-bound check.")},
    )
    launch_bound_tiny_pct: float = field(
        default=50.0,
        metadata={
            "help": (
                "Launch-bound when at least this % of kernels are tiny and the GPU idles >= (100 - "
                "low_util_pct) %."
            )
        },
    )
    message_sizes: str = field(
        default="auto",
        metadata={
            "help": (
                "Where the collective bandwidth table's message sizes come from: 'auto' reads what NCCL's "
                "record_param_comms states (newer PyTorch) and, on CPU-backend (gloo) traces, the recorded "
                "input shapes (--profiler-record-shapes); 'shapes' reads recorded shapes on NCCL traces too "
                "(older PyTorch), which makes parsing a shape-recorded GPU trace ~25% slower."
            )
        },
    )
    top_kernels: int = field(
        default=10,
        metadata={"help": ("How many kernels per category each rank lists.")},
    )
    workers: int = field(
        default=0,
        metadata={"help": ("Processes parsing ranks in parallel; 0 means min(files, CPU cores) when the traces are "
                           "16 MiB or more on disk in all, else one (starting processes costs more than they save).")},
    )
    progress: bool | None = field(
        default=None,
        metadata={
            "help": (
                "Show a progress bar; None shows one when there are 8 files or more and stderr is a terminal."
            )
        },
    )

    def __post_init__(self) -> None:
        # (first: its range is > 0, which the generic ">= 0" below would misstate for a negative value)
        threshold = self.profiler_slowdown_threshold
        if threshold is not None and not 0 < threshold < math.inf:  # the training's
            raise OptionValueError("profiler_slowdown_threshold", threshold,
                                   "must be > 0" if math.isfinite(threshold) else "must be a finite number > 0")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, (int, float)) and not math.isfinite(value):  # inf would switch a check off unseen
                raise OptionValueError(f.name, value, "must be a finite number >= 0")
            if isinstance(value, (int, float)) and value < 0:
                raise OptionValueError(f.name, value, "must be >= 0")
        for name in ("comm_bound_pct", "low_util_pct", "data_loading_pct", "launch_bound_tiny_pct", "fsdp_exposed_pct",
                     "what_if_pct"):
            if getattr(self, name) > 100:
                raise OptionValueError(name, getattr(self, name), "is a percentage in [0, 100]")
        if self.message_sizes not in MESSAGE_SIZES:
            raise OptionValueError("message_sizes", self.message_sizes, f"is one of {', '.join(MESSAGE_SIZES)}")


class OptionValueError(ValueError):
    """An :class:`AnalysisOptions` field with a value out of its range.

    The message names the field (``AnalysisOptions.workers must be >= 0, got -1``); a front end that sets
    the field from a flag reports :meth:`for_flag` instead.
    """

    def __init__(self, name: str, value: object, requirement: str) -> None:
        self.name = name
        self.value = value
        self.requirement = requirement
        super().__init__(f"AnalysisOptions.{name} {requirement}, got {value!r}")

    def for_flag(self, flag: str) -> str:
        """The same message naming ``flag`` (``--workers must be >= 0, got -1``)."""
        return f"{flag} {self.requirement}, got {self.value!r}"
