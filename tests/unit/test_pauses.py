"""Evaluations and checkpoints between traced steps: the profiler callback's range around them, and the analysis
starting the step where it ends (a new user's trial: an evaluation in a traced step read as a 1.8 s step of 25 ms, its
170 metric gathers as the step's communication, and a clean run "what to fix first"), then leaving that step out
whole, as the step timer does (another trial: a peer's wait in it for rank 0's checkpoint read as a late-peer wait)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hf_distprof import ProfilingArguments
from hf_distprof.analysis import AnalysisOptions, analyze_paths
from hf_distprof.analysis.read.events import Step
from hf_distprof.analysis.read.pauses import PAUSE_NAME, without_pauses
from hf_distprof.analysis.tell.text import format_summary
from hf_distprof.callbacks.profiler.callback import PAUSE_NAME as WRITTEN, ProfilerCallback

from . import fake_trainer


def test_a_step_starts_where_the_pause_inside_it_ends_and_what_ran_in_it_belongs_to_no_step() -> None:
    steps = [Step(1, 0.0, 10.0), Step(2, 10.0, 2010.0), Step(3, 2010.0, 2020.0)]
    ops = [(1.0, 5.0, "aten::mm"), (10.5, 2000.0, PAUSE_NAME), (11.0, 12.0, "aten::mm"),
           (2001.0, 2005.0, "aten::mm"), (2012.0, 2015.0, "c10d::allreduce_")]
    gathers = [(11.0, 11.5, "gloo:all_gather"), (2003.0, 2004.0, "gloo:all_reduce")]
    got_steps, got_ops, got_gathers = without_pauses(steps, ops, gathers)
    assert got_steps == [Step(1, 0.0, 10.0), Step(2, 2000.0, 2010.0), Step(3, 2010.0, 2020.0)]
    assert got_ops == [(1.0, 5.0, "aten::mm"), (2001.0, 2005.0, "aten::mm"), (2012.0, 2015.0, "c10d::allreduce_")]
    assert got_gathers == [(2003.0, 2004.0, "gloo:all_reduce")]
    assert without_pauses(steps, ops[:1], gathers) == (steps, ops[:1], gathers)  # no pause: as they were
    assert WRITTEN == PAUSE_NAME  # the callback's name (the training ranks import no analysis code)


def test_the_kernels_launched_inside_a_pause_belong_to_no_step() -> None:
    # A GPU trace: the evaluation's kernels were launched inside the range (by their launch's CPU time, whenever they
    # ran); the training's before and after it stay. Each kernel once went to the last step started before its launch.
    from hf_distprof.analysis.read.events import GpuEvent
    from hf_distprof.analysis.read.pauses import gpu_outside

    gpu = GpuEvent(start=[5.0, 20.0, 2100.0, 2101.0], end=[6.0, 30.0, 2200.0, 2102.0],
                   name=["train", "eval fwd", "eval nccl", "train"], stream=[7, 7, 8, 7], correlation=[1, 2, 3, 4])
    launches = {1: 4.0, 2: 19.0, 3: 1990.0, 4: 2050.0}
    ops = [(10.5, 2000.0, PAUSE_NAME)]
    kept = gpu_outside(gpu, launches, ops)
    assert (kept.name, kept.correlation, kept.start) == (["train", "train"], [1, 4], [5.0, 2101.0])
    assert gpu_outside(gpu, launches, []) is gpu


def test_a_checkpoint_inside_the_window_is_left_out_of_its_step(tmp_path: Path) -> None:
    # Steps of a few ms; a checkpoint of 300 ms after step 3, inside the window (recorded steps 3-5): the trace holds
    # the range around it in ProfilerStep#4, and the analysis reads step 4 as long as the others.
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=0, profiler_warmup_steps=2, profiler_active_steps=3)
    fake_trainer.run([ProfilerCallback(args)], 6, tmp_path, save_after=(3,), save_s=0.3)
    result = analyze_paths([tmp_path / "P" / "r"], AnalysisOptions(workers=1))
    (rank,) = result.ranks
    steps = {s.step: s.duration_us / 1e3 for s in rank.steps}
    assert sorted(steps) == [3, 5]  # step 4 is left out of every figure, and what it held kept apart
    (after,) = rank.steps_after_pause
    # (A step that held the checkpoint would read 300 ms or more; beside a busy core the tiny steps read up to ~105 ms.)
    assert after.step == 4 and after.rest_us < 250e3 and after.pause_us >= 300e3, after
    import gzip
    import json

    (trace,) = (tmp_path / "P" / "r").glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    pause = [e for e in events if e.get("name") == PAUSE_NAME]
    step4 = [e for e in events if e.get("name") == "ProfilerStep#4"]
    assert len(pause) == 1 and len(step4) == 1 and pause[0]["dur"] >= 300e3
    assert step4[0]["ts"] <= pause[0]["ts"] and pause[0]["ts"] + pause[0]["dur"] <= step4[0]["ts"] + step4[0]["dur"]
    assert after.rest_us == pytest.approx(step4[0]["ts"] + step4[0]["dur"] - pause[0]["ts"] - pause[0]["dur"], abs=0.01)
    assert after.pause_us == pytest.approx(pause[0]["dur"], abs=0.01)
    text = format_summary(result)
    assert "\n  step 4, after a checkpoint: the pause " in text  # (the callback marks what ran in the pause)
    assert "Left out of every figure: step 4, traced right after" in text and after.what == "checkpoint"


@pytest.mark.parametrize("evaluate, save, evaluations, at_epoch_end, pause_ms", [
    ((3,), (), 1, False, 300), ((3,), (3,), 1, False, 600), ((), (3,), 1, False, 300),
    ((3,), (3,), 2, False, 900),  # two eval datasets, then the checkpoint: one range (an on_evaluate ended it once)
    ((3,), (), 1, True, 300),  # eval_strategy="epoch": decided at on_epoch_end (once: no range at all)
])
def test_evaluations_then_a_checkpoint_are_one_pause(tmp_path: Path, evaluate, save, evaluations, at_epoch_end,
                                                     pause_ms) -> None:
    # The Trainer evaluates, then saves, after the same step: one range over all of it.
    args = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              profiler_wait_steps=0, profiler_warmup_steps=2, profiler_active_steps=3)
    fake_trainer.run([ProfilerCallback(args)], 6, tmp_path, save_after=save, evaluate_after=evaluate, save_s=0.3,
                     evaluations=evaluations, at_epoch_end=at_epoch_end)
    import gzip
    import json

    (trace,) = (tmp_path / "P" / "r").glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    (pause,) = [e for e in events if e.get("name") == PAUSE_NAME]
    assert pause_ms * 1e3 <= pause["dur"] < (pause_ms + 250) * 1e3
    (rank,) = analyze_paths([tmp_path / "P" / "r"], AnalysisOptions(workers=1)).ranks
    # (A step that held the range would read at least its 300 ms; beside a busy core the tiny steps read up to ~105 ms.)
    assert {s.step: s.duration_us < 250e3 for s in rank.steps} == {3: True, 5: True}
    (after,) = rank.steps_after_pause
    assert (after.step, after.rest_us < 250e3) == (4, True)
    assert after.pause_us == pytest.approx(pause["dur"], abs=0.01)
    # What ran in it, as the callback marked it (each once, in order).
    assert after.what == " and ".join([*(["evaluation"] if evaluate else []), *(["checkpoint"] if save else [])])


def _train_and_read(tmp_path: Path, eval_samples: int, training: dict[str, Any], profiler: dict[str, Any]
                    ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[int, float]]:
    """A plain Trainer with the callbacks, evaluating ``eval_samples`` samples: its trace's events, the one pause range
    in it, and each analysed step's duration (us)."""
    import gzip
    import json

    from transformers import Trainer, TrainingArguments

    from hf_distprof import build_callbacks

    from .test_step_timer_callback import dataset, tiny_model

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, logging_steps=100,
                             per_device_train_batch_size=2, per_device_eval_batch_size=2, eval_strategy="steps",
                             report_to="none", save_strategy="no", disable_tqdm=True, **training)
    prof = ProfilingArguments(enable_profiling=True, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r",
                              **profiler)
    Trainer(model=tiny_model(), args=args, train_dataset=dataset(), eval_dataset=dataset(eval_samples),
            callbacks=build_callbacks(prof)).train()
    (trace,) = (tmp_path / "P" / "r").glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    (pause,) = [e for e in events if e.get("name") == PAUSE_NAME]
    (rank,) = analyze_paths([tmp_path / "P" / "r"], AnalysisOptions(workers=1)).ranks
    return events, pause, {**{s.step: s.duration_us for s in rank.steps},
                           **{-p.step: p.rest_us for p in rank.steps_after_pause}}  # (left out: minus its number)


def test_a_trainer_s_evaluation_in_the_window_ends_its_range_before_the_next_fetch(tmp_path: Path) -> None:
    # A plain Trainer with the callbacks, evaluating on 64 samples after step 4, inside the window (recorded 3-5): the
    # range covers the evaluation and ends before the next step's data phase (the step timer's fetch ends it), so the
    # traced ranges nest, and step 4 reads as long as its neighbours.
    events, pause, steps = _train_and_read(
        tmp_path, 64, {"max_steps": 6, "eval_steps": 3},
        {"profiler_wait_steps": 0, "profiler_warmup_steps": 2, "profiler_active_steps": 3})
    end = pause["ts"] + pause["dur"]
    data = [e for e in events if e.get("name") == "hf_distprof/data" and e["ts"] >= pause["ts"]]
    assert data and data[0]["ts"] >= end  # the next data phase starts after the range: no crossing
    assert sorted(steps) == [-4, 3, 5] and steps[-4] < 3 * max(steps[3], steps[5]), steps  # step 4 left out
    # The window's operator summary leaves the evaluation out too, and says so.
    (summary,) = (tmp_path / "P" / "r").glob("*_summary.txt")
    text = summary.read_text()
    lines = text.splitlines()
    assert lines[1].startswith("(an evaluation between steps, ") and "ProfilerStep" not in text
    # Its forwards are not among the window's: 3 steps of a 2-layer model (its evaluation made 32 more forwards).
    ln_calls = next(int(line.split()[-1]) for line in lines if line.strip().startswith("aten::native_layer_norm "))
    assert ln_calls == 12


def test_an_evaluation_before_the_first_step_is_a_pause_too(tmp_path: Path) -> None:
    # eval_on_start with a window from step 1 (no wait, no warm-up): the Trainer evaluates 128 samples inside
    # ProfilerStep#1 before its first fetch; the range holds it, and step 1 reads as long as step 2.
    events, pause, steps = _train_and_read(
        tmp_path, 128, {"max_steps": 3, "eval_steps": 100, "eval_on_start": True},
        {"profiler_wait_steps": 0, "profiler_warmup_steps": 0, "profiler_active_steps": 2})
    (first,) = [e for e in events if e.get("name") == "ProfilerStep#1"]
    assert first["ts"] <= pause["ts"] and pause["ts"] + pause["dur"] <= first["ts"] + first["dur"]
    # Step 1 would hold the whole evaluation without the range; it holds the first step's own warm-up only (beside a
    # busy core up to 4x step 2's, so it is not compared with step 2). It is left out: step 2 remains.
    assert sorted(steps) == [-1, 2] and steps[-1] < pause["dur"], (steps, pause["dur"])


def test_a_step_after_the_named_ones_and_what_ran_in_it_are_left_out() -> None:
    # A window cut short by an exception after step 8: prof.step() had opened step 9, which never ran; its range lasts
    # until the trace was stopped, a peer's gather waiting for a dead rank inside it.
    import math

    from hf_distprof.analysis.read.trace_io import steps_named

    steps = [Step(8, 0.0, 20.0), Step(9, 20.0, 650.0)]
    kept, cut = steps_named("/runs/r/rank0_vm_step8-8.pt.trace.json.gz", steps)
    assert kept == steps[:1] and cut == [(20.0, math.inf)]
    ops = [(1.0, 5.0, "aten::mm"), (21.0, 640.0, "c10d::allgather_"), (651.0, 652.0, "aten::add")]
    gathers = [(5.0, 6.0, "gloo:all_reduce"), (21.0, 640.0, "gloo:all_gather")]
    assert without_pauses(kept, ops, gathers, cut=cut) == (kept, ops[:1], gathers[:1])
    # Names that say no steps, or all of the steps, or none of them: the steps as they are.
    for name in ("worker0_step_12.1694128201545.pt.trace.json.gz", "rank0_vm_step8-9.pt.trace.json",
                 "rank0_vm_step3-4.pt.trace.json.gz"):
        assert steps_named(f"/runs/r/{name}", steps) == (steps, []), name


def test_the_step_after_a_checkpoint_or_an_evaluation_is_left_out_of_the_step_timer_s_figures(tmp_path: Path) -> None:
    # A plain Trainer saving after step 2 and evaluating after step 4: steps 3 and 5 wait in their first collective
    # for the slowest rank's checkpoint or evaluation (a trial's rank that saved nothing read 0.0472 s against 0.0432
    # s per step for that). They are marked in the jsonl and left out of the means, like the warm-up step; the run's
    # MFU counts the FLOPs of the steps in the means only.
    import json

    from transformers import Trainer, TrainingArguments

    from hf_distprof import StepTimerCallback
    from hf_distprof.analysis.read.timer_records import read_timer_records

    from .test_step_timer_callback import dataset, tiny_model

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=8, logging_steps=4,
                             per_device_train_batch_size=2, per_device_eval_batch_size=2, eval_strategy="steps",
                             eval_steps=4, save_strategy="steps", save_steps=2, report_to="none", disable_tqdm=True)
    timer = StepTimerCallback(ProfilingArguments(enable_step_timing=True, peak_tflops=1.0,
                                                 profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r"))
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=dataset(), eval_dataset=dataset(8),
                      callbacks=[timer])
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "P" / "r" / "timing_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["after_pause"]] == [3, 5, 7]  # saved after 2, 4, 6; evaluated after 4
    summary = timer.summary
    assert summary is not None
    assert (summary["steps_in_means"], summary["warmup_steps_excluded"], summary["pause_steps_excluded"]) == (4, 1, 3)
    assert summary["per_rank"][0]["steps"] == 4
    total_s = summary["per_rank"][0]["total_s"]
    assert summary["mfu_pct"] == pytest.approx(trainer.state.total_flos * 4 / 8 / (total_s * 1e12) * 100, rel=1e-9)
    records = read_timer_records([tmp_path / "P" / "r" / "timing_rank0.jsonl"])
    assert records.warmup == {1, 3, 5, 7}  # the analysis leaves them out alike


def test_the_step_after_a_window_is_left_out_of_the_step_timer_s_figures(tmp_path: Path) -> None:
    # The window's trace is written after its last step; the next step waits in its first collective for the slowest
    # rank's export, on every rank (a trial: 1.17 s against 0.04 s per step on a rank that traced nothing, read as
    # "slowest rank 0 (data)"). It is a pause like a checkpoint: marked, and out of the means and the verdicts.
    import json

    from transformers import Trainer, TrainingArguments

    from hf_distprof import build_callbacks
    from hf_distprof.analysis.read.timer_records import read_timer_records

    from .test_step_timer_callback import dataset, tiny_model

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=8, logging_steps=4,
                             per_device_train_batch_size=2, save_strategy="no", report_to="none", disable_tqdm=True)
    prof = ProfilingArguments(enable_profiling=True, profiler_wait_steps=1, profiler_warmup_steps=1,
                              profiler_active_steps=2, profiler_output_dir=str(tmp_path / "P"), profiler_run_name="r")
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=dataset(), callbacks=build_callbacks(prof))
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "P" / "r" / "timing_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["traced"]] == [2, 3, 4]
    assert [r["step"] for r in rows if r["after_pause"]] == [5]  # the window's trace was written before it
    summary = json.loads((tmp_path / "P" / "r" / "timing_summary.json").read_text())
    assert (summary["steps_in_means"], summary["warmup_steps_excluded"], summary["pause_steps_excluded"]) == (6, 1, 1)
    assert read_timer_records([tmp_path / "P" / "r" / "timing_rank0.jsonl"]).warmup == {1, 5}


def _ranks_with_a_checkpoint(folder: Path, pause_us: tuple[float, float]) -> Any:
    """Two gloo ranks of 5 steps of 10 ms: load 1 ms, forward 5 ms, an all-reduce (1 ms after the last arrival), 1 ms
    optimizer. At step 3's start rank ``r`` pauses ``pause_us[r]`` (its checkpoint); the other then waits for it in
    the all-reduce, as a peer waits for the rank that saves."""
    import orjson

    def span(name: str, ts: float, end: float, tid: int = 1, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": end - ts,
                **({"args": args} if args else {})}

    folder.mkdir(parents=True, exist_ok=True)
    events: list[list[dict[str, Any]]] = [[], []]
    t0 = 0.0
    for k in range(1, 6):
        paused = [pause_us[r] if k == 3 else 0.0 for r in (0, 1)]
        issue = [t0 + 10 + paused[r] + 6_000 for r in (0, 1)]
        done = max(issue) + 1_000
        end = done + 1_000
        for r in (0, 1):
            start = t0 + 10 + paused[r]
            events[r] += [span(f"ProfilerStep#{k}", t0, end, cat="user_annotation"),
                          *([span(PAUSE_NAME, t0 + 10, start, cat="user_annotation")] if paused[r] else []),
                          span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, start + 1_000,
                               cat="user_annotation"),
                          span("aten::mm", start + 1_000, issue[r]),
                          span("c10d::allreduce_", issue[r], issue[r] + 10),
                          span("gloo:all_reduce", issue[r] + 20, done, 2, cat="user_annotation"),
                          span("aten::add_", done + 5, end)]
        t0 = end
    for r in (0, 1):
        doc = {"distributedInfo": {"rank": r, "world_size": 2, "backend": "gloo"}, "host_name": "node0",
               "traceEvents": events[r]}
        (folder / f"rank{r}_node0_step1-5.pt.trace.json").write_bytes(orjson.dumps(doc))
    return analyze_paths([folder], AnalysisOptions(workers=1))


def test_the_step_after_a_checkpoint_is_left_out_and_a_peer_s_wait_in_it_is_no_late_peer_wait(tmp_path: Path) -> None:
    # Rank 0 saves a 60 ms checkpoint after step 2; rank 1 then waits 60 ms in step 3's all-reduce. Kept, that wait
    # read as rank 1's late-peer wait (one step in five: 15 ms a step on average, "waits for rank 0").
    result = _ranks_with_a_checkpoint(tmp_path / "r", (60_000.0, 100.0))
    for rank in result.ranks:
        assert [s.step for s in rank.steps] == [1, 2, 4, 5]
        (after,) = rank.steps_after_pause
        assert (after.step, after.pause_us) == (3, (60_000.0, 100.0)[rank.rank])
        # The step's time after the pause: rank 0 8 ms of its own; rank 1 its wait too (60 ms less its 100 us pause)
        assert after.rest_us == pytest.approx((8_000.0, 8_000.0 + 59_900.0)[rank.rank])
        assert not any(c.step == 3 for c in rank.collectives)
        assert all((c.late_peer_wait_us or 0.0) < 25.0 for c in rank.collectives), rank.rank
    assert result.late_peers == {0: [], 1: []}
    assert not [f for f in result.findings if f.kind in ("late_peer", "straggler", "slow_rank")]
    text = format_summary(result)
    assert ("Left out of every figure: step 3, traced right after an evaluation or a checkpoint, in which the ranks "
            "that finished it first wait for the others (as the step timer leaves them out; the steps kept: 8.01 ms on "
            "average):\n"
            "  step 3: the pause 60.00 ms on rank 0, the longest of 2 ranks; the step after it 67.90 ms on rank 1\n"
            ) in text
    # A window whose every step began so keeps them, and says it did.
    from dataclasses import replace

    for rank in result.ranks:
        rank.steps_after_pause = [replace(p, kept=True) for p in rank.steps_after_pause]
    assert ("Kept, though traced right after an evaluation or a checkpoint (every step of its window was): step 3, "
            "from where the pause ended; the ranks' waits in it are the pause's more than the training's:\n"
            "  step 3: the pause 60.00 ms") in format_summary(result)
    assert "Left out of every figure" not in format_summary(result)
    result = _ranks_with_a_checkpoint(tmp_path / "r", (60_000.0, 100.0))
    # The compact file gives the same result.
    from hf_distprof.analysis.read.compact import load_compact, write_compact
    from hf_distprof.analysis.read.events import parse_trace

    for trace in sorted((tmp_path / "r").glob("*.pt.trace.json")):
        write_compact(trace)
        assert load_compact(trace).steps_after_pause == parse_trace(trace).steps_after_pause != []
    again = analyze_paths([tmp_path / "r"], AnalysisOptions(workers=1))
    assert again.to_dict() == result.to_dict()


def test_a_pause_in_the_steps_of_two_windows_or_in_all_but_one_step() -> None:
    from hf_distprof.analysis.read.pauses import after_pauses

    steps = [Step(1, 0.0, 10.0), Step(2, 10.0, 90.0), Step(3, 90.0, 100.0), Step(4, 100.0, 180.0)]
    ops = [(1.0, 5.0, "aten::mm"), (11.0, 70.0, PAUSE_NAME), (101.0, 171.0, PAUSE_NAME)]
    kept, left, cut = after_pauses(steps, ops, [(200.0, 300.0)])
    assert kept == [steps[0], steps[2]]
    assert [(p.step, p.pause_us, p.rest_us) for p in left] == [(2, 59.0, 20.0), (4, 70.0, 9.0)]
    assert cut == [(200.0, 300.0), (10.0, 90.0), (100.0, 180.0)]
    # One step remains: the others are left out all the same (a trial: a 2-step window kept its step after a
    # checkpoint, and its wait read as a late peer's, while the step timer left it out).
    kept, left, cut = after_pauses(steps[1:], ops, [])
    assert kept == [steps[2]] and [p.step for p in left] == [2, 4] and not any(p.kept for p in left)
    # Every step held a pause: all kept (trimmed only, by without_pauses), and said so.
    kept, left, cut = after_pauses([steps[1], steps[3]], ops, [])
    assert kept == [steps[1], steps[3]] and cut == [] and [(p.step, p.kept) for p in left] == [(2, True), (4, True)]
    assert after_pauses(steps, ops[:1], []) == (steps, [], [])
