"""A real Trainer on a tiny model with hf_distprof's callbacks, for fault tests: starts in seconds on 2 gloo ranks.

Flags: hf_distprof's and the Trainer's (``--max-steps``, ``--save-steps``, ``--resume-from-checkpoint`` ...).
Faults, from the environment (test-only):

- ``TINY_FAULT="<rank>:<step>:<kill|raise|term|term-launcher>"``: when that optimizer step ends, the rank
  SIGKILLs itself, raises, sends itself SIGTERM (a user's ``kill`` of one rank), or sends SIGTERM to its launcher
  (torchrun, which forwards it to every rank, as a scheduler's stop does); ``<step>`` = ``export`` sends the SIGTERM
  from inside the rank's first trace export instead.
- ``TINY_STEP_S``: seconds each step sleeps (so a run lasts long enough to be interrupted).
- ``TINY_STALL="<rank|all>:<step|*>:<seconds>[,...]"``: at the start of that optimizer step (``*``: of every step)
  the rank sleeps that long, inside the step (a slow step for ``--profile-on-anomaly``).
- ``TINY_TRIGGER="<rank>:<step>:<touch|usr1>[,...]"``: at the start of that step the rank touches ``PROFILE_NOW``
  in the run folder, or sends itself SIGUSR1 (``--profile-on-demand``).
- ``TINY_SLOW_FORWARD="<rank>:<seconds>"``: that rank's forward sleeps that long in every step: a slow rank by its
  own work (pre-sync time), which its peers wait for in the gradient all-reduce (``--profile-ranks auto``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

from hf_distprof import ProfilingArguments, build_callbacks
from hf_distprof.dist import finish

FAULT_ENV = "TINY_FAULT"
STEP_S_ENV = "TINY_STEP_S"
STALL_ENV = "TINY_STALL"
TRIGGER_ENV = "TINY_TRIGGER"
SLOW_FORWARD_ENV = "TINY_SLOW_FORWARD"


class TinyModel(torch.nn.Module):
    def __init__(self, slow_s: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.slow_s:
            time.sleep(self.slow_s)
        return {"loss": (self.net(x) - labels).square().mean()}


class RandomData(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(64, generator=g), "labels": torch.randn(64, generator=g)}


class FaultCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int, how: str, step_s: float) -> None:
        self.step, self.how, self.step_s = step, how, step_s

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.step_s)
        if state.global_step != self.step:
            return
        if self.how in ("kill", "term"):
            os.kill(os.getpid(), signal.SIGKILL if self.how == "kill" else signal.SIGTERM)
            time.sleep(30)  # (SIGTERM: its handler runs between this sleep's bytecodes, then the default action)
        elif self.how == "term-launcher":
            os.kill(os.getppid(), signal.SIGTERM)
        else:
            raise RuntimeError(f"simulated crash after step {self.step}")


class StepStartCallback(TrainerCallback):  # type: ignore[misc]
    """TINY_STALL and TINY_TRIGGER: what this rank does at the start of given optimizer steps."""

    def __init__(self, rank: int, run_dir: Path) -> None:
        self.actions: dict[int, list[str]] = {}
        self.every: list[str] = []
        specs = [s for env in (STALL_ENV, TRIGGER_ENV) for s in os.environ.get(env, "").split(",") if s]
        for spec in specs:
            who, step, what = spec.split(":")
            if who == "all" or int(who) == rank:
                (self.every if step == "*" else self.actions.setdefault(int(step), [])).append(what)
        self.request_file = run_dir / "PROFILE_NOW"

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for what in [*self.every, *self.actions.get(state.global_step + 1, [])]:
            if what == "touch":
                self.request_file.touch()
            elif what == "usr1":
                os.kill(os.getpid(), signal.SIGUSR1)
            else:
                time.sleep(float(what))


def signal_launcher_from_first_export() -> None:
    from torch.profiler import profile

    original = profile.export_chrome_trace

    def export(self: profile, path: str) -> Any:
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(0.5)  # torchrun forwards it to every rank meanwhile: it arrives during this export
        return original(self, path)

    profile.export_chrome_trace = export


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.WARNING)
    prof_args, training_args = HfArgumentParser((ProfilingArguments, TrainingArguments)).parse_args_into_dataclasses()
    rank = training_args.process_index
    callbacks = build_callbacks(prof_args)
    fault = os.environ.get(FAULT_ENV, "")
    step_s = float(os.environ.get(STEP_S_ENV, "0"))
    fault_cb = FaultCallback(-1, "", step_s)
    if fault:
        who, step, how = fault.split(":")
        if int(who) == rank:
            if step == "export":
                signal_launcher_from_first_export()
            else:
                fault_cb = FaultCallback(int(step), how, step_s)
    run_dir = Path(prof_args.profiler_output_dir) / str(prof_args.profiler_run_name)
    slow_rank, _, slow_s = os.environ.get(SLOW_FORWARD_ENV, "-1:0").partition(":")
    model = TinyModel(float(slow_s) if int(slow_rank) == rank else 0.0)
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomData(),
                      callbacks=[*callbacks, fault_cb, StepStartCallback(rank, run_dir)])
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)


if __name__ == "__main__":
    try:
        main()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    finish(0)  # as the training script does: no C++ teardown, where gloo's threads can abort a finished run
