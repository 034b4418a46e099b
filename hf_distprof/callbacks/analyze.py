"""``TraceAnalysisCallback`` (``--profiler-analyze``): analyse the run's own traces when training ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard
from hf_distprof.config import ProfilingArguments

logger = dist.get_logger(__name__)



def analysis_options(args: ProfilingArguments) -> Any:
    """The analysis thresholds the training flags set: the same numbers live and offline.

    One file at a time, in the training process (``workers=1``): it has a thread per library, so a process
    pool would spawn fresh interpreters, and each re-imports the training script (torch, transformers) as
    ``__mp_main__``: 10-30 s per worker on a small run, far more than analysing the run's own traces, which
    the profiler also wrote as compact files.
    """
    from hf_distprof.analysis import AnalysisOptions

    return AnalysisOptions(
        workers=1,
        imbalance_pct=float(args.imbalance_threshold_pct),
        straggler_pct=float(args.straggler_threshold_pct),
        memory_imbalance_pct=float(args.memory_imbalance_threshold_pct),
        profiler_slowdown_threshold=float(args.profiler_slowdown_threshold),
    )


class TraceAnalysisCallback(TrainerCallback):  # type: ignore[misc]
    """At ``on_train_end``, rank 0 runs ``hf-distprof analyze`` on this run's traces.

    Every rank first waits at a barrier so that all traces are written (train end only, never in the
    step loop). Rank 0 then prints the findings, writes ``analysis.json`` into the run folder, and logs
    ``analysis/exposed_comm_pct`` and ``analysis/imbalance_pct`` to TensorBoard. With node-local output
    folders rank 0 sees only its own node's traces. An analysis that fails is one warning.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.result: Any = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        dist.barrier()
        if dist.get_rank() != 0 or self.run_dir is None:
            return
        traces = sorted(self.run_dir.glob("*" + paths.TRACE_SUFFIX))
        if not traces:
            from hf_distprof.analysis.read.manifest import why_no_trace

            why = why_no_trace(self.run_dir)  # the manifest, just written: the schedule against the last step
            logger.warning(f"--profiler-analyze: no trace in {self.run_dir} to analyse" + (f": {why}" if why else ""))
            return
        try:
            from hf_distprof.analysis import analyze_paths, format_box, format_findings

            self.result = analyze_paths(traces, analysis_options(self.args))
            paths.atomic_write_text(self.run_dir / paths.ANALYSIS_NAME, self.result.to_json().decode())
        except Exception as err:  # noqa: BLE001 - the analysis must never fail the training job
            logger.warning(f"--profiler-analyze: analysing {self.run_dir} failed: {err!r}")
            return
        print(
            f"\nhf_distprof trace analysis of {self.run_dir} ({len(traces)} trace(s))\n"
            f"{format_findings(self.result)}\n"
            f"Full per-step tables and plots: hf-distprof analyze {self.run_dir} --report {self.run_dir / 'report'}\n"
            f"\n{format_box(self.result)}",
            flush=True,
        )
        writer = tensorboard.get_writer(tensorboard.tensorboard_dir(args.output_dir, self.run_dir))
        if writer is not None:
            tensorboard.add_scalars(
                writer,
                {
                    "analysis/exposed_comm_pct": self.result.exposed_comm_pct,
                    "analysis/imbalance_pct": self.result.imbalance_pct,
                },
                state.global_step,
            )
            writer.flush()
