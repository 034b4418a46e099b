"""NCCL and c10d debug switches as flags: ``DebugArguments`` and the environment variables they stand for.

NCCL, c10d and PyTorch's flight recorder take their settings from environment variables, and read them
once: NCCL when it first initialises, c10d's debug level when ``torch.distributed`` is imported (so
:func:`apply_debug_env` sets that level itself), the flight recorder when the NCCL process group is created. So
:func:`apply_debug_env` has to run before the process group exists. With the Trainer that means before
``TrainingArguments`` is built: its ``__post_init__`` sets up the device, and under a launcher the process
group. In your own script, one line::

    apply_debug_env(DebugArguments(nccl_debug="INFO", flight_recorder_entries=2000), "./profiler_traces")
    training_args = TrainingArguments(...)

Files go to :func:`debug_dir`: ``<output_dir>/nccl_debug/``, or ``<output_dir>/nccl_debug/<run_name>/``
with a run name. They cannot go into the run folder: rank 0 claims that folder only once the process group
exists, and a folder already there would push the run to ``<run_name>-1``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from hf_distprof import dist
from hf_distprof.core.argtypes import PositiveInt
from hf_distprof.core.text import flag_name, flag_table

logger = dist.get_logger(__name__)

NCCL_DEBUG_LEVELS = ("WARN", "INFO", "TRACE")
TORCH_DISTRIBUTED_DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")
NCCL_SUBSYSTEMS = (
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY", "NVLS", "BOOTSTRAP",
    "REG", "PROFILE", "RAS", "ALL",
)
"""The ``NCCL_DEBUG_SUBSYS`` names NCCL's documentation lists (NCCL 2.2x); ``^`` in front excludes the listed ones."""

DEBUG_DIR_NAME = "nccl_debug"
NCCL_LOG_NAME = "nccl_%h_%p.log"
"""NCCL's log per host and process: NCCL puts the host name for ``%h`` and the process id for ``%p``."""
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"
"""PyTorch appends the rank: ``nccl_trace_rank_0``, ... (``torchfrtrace <folder> --prefix nccl_trace_rank_``)."""

DEBUG_ENV_VARS = (
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TORCH_DISTRIBUTED_DEBUG", "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
)
"""Every variable :func:`debug_env_vars` can set, in the order it sets them."""


@dataclass
class DebugArguments:
    """NCCL and c10d debug switches, all off by default. Every field is a ``--flag-name``."""

    nccl_debug: Literal["WARN", "INFO", "TRACE"] | None = field(
        default=None,
        metadata={
            "help": (
                "NCCL's log level (NCCL_DEBUG); the log goes to one file per host and process, "
                f"<--profiler-output-dir>/{DEBUG_DIR_NAME}[/<--profiler-run-name>]/nccl_<host>_<pid>.log "
                "(NCCL_DEBUG_FILE)."
            )
        },
    )
    nccl_debug_subsys: str | None = field(
        default=None,
        metadata={
            "help": (
                "With --nccl-debug: the NCCL subsystems to log (NCCL_DEBUG_SUBSYS), comma-separated, such as "
                f"INIT,COLL; ^ in front logs all but those. Valid names: {','.join(NCCL_SUBSYSTEMS)}."
            )
        },
    )
    torch_distributed_debug: Literal["OFF", "INFO", "DETAIL"] | None = field(
        default=None,
        metadata={
            "help": (
                "c10d's debug level (TORCH_DISTRIBUTED_DEBUG). DETAIL checks that every rank calls the same "
                "collective with the same shapes (one extra collective per collective) and names unused DDP "
                "parameters; INFO logs DDP's setup (shown with TORCH_CPP_LOG_LEVEL=INFO)."
            )
        },
    )
    flight_recorder_entries: PositiveInt | None = field(
        default=None,
        metadata={
            "help": (
                "NCCL: keep the last N collectives per process group in PyTorch's flight recorder "
                "(TORCH_FR_BUFFER_SIZE and TORCH_NCCL_TRACE_BUFFER_SIZE) and dump it on a collective timeout "
                "(TORCH_NCCL_DUMP_ON_TIMEOUT=1) to "
                f"<--profiler-output-dir>/{DEBUG_DIR_NAME}[/<--profiler-run-name>]/{FLIGHT_RECORDER_PREFIX}<rank> "
                "(TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE)."
            )
        },
    )

    def __post_init__(self) -> None:
        # argparse checks the choices and the count when parsing; these cover code that builds the dataclass.
        choices = {"nccl_debug": NCCL_DEBUG_LEVELS, "torch_distributed_debug": TORCH_DISTRIBUTED_DEBUG_LEVELS}
        for name, valid in choices.items():
            value = getattr(self, name)
            if value is not None and value not in valid:
                raise ValueError(f"{flag_name(name)} must be one of {', '.join(valid)}, got {value!r}")
        if self.flight_recorder_entries is not None:
            try:
                self.flight_recorder_entries = PositiveInt(self.flight_recorder_entries)
            except argparse.ArgumentTypeError as err:  # the message argparse prints for a bad value
                raise ValueError(f"--flight-recorder-entries {err}") from None
        if self.nccl_debug_subsys is not None:
            if self.nccl_debug is None:
                raise ValueError("--nccl-debug-subsys filters NCCL's log: it needs --nccl-debug INFO or TRACE")
            self.nccl_debug_subsys = parse_subsystems(self.nccl_debug_subsys)

    @property
    def writes_files(self) -> bool:
        """Whether NCCL or the flight recorder will write into :func:`debug_dir`."""
        return self.nccl_debug is not None or self.flight_recorder_entries is not None


def parse_subsystems(spec: str) -> str:
    """Check an ``NCCL_DEBUG_SUBSYS`` value and return it upper-cased, without spaces.

    Raises:
        ValueError: A name NCCL does not know (a typo would silently log nothing), or an empty list.
    """
    text = spec.replace(" ", "").upper()
    names = [n for n in text.removeprefix("^").split(",") if n]
    unknown = [n for n in names if n not in NCCL_SUBSYSTEMS]
    if unknown or not names:
        what = f"{', '.join(repr(n) for n in unknown)} is not an NCCL subsystem" if unknown else "names no subsystem"
        raise ValueError(
            f"--nccl-debug-subsys: {what}; valid: {','.join(NCCL_SUBSYSTEMS)} (comma-separated, ^ in front to "
            "exclude them)"
        )
    return ("^" if text.startswith("^") else "") + ",".join(names)


def debug_dir(output_dir: str | os.PathLike[str], run_name: str | None = None) -> Path:
    """Where NCCL's logs and the flight recorder's dumps go (an absolute path; nothing is created).

    Args:
        output_dir: The ``--profiler-output-dir`` folder.
        run_name: The ``--profiler-run-name``; None puts every run's files into the same folder.
    """
    folder = Path(output_dir).expanduser().absolute() / DEBUG_DIR_NAME
    return folder / run_name if run_name else folder


def debug_env_vars(
    args: DebugArguments, output_dir: str | os.PathLike[str], run_name: str | None = None
) -> dict[str, str]:
    """The environment variables the debug flags stand for (reads and changes nothing).

    Args:
        args: The debug flags.
        output_dir: The ``--profiler-output-dir`` folder, under which :func:`debug_dir` lies.
        run_name: The ``--profiler-run-name``, or None.

    Returns:
        Variable name -> value, in :data:`DEBUG_ENV_VARS` order; empty when every flag is off.
    """
    folder = debug_dir(output_dir, run_name)
    env: dict[str, str] = {}
    if args.nccl_debug is not None:
        env["NCCL_DEBUG"] = args.nccl_debug
        if args.nccl_debug_subsys is not None:
            env["NCCL_DEBUG_SUBSYS"] = args.nccl_debug_subsys
        env["NCCL_DEBUG_FILE"] = str(folder / NCCL_LOG_NAME)
    if args.torch_distributed_debug is not None:
        env["TORCH_DISTRIBUTED_DEBUG"] = args.torch_distributed_debug
    if args.flight_recorder_entries is not None:
        entries, prefix = str(args.flight_recorder_entries), str(folder / FLIGHT_RECORDER_PREFIX)
        # Both spellings: TORCH_FR_* are the current names, TORCH_NCCL_* the ones older PyTorch reads.
        env["TORCH_FR_BUFFER_SIZE"] = env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = entries
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        env["TORCH_FR_DUMP_TEMP_FILE"] = env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = prefix
    return env


# The flag behind each variable, for the message when the user's own value wins.
_FLAG_OF = {
    "NCCL_DEBUG": "--nccl-debug",
    "NCCL_DEBUG_SUBSYS": "--nccl-debug-subsys",
    "NCCL_DEBUG_FILE": "--nccl-debug",
    "TORCH_DISTRIBUTED_DEBUG": "--torch-distributed-debug",
    "TORCH_FR_BUFFER_SIZE": "--flight-recorder-entries",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "--flight-recorder-entries",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "--flight-recorder-entries",
    "TORCH_FR_DUMP_TEMP_FILE": "--flight-recorder-entries",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "--flight-recorder-entries",
}


def apply_debug_env(
    args: DebugArguments,
    output_dir: str | os.PathLike[str],
    run_name: str | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> dict[str, str]:
    """Set the debug flags' variables that are not set yet, and create the folder their files go to.

    Call it before the process group is created (before ``TrainingArguments`` is built). A variable already
    in the environment keeps its value, and rank 0 says which flag it overrides. When it sets
    ``TORCH_DISTRIBUTED_DEBUG`` it also sets c10d's debug level, which c10d read from the environment when
    ``torch.distributed`` was imported.

    Args:
        args: The debug flags.
        output_dir: The ``--profiler-output-dir`` folder.
        run_name: The ``--profiler-run-name``, or None.
        environ: Where to set them (tests pass a dict); ``os.environ`` when None.

    Returns:
        The variables set, the user's own left out.

    Raises:
        OSError: The folder for NCCL's logs and the flight recorder's dumps cannot be created.
    """
    environ = os.environ if environ is None else environ
    talk = dist.get_rank() == 0
    applied: dict[str, str] = {}
    for name, value in debug_env_vars(args, output_dir, run_name).items():
        current = environ.get(name)
        if current is None:
            environ[name] = applied[name] = value
        elif current != value and talk:
            logger.warning(f"{name}={current} from the environment wins over {_FLAG_OF[name]} ({value})")
    if args.writes_files:
        debug_dir(output_dir, run_name).mkdir(parents=True, exist_ok=True)
    if "TORCH_DISTRIBUTED_DEBUG" in applied and torch.distributed.is_available():
        torch.distributed.set_debug_level(getattr(torch.distributed.DebugLevel, applied["TORCH_DISTRIBUTED_DEBUG"]))
    if talk and args.writes_files and not torch.cuda.is_available():
        logger.warning(
            "--nccl-debug and --flight-recorder-entries configure NCCL, which a run without CUDA does not use: "
            "set, but nothing reads them"
        )
    return applied


def debug_flags_markdown() -> str:
    """The debug flags as a Markdown table, for the guide (generated, so it says what ``--help`` says)."""
    valid = {
        "nccl_debug": ", ".join(NCCL_DEBUG_LEVELS),
        "nccl_debug_subsys": "NCCL subsystems, comma-separated",
        "torch_distributed_debug": ", ".join(TORCH_DISTRIBUTED_DEBUG_LEVELS),
        "flight_recorder_entries": "integer >= 1",
    }
    return flag_table(DebugArguments, valid=lambda f: valid[f.name], default=lambda f: "(unset)")
