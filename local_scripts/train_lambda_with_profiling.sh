#!/usr/bin/env bash
# The 50-step profiling demo: train_lambda.sh with profiling and memory logging on, then the findings and
# where to look.
#
#   ./local_scripts/train_lambda_with_profiling.sh                  # 50 steps, traces in ./profiler_traces
#   OUTPUT_DIR=/shared/prof ./local_scripts/train_lambda_with_profiling.sh --profile-ranks 0,1
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

"$REPO_ROOT/local_scripts/train_lambda.sh" \
  --max-steps "$MAX_STEPS" \
  --output-dir "$TRAIN_OUTPUT" \
  --enable-profiling \
  --enable-memory-logging \
  --profiler-output-dir "$OUTPUT_DIR" \
  --memory-log-steps 5 \
  --logging-steps 5 \
  "$@"

# The training script's last lines (rank 0) say where the traces, summaries and TensorBoard files are.
LATEST=$(ls -1dt "$OUTPUT_DIR"/*/ 2>/dev/null | head -n 1 || true)
if [[ -n "$LATEST" ]]; then
  echo
  echo "Findings (hf-distprof analyze ${LATEST} --findings):"
  python -m hf_distprof.cli.main analyze "$LATEST" --findings || true
fi
