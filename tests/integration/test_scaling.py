"""``hf-distprof scaling`` for real: the training script under torchrun at 1 and 2 CPU processes, through a
command template (the default command is the same script under torchrun, tested by hand: see the guide)."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys

import pytest

from hf_distprof.core import names

from ..conftest import REPO_ROOT

pytestmark = pytest.mark.integration

STEPS = 6  # the first is the warm-up: 5 steps per process count are counted
BATCH = 4
SEQ = 64
# The training script under torchrun, as the default command, but on a small text file: no tokenizer training
# on the standard library's docstrings and a shorter sequence keep two launches within the suite's budget.
TEMPLATE = [
    sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "{nproc}",
    str(REPO_ROOT / "python_scripts" / "train_modernBERT.py"), "--enable-step-timing", "--max-steps", "{steps}",
    "--per-device-train-batch-size", "{batch}", "--logging-steps", "{steps}", "--disable-tqdm", "true",
    "--report-to", "none", "--save-strategy", "no", "--max-seq-length", str(SEQ),
    "--profiler-output-dir", "{output_dir}", "--output-dir", "{output_dir}/trainer",
]


def test_scaling_runs_1_and_2_processes_and_writes_the_table_csv_json_and_png(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TENSORBOARD_LOGGING_DIR", None)
    rng = random.Random(0)
    words = "rank step data loader forward backward gradient optimizer sync wait batch token layer trace".split()
    text = tmp_path / "train.txt"
    text.write_text("\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(300)) + "\n")
    out = tmp_path / "study"
    proc = subprocess.run(
        [sys.executable, "-m", "hf_distprof.cli.main", "scaling", "--nprocs", "1,2", "--steps", str(STEPS),
         "--batch-size", str(BATCH), "--output-dir", str(out), "--", *TEMPLATE, "--train-file", str(text)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == ("weak scaling (per-rank batch fixed); speedup and efficiency against 1 process(es); samples/s "
                        "and tokens/s over the counted steps' summed time (long steps weigh in: compare's are the "
                        "median step's)")
    assert lines[1].split() == ["nproc", "steps", "median", "step", "s", "samples/s", "tokens/s", "speedup",
                                "efficiency", "%", "comm", "%"]
    one, two = (line.split() for line in lines[2:4])
    assert (one[:2], two[:2]) == (["1", "5"], ["2", "5"])
    assert (one[5], one[6]) == ("1.000", "100.0")
    with open(out / names.SCALING_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["nproc"], r["steps"]) for r in rows] == [("weak", "1", "5"), ("weak", "2", "5")]
    # Weak scaling: BATCH samples of SEQ tokens per rank and step, at 1 process and at 2.
    assert [float(r["per_rank_batch"]) for r in rows] == [BATCH, BATCH]
    assert [float(r["global_batch"]) for r in rows] == [BATCH, 2 * BATCH]
    for r in rows:
        assert float(r["tokens_per_s"]) == pytest.approx(float(r["samples_per_s"]) * SEQ)
    eff = float(rows[1]["speedup"]) / 2 * 100
    assert float(rows[1]["efficiency_pct"]) == pytest.approx(eff)
    assert [p["nproc"] for p in json.loads((out / names.SCALING_JSON).read_text())["points"]] == [1, 2]
    assert (out / names.SCALING_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for n in (1, 2):
        (run_dir,) = (p.parent for p in (out / names.SCALING_RUN_DIR.format(nproc=n)).glob("*/timing_rank0.jsonl"))
        assert sorted(p.name for p in run_dir.glob("timing*")) == sorted(
            [*(names.TIMING_LOG_NAME.format(rank=r) for r in range(n)), names.TIMING_SUMMARY_NAME])
