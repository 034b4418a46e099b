"""Launching the runs of ``hf-distprof scaling``: the default command (the demo's training under ``torchrun``), the
placeholders of a command template, the per-rank batch, and one run with its output in its folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


DEFAULT_SCRIPT = Path(__file__).resolve().parents[1] / "recipe" / "train_mlm.py"  # in the package: in a wheel too


LAUNCH_LOG = "launch.log"  # the command's output, in each nproc{N} folder


PLACEHOLDERS = ("{nproc}", "{output_dir}", "{steps}", "{batch}")


def default_template() -> list[str]:
    """Our training script under ``torchrun`` (this Python), the step timer on, nothing else written."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "{nproc}",
        str(DEFAULT_SCRIPT), "--enable-step-timing", "--max-steps", "{steps}",
        "--per-device-train-batch-size", "{batch}", "--logging-steps", "{steps}", "--disable-tqdm", "true",
        "--report-to", "none", "--save-strategy", "no",
        "--profiler-output-dir", "{output_dir}", "--profiler-run-name", "run",
        # One Trainer folder for every process count: the tokenizer trained by the first run is reused.
        "--output-dir", "{output_dir}/../trainer",
    ]


def per_rank_batch(mode: str, batch_size: int, nproc: int) -> int:
    """The per-rank batch of one run: ``batch_size`` (weak), or ``batch_size / nproc`` (strong)."""
    return batch_size if mode == "weak" else batch_size // nproc


def fill(template: list[str], nproc: int, output_dir: Path, steps: int, batch: int) -> list[str]:
    """The command of one run: the placeholders replaced (plain replacement: other braces stay as they are)."""
    values = {"{nproc}": str(nproc), "{output_dir}": str(output_dir), "{steps}": str(steps), "{batch}": str(batch)}
    out = []
    for token in template:
        for key, value in values.items():
            token = token.replace(key, value)
        out.append(token)
    return out


def launch(command: list[str], run_dir: Path, timeout: int) -> str | None:
    """Run one command with its output in ``run_dir/launch.log``; None on success, else what went wrong."""
    env = dict(os.environ)
    # Every process count gets one thread per process, so that 1 process does not use every core that N
    # processes have to share (torchrun sets this for N > 1 only).
    env.setdefault("OMP_NUM_THREADS", "1")
    log = run_dir / LAUNCH_LOG
    try:
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"did not finish in {timeout} s (--timeout); its output is in {log}"
    except OSError as exc:
        return f"could not be started: {exc.strerror or exc}"
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        return f"exited with status {proc.returncode}; the end of {log}:\n{tail}"
    return None
