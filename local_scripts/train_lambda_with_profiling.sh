#!/usr/bin/env bash
# The 50-step profiling demo: train_lambda.sh with profiling and memory logging on, then the findings and
# where to look.
#
#   ./local_scripts/train_lambda_with_profiling.sh                  # 50 steps, traces in ./profiler_traces
#   OUTPUT_DIR=/shared/prof ./local_scripts/train_lambda_with_profiling.sh --profile-ranks 0,1
#
# The findings are those of the run folder this training wrote (it names it in a temporary file,
# $HF_DISTPROF_RUN_DIR_FILE), wherever --profiler-output-dir points and whatever other runs lie beside it.
#
# Environment (all optional; NPROC, NNODES, ... are train_lambda.sh's):
#   MAX_STEPS    optimizer steps (default 50)
#   OUTPUT_DIR   --profiler-output-dir (default ./profiler_traces)
#   TRAIN_OUTPUT --output-dir of the Trainer: TensorBoard runs, tokenizer (default ./outputs/modernbert)
# Extra arguments are passed through and win over the defaults above.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAX_STEPS=${MAX_STEPS:-50}
OUTPUT_DIR=${OUTPUT_DIR:-./profiler_traces}
TRAIN_OUTPUT=${TRAIN_OUTPUT:-./outputs/modernbert}

# Each node's first training process writes the path of the run folder it created into this file
# (hf_distprof.paths.RUN_DIR_FILE_ENV); torchrun and accelerate pass the variable on to every rank.
RUN_DIR_FILE=$(mktemp "${TMPDIR:-/tmp}/hf_distprof_run_dir.XXXXXX")
trap 'rm -f "$RUN_DIR_FILE"' EXIT

HF_DISTPROF_RUN_DIR_FILE="$RUN_DIR_FILE" "$REPO_ROOT/local_scripts/train_lambda.sh" \
  --max-steps "$MAX_STEPS" \
  --output-dir "$TRAIN_OUTPUT" \
  --enable-profiling \
  --enable-memory-logging \
  --profiler-output-dir "$OUTPUT_DIR" \
  --memory-log-steps 5 \
  --logging-steps 5 \
  "$@"

# The training script's last lines (rank 0) say where the traces, summaries and TensorBoard files are.
RUN_DIR=$(head -n 1 "$RUN_DIR_FILE")
if [[ -n "$RUN_DIR" ]]; then
  echo
  echo "Findings (hf-distprof analyze ${RUN_DIR} --findings):"
  python -m hf_distprof.cli.main analyze "$RUN_DIR" --findings || true
else
  echo "train_lambda_with_profiling.sh: the training named no run folder of its own (see its warnings above);" \
    "no findings" >&2
fi
