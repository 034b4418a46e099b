"""Drive callbacks through the Trainer's hook sequence with a tiny real model, without a Trainer."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


def training_args(tmp_path: Path) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "trainer_out"), use_cpu=True, report_to=[])


def run(
    callbacks: Sequence[TrainerCallback],
    max_steps: int,
    tmp_path: Path,
    stop_after: int | None = None,
    end: bool = True,
    device: str = "cpu",
    wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    save_after: Sequence[int] = (),
    save_s: float = 0.0,
    evaluate_after: Sequence[int] = (),
    evaluations: int = 1,
    at_epoch_end: bool = False,
) -> TrainerState:
    """Call the hooks for ``max_steps`` optimizer steps of a small model (real ops for the profiler).

    Args:
        stop_after: Stop calling hooks after this step, as if training died there.
        end: Whether to call ``on_train_end``.
        wrap: Wraps or shards the model (FSDP1, FSDP2) before the optimizer is built; the callbacks get
            what it returns, as the Trainer passes FSDP's model to them.
        save_after: The steps after whose ``on_step_end`` a checkpoint is taken (``on_save``), ``save_s`` long.
        evaluate_after: The same for an evaluation (``on_evaluate``), before the checkpoint when both; ``evaluations``
            of them (a dict of eval datasets), decided at the step's end or, ``at_epoch_end``, at ``on_epoch_end``.
    """
    args = training_args(tmp_path)
    state = TrainerState()
    state.max_steps = max_steps
    control = TrainerControl()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    if wrap is not None:
        model = wrap(model)
    # Momentum: one state tensor per parameter, as a real optimizer keeps.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for cb in callbacks:
        cb.on_train_begin(args, state, control, model=model)
    for step in range(1, max_steps + 1):
        for cb in callbacks:
            cb.on_step_begin(args, state, control, model=model)
        loss = model(torch.randn(16, 32, device=device)).square().mean()
        loss.backward()
        for cb in callbacks:
            cb.on_pre_optimizer_step(args, state, control, model=model, optimizer=opt)
        opt.step()
        for cb in callbacks:
            cb.on_optimizer_step(args, state, control, model=model, optimizer=opt)
        opt.zero_grad()
        state.global_step = step
        control.should_save = step in save_after  # (DefaultFlowCallback's decision, before every other callback's)
        control.should_evaluate = step in evaluate_after and not at_epoch_end
        for cb in callbacks:
            cb.on_step_end(args, state, control, model=model)
        if at_epoch_end and step in evaluate_after:  # (eval_strategy="epoch": decided at the epoch's end)
            control.should_evaluate = True
            for cb in callbacks:
                cb.on_epoch_end(args, state, control, model=model)
        if control.should_evaluate:  # (the Trainer evaluates, then saves; one on_evaluate per eval dataset)
            control.should_evaluate = False
            for _ in range(evaluations):
                time.sleep(save_s)
                for cb in callbacks:
                    cb.on_evaluate(args, state, control, model=model, metrics={})
        if control.should_save:
            time.sleep(save_s)  # the checkpoint
            control.should_save = False  # (the Trainer's callback handler, before on_save)
            for cb in callbacks:
                cb.on_save(args, state, control, model=model)
        if stop_after is not None and step >= stop_after:
            return state
    if end:
        for cb in callbacks:
            cb.on_train_end(args, state, control, model=model)
    return state
