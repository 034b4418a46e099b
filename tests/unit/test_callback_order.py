"""Our callbacks run right after the Trainer's flow callback, before the trackers': the step timer's figures are in
the ``logs`` a tracker's ``on_log`` receives, and our ``on_train_end`` runs before a tracker closes its run."""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_distprof import ProfilingArguments, build_callbacks
from hf_distprof.callbacks import order

from .test_step_timer_callback import dataset, tiny_model


class TrackerLike(TrainerCallback):  # type: ignore[misc]
    """Stands for a tracker's integration callback (the Trainer puts those before a script's callbacks)."""

    def __init__(self) -> None:
        self.logged: dict[int, list[dict[str, Any]]] = {}
        self.events: list[str] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.logged.setdefault(state.global_step, []).append(dict(logs or {}))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.events.append("tracker on_train_end")


def test_ours_move_after_the_flow_callback_and_a_tracker_sees_the_live_figures(tmp_path):
    tracker = TrackerLike()
    ours = build_callbacks(ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "p"),
                                              profiler_run_name="r"))
    summary = ours[-1]
    real_end = type(summary).on_train_end

    def end(self, *a: Any, **k: Any) -> None:
        tracker.events.append("ours on_train_end")
        real_end(self, *a, **k)

    summary.on_train_end = end.__get__(summary)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=6, logging_steps=3,
                             per_device_train_batch_size=2, report_to="none", disable_tqdm=True, save_strategy="no")
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=dataset(), callbacks=[tracker, *ours])
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names == ["DefaultFlowCallback", "StepTimerCallback", "RunSummaryCallback", "TrackerLike",
                     "PrinterCallback"]
    trainer.train()
    assert sorted(tracker.logged) == [3, 6]
    for step in (3, 6):  # the step's own logs (at 6 the Trainer's run summary follows them)
        assert {"timing/step_s", "timing/imbalance_pct", "loss"} <= set(tracker.logged[step][0]), tracker.logged[step]
    assert tracker.events == ["ours on_train_end", "tracker on_train_end"]


def test_the_order_keeps_each_sides_own_order_and_a_missing_list_is_one_info():
    class DefaultFlowCallback:
        pass

    class Other:
        pass

    class Ours:
        pass

    Ours.__module__ = "hf_distprof.callbacks.fake"
    flow, a, b, x, y = DefaultFlowCallback(), Other(), Other(), Ours(), Ours()
    assert order.first_after_flow([flow, a, x, b, y]) == [flow, x, y, a, b]
    assert order.first_after_flow([a, x]) == [x, a]  # no flow callback: ours first
    assert order.put_ours_first(Ours()) is False  # held by no handler


def test_a_live_warning_and_a_capture_decision_go_to_the_trackers_at_their_step(monkeypatch, tmp_path):
    from hf_distprof import trackers
    from hf_distprof.callbacks.step_timer import WARNINGS_TAG, StepTimerCallback

    sent = []
    monkeypatch.setattr(trackers, "send_text", lambda to, tag, text, step, **kw: sent.append((to, tag, text, step)))
    timer = StepTimerCallback(ProfilingArguments(enable_step_timing=True))
    timer._report_to = ["wandb", "mlflow"]
    timer._warn_once("time", 1, 20, "Imbalance before the gradient sync 50% > 10%: rank 1 is the slowest.")
    timer._warn_once("time", 1, 30, "said once")  # each (kind, rank) once
    assert sent == [(["wandb", "mlflow"], WARNINGS_TAG,
                     "Imbalance before the gradient sync 50% > 10%: rank 1 is the slowest.", 20)]


def test_the_end_of_run_warnings_go_where_the_live_ones_go_at_the_last_step(monkeypatch, tmp_path):
    """The stalls, the profiler's slowdown and the final verdict are said at train end only: they were logged, and
    reached neither TensorBoard's hf_distprof/warnings nor any tracker (a trial read every output)."""
    import types

    from hf_distprof import trackers
    from hf_distprof.callbacks.step_timer import WARNINGS_TAG, StepTimerCallback
    from hf_distprof.timing import publish

    sent, written = [], []
    monkeypatch.setattr(trackers, "send_text", lambda to, tag, text, step, **kw: sent.append((to, tag, text, step)))
    monkeypatch.setattr(publish, "format_table", lambda *a, **k: "the table")
    timer = StepTimerCallback(ProfilingArguments(enable_step_timing=True))
    timer._report_to = ["mlflow"]
    timer._writer = types.SimpleNamespace(add_text=lambda tag, text, step: written.append((tag, text, step)))
    report = types.SimpleNamespace(warnings=["Rank 1 held the others back in stalls: steps 19, 39", "The profiler ..."])
    publish.end_of_run(None, {}, report, None, lambda w: timer._event(w, 60))
    assert written == [(WARNINGS_TAG, w, 60) for w in report.warnings]
    assert sent == [(["mlflow"], WARNINGS_TAG, w, 60) for w in report.warnings]


def test_the_step_timer_hands_its_end_of_run_warnings_on_at_its_last_step(monkeypatch, tmp_path):
    """The wiring the test above leaves out (a review): the step timer's train end gives end_of_run the event that
    sends a warning on at the run's last step."""
    from hf_distprof import trackers
    from hf_distprof.callbacks.step_timer import WARNINGS_TAG, StepTimerCallback
    from hf_distprof.timing import publish

    from . import fake_trainer

    handed, sent = [], []
    real = publish.end_of_run
    monkeypatch.setattr(publish, "end_of_run", lambda *a, **k: (handed.append(a[4] if len(a) > 4 else k.get("event")),
                                                                real(*a, **k)))
    monkeypatch.setattr(trackers, "send_text", lambda to, tag, text, step, **kw: sent.append((tag, text, step)))
    timer = StepTimerCallback(ProfilingArguments(enable_step_timing=True, profiler_output_dir=str(tmp_path / "p")))
    fake_trainer.run([timer], 6, tmp_path)
    assert len(handed) == 1 and callable(handed[0])
    handed[0]("a warning said at train end")
    assert sent == [(WARNINGS_TAG, "a warning said at train end", 6)]

