"""A Trainer script as users write it: a small GPT-2 built from its config, random tokens, ``Trainer.train()``.

How it sets up logging and whether it passes hf_distprof's callbacks itself come from the environment (test-only):

- ``PLAIN_LOGGING``: ``none`` (the default: configures nothing), ``basicconfig`` (``logging.basicConfig()`` with no
  level, as transformers' ``run_clm.py`` does), ``tf-error`` (``transformers.logging.set_verbosity_error()``).
- ``PLAIN_CALLBACKS=1``: parse hf_distprof's flags beside the Trainer's and pass ``build_callbacks(...)`` (the
  two-line route); otherwise the script never imports hf_distprof (``hf-distprof run`` attaches it).
- ``PLAIN_COLLATOR_SLEEP="<rank>:<seconds>[:<every>[:<first>[:<block>]]]"``: that rank's collator sleeps that long
  per batch (a slow loader); with ``every``, on every ``every``-th batch only (its 2nd, 4th ... for 2); with
  ``first``, from its ``first``-th batch on; with ``block``, in ``block`` batches from the ``first``-th, then not in
  the next ``block``, and so on. Batches count from 1; accelerate fetches one ahead, so the ``k``-th batch is
  collated during step ``k - 1`` (``state.global_step`` after it, the step timer's and the profiler's step).
- ``PLAIN_PROFILE_NOW="<step>:<path>"``: rank 0 touches ``path`` (a run folder's ``PROFILE_NOW``) at the start of that
  optimizer step, as a user asking ``--profile-on-demand`` for a window would.
- ``PLAIN_MORE_WORK="<rank>:<factor>"``: that rank's collator repeats each batch's samples ``factor`` times (more work
  per step: uneven batches).
- ``PLAIN_SEGV="<rank>:<step>"``: that rank dies of SIGSEGV at the start of that optimizer step
  (``faulthandler._sigsegv()``, from a callback): a native crash mid-run.
- ``PLAIN_RAISE="<rank>:<step>"``: that rank's callback raises a ``RuntimeError`` at the start of that optimizer step.
- ``PLAIN_REPORT_TO="tensorboard,wandb,..."``: ``training_args.report_to`` set to that list in the script, as a user
  sets it in code (``--report_to`` on the command line takes one name).
- ``PLAIN_EXIT=natural``: end as most user scripts do, by returning from ``main`` (no ``destroy_process_group``, the
  interpreter's own teardown); otherwise the script ends as described at its end.
- ``PLAIN_ITERABLE=1``: the same tokens as an ``IterableDataset`` (no ``__len__``): accelerate then dispatches the
  batches from rank 0 (its default ``dispatch_batches`` for one), which loads every rank's and broadcasts them.
- ``PLAIN_PIN=1``: rank ``r`` runs on CPU ``r`` only (of those it may use), so that another process pinned to one core
  shares that rank's core alone.
- ``HF_DISTPROF_ALTERNATE_CORES=1``: at every batch the collator moves the main thread to the next CPU (rank ``r``'s
  ``n``-th batch on CPU ``(r + n) mod`` the CPUs it may use), as the demo's training script does for the scenario
  suite: this VM's cores each switch between speeds ~20% apart for seconds at a time, so in a run of a few seconds a
  rank that stays on one core is truly slower, by no doing of its own. Crossed over, each rank gets each core alike.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 512, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class RandomTokenStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return (RandomTokens()[i] for i in range(100_000))


def collate(rank: int, sleep_s: float, every: int = 1, first: int = 1, block: int = 0, repeat: int = 1) -> Any:
    calls = 0
    cpus = sorted(os.sched_getaffinity(0)) if os.environ.get("HF_DISTPROF_ALTERNATE_CORES") == "1" else []

    def fn(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        nonlocal calls
        if cpus:
            os.sched_setaffinity(0, {cpus[(rank + calls) % len(cpus)]})  # 0: this (the main) thread
        calls += 1
        if sleep_s and calls % every == 0 and calls >= first and (not block or (calls - first) // block % 2 == 0):
            time.sleep(sleep_s)
        features = features * repeat
        return {k: torch.stack([f[k] for f in features]) for k in features[0]}

    return fn


class SegfaultAt(TrainerCallback):
    """Rank ``rank`` dies of SIGSEGV at the start of optimizer step ``step``."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step and args.process_index == self.rank:
            import faulthandler

            faulthandler._sigsegv()


class RaiseAt(TrainerCallback):
    """Rank ``rank`` raises at the start of optimizer step ``step`` (a user's callback that fails)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step and args.process_index == self.rank:
            raise RuntimeError(f"user callback failed at step {self.step}")


class TouchAt(TrainerCallback):
    """Rank 0 touches ``path`` at the start of optimizer step ``step``."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step and args.process_index == 0:
            open(self.path, "a").close()


def main() -> None:
    style = os.environ.get("PLAIN_LOGGING", "none")
    if style == "basicconfig":
        logging.basicConfig()
    elif style == "tf-error":
        import transformers

        transformers.logging.set_verbosity_error()
    callbacks: list[Any] = []
    if os.environ.get("PLAIN_CALLBACKS") == "1":
        from hf_distprof import ProfilingArguments, build_callbacks

        parser = HfArgumentParser((ProfilingArguments, TrainingArguments))
        prof_args, training_args = parser.parse_args_into_dataclasses()
        callbacks = build_callbacks(prof_args)
    else:
        (training_args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    rank = training_args.process_index
    if os.environ.get("PLAIN_REPORT_TO"):
        training_args.report_to = os.environ["PLAIN_REPORT_TO"].split(",")
    if os.environ.get("PLAIN_PIN") == "1":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[training_args.local_process_index % len(cpus)]})
    heavy, _, factor = os.environ.get("PLAIN_MORE_WORK", "-1:1").partition(":")
    repeat = int(factor) if int(heavy) == rank else 1
    who, _, rest = os.environ.get("PLAIN_COLLATOR_SLEEP", "-1:0").partition(":")
    seconds, _, rest = rest.partition(":")
    every, _, rest = rest.partition(":")
    first, _, block = rest.partition(":")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    sleep_s = float(seconds) if int(who) == rank else 0.0
    touch_step, _, touch_path = os.environ.get("PLAIN_PROFILE_NOW", "").partition(":")
    if touch_step:
        callbacks = [*callbacks, TouchAt(int(touch_step), touch_path)]
    segv_rank, _, segv_step = os.environ.get("PLAIN_SEGV", "").partition(":")
    if segv_rank:
        callbacks = [*callbacks, SegfaultAt(int(segv_rank), int(segv_step))]
    raise_rank, _, raise_step = os.environ.get("PLAIN_RAISE", "").partition(":")
    if raise_rank:
        callbacks = [*callbacks, RaiseAt(int(raise_rank), int(raise_step))]
    data = RandomTokenStream() if os.environ.get("PLAIN_ITERABLE") == "1" else RandomTokens()
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=callbacks,
                      data_collator=collate(rank, sleep_s, int(every or 1), int(first or 1), int(block or 0),
                                            repeat))
    trainer.train()


if __name__ == "__main__":
    main()
    if os.environ.get("PLAIN_EXIT") == "natural":
        sys.exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()
    # Leave without the interpreter's C++ teardown, where gloo's worker threads now and then deadlock against the
    # DDP reducer's destructor (seen here once in six 2-rank runs, in torch's own teardown): a test must not hang on
    # torch's exit. hf_distprof.dist.finish does the same in our own scripts. A user's script without these lines
    # can still meet that teardown hang or abort (FACTS.md), with or without hf_distprof; these tests do not.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
