"""``TraceAnalysisCallback``: analyse the run's own traces when training ends, for the console (``--profiler-analyze``)
and for the experiment trackers the Trainer reports to (``report_to``: the answer goes into their runs,
:mod:`hf_distprof.trackers`), within :data:`TRACKER_BUDGET_S` when only the trackers asked."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from hf_distprof import dist, paths, tensorboard, trackers
from hf_distprof.config import ProfilingArguments

logger = dist.get_logger(__name__)

TRACKER_BUDGET_S = 10.0
"""Seconds the end of training may wait for the analysis the trackers get (from the compact files: well under a second
for a short run's traces), when ``--profiler-analyze`` did not ask for it; past them it is left to
``hf-distprof analyze RUN --log-to TRACKER`` and a warning says so."""


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

    Built whenever profiling is on; it works at train end when ``--profiler-analyze`` asks (it then prints the findings
    and the box, writes ``analysis.json``, logs ``analysis/exposed_comm_pct`` and ``analysis/imbalance_pct`` to
    TensorBoard), or when ``report_to`` names a tracker (TensorBoard, W&B, MLflow, Trackio): the answer, ``report.html``
    and the summaries then go into each tracker's run (:mod:`hf_distprof.analysis.tell.tracker`), before the trackers'
    own callbacks close their runs (ours run first: :mod:`hf_distprof.callbacks.order`). For the trackers alone it waits
    at most :data:`TRACKER_BUDGET_S`. Every rank first waits at a barrier so that all traces are written (train end
    only, never in the step loop; the same decision on every rank). With node-local output folders rank 0 sees only its
    own node's traces. An analysis that fails is one warning.

    Args:
        args: The profiling flags.
    """

    def __init__(self, args: ProfilingArguments) -> None:
        self.args = args
        self.run_dir: Path | None = None
        self.result: Any = None
        self.sent: dict[str, str] = {}  # tracker -> "sent" | "skipped: ..." | "failed: ..."
        self.report: Path | None = None  # report.html, when this train() call's analysis wrote it

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run_dir = paths.resolve_run_dir(self.args.profiler_output_dir, self.args.profiler_run_name, state)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.result, self.sent, self.report = None, {}, None  # this train() call's, never an earlier one's
        to = trackers.resolve(args.report_to)
        if not (self.args.profiler_analyze or to):
            return
        dist.barrier()
        if dist.get_rank() != 0 or self.run_dir is None:
            return
        traces = sorted(self.run_dir.glob("*" + paths.TRACE_SUFFIX))
        where = "--profiler-analyze" if self.args.profiler_analyze else "the trackers' answer"
        if not traces:
            from hf_distprof.analysis.read.manifest import why_no_trace

            why = why_no_trace(self.run_dir)  # the manifest, just written: the schedule against the last step
            logger.warning(f"{where}: no trace in {self.run_dir} to analyse" + (f": {why}" if why else ""))
            return
        budget = None if self.args.profiler_analyze else TRACKER_BUDGET_S
        began = time.monotonic()
        if not self._analyse(traces, budget, report=bool(to), where=where):
            return
        try:
            if self.args.profiler_analyze:
                self._print(traces, args, state)
            if to:
                self._send(to, args, state, budget, began)
        except Exception as err:  # noqa: BLE001 - telling the answer must never fail the training job
            logger.warning(f"{where}: telling the analysis of {self.run_dir} failed: {err!r}")

    def _analyse(self, traces: list[Path], budget: float | None, report: bool, where: str) -> bool:
        """Analyse (and, for the trackers, write ``report/``) on a thread, waited for ``budget`` seconds at most."""
        failed: list[BaseException] = []
        done: list[Any] = []  # the result, handed over only if the wait did not give up on it
        run_dir = self.run_dir

        def work() -> None:
            try:
                from hf_distprof.analysis import analyze_paths

                result = analyze_paths(traces, analysis_options(self.args))
                assert run_dir is not None
                paths.atomic_write_text(run_dir / paths.ANALYSIS_NAME, result.to_json().decode())
                done.append(result)
                if report:
                    from hf_distprof.analysis.tell.report import write_report

                    self.report = write_report(result, run_dir / "report")
            except Exception as err:  # noqa: BLE001 - the analysis must never fail the training job
                failed.append(err)

        thread = threading.Thread(target=work, name="hf_distprof-analysis", daemon=True)
        thread.start()
        thread.join(budget)
        if thread.is_alive():
            # It runs on (a thread cannot be stopped) and may still write analysis.json; its answer goes nowhere.
            logger.warning(f"the analysis of {self.run_dir} for the trackers took over {budget:g} s: left to "
                           f"`hf-distprof analyze {self.run_dir} --log-to TRACKER`, training ends now")
            return False
        self.result = done[0] if done else None
        if failed and self.result is None:
            logger.warning(f"{where}: analysing {self.run_dir} failed: {failed[0]!r}")
            return False
        if failed:  # the analysis is there; its report could not be written
            logger.warning(f"writing {self.run_dir / 'report'} failed: {failed[0]!r}; the trackers get the rest")
        return True

    def _print(self, traces: list[Path], args: TrainingArguments, state: TrainerState) -> None:
        from hf_distprof.analysis import format_box, format_findings

        assert self.run_dir is not None
        written = self.report  # for the trackers (report_to), when they were sent to
        full = (f"{written} (written: open it in a browser), or hf-distprof analyze {self.run_dir}"
                if written is not None else f"hf-distprof analyze {self.run_dir} --report {self.run_dir / 'report'}")
        print(
            f"\nhf_distprof trace analysis of {self.run_dir} ({len(traces)} trace(s))\n"
            f"{format_findings(self.result)}\n"
            f"Full per-step tables and plots: {full}\n"
            f"\n{format_box(self.result)}",
            flush=True,
        )
        writer = tensorboard.get_writer(tensorboard.tensorboard_dir(args.output_dir, self.run_dir))
        if writer is not None:
            tensorboard.add_scalars(
                writer,
                {
                    "analysis/exposed_comm_pct": self.result.exposed_comm_pct,
                    # (none with one rank's trace: no peer to compare with)
                    **({"analysis/imbalance_pct": self.result.imbalance_pct}
                       if self.result.imbalance_pct is not None else {}),
                },
                state.global_step,
            )
            writer.flush()

    def _send(self, to: list[str], args: TrainingArguments, state: TrainerState, budget: float | None,
              began: float) -> None:
        """The answer into each tracker's run; one line says where it went."""
        from hf_distprof.analysis.tell.tracker import answer

        board = tensorboard.tensorboard_dir(args.output_dir, self.run_dir) if "tensorboard" in to else None
        self.sent = trackers.send_answer(to, answer(self.result, self.run_dir, state.global_step),
                                         tensorboard_dir=board)
        went = [name for name, status in self.sent.items() if status == "sent"]
        if went:
            # The verdict on the console too (trial V: a finding the console never hinted at; the box is in the
            # trackers, and `analyze --findings` prints it).
            from hf_distprof.analysis.tell.box import verdict

            print(f"hf_distprof: the analysis went to {', '.join(went)} ({time.monotonic() - began:.1f} s); verdict: "
                  f"{verdict(self.result)} (hf-distprof analyze {self.run_dir} --findings)", flush=True)
