#!/usr/bin/env bash
# Launch python_scripts/train_modernBERT.py with `accelerate launch`; every argument is passed through.
#
#   NPROC=2 ./local_scripts/train_lambda.sh --enable-profiling --max-steps 50
#   NPROC=2 ./local_scripts/train_lambda.sh --strategy fsdp --enable-profiling --max-steps 10
#
# --strategy ddp|fsdp (default ddp) is read here and passed on to the training script as well. fsdp on a
# GPU machine launches with local_scripts/accelerate/fsdp2.yaml (accelerate's FSDP2). Without GPUs
# accelerate would ignore its FSDP plugin and train DDP, so there the launch stays MULTI_CPU and the
# training script shards the model itself (transformers' DistributedConfig).
#
# NCCL and c10d debugging, flags of the training script that every rank applies before its process group
# exists (hf_distprof.recipe.debug_env); files go to <--profiler-output-dir>/nccl_debug[/<--profiler-run-name>]/:
#   --nccl-debug WARN|INFO|TRACE [--nccl-debug-subsys INIT,COLL]   NCCL's log, one file per host and process
#   --torch-distributed-debug OFF|INFO|DETAIL                       c10d's checks of every collective
#   --flight-recorder-entries N                                     NCCL flight recorder, dumped on a timeout
#
# Nsight Systems: one nsys around this script follows accelerate into every rank process; --nsys-window opens
# the capture over the profiler schedule's active steps, --nvtx names the step phases:
#   nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o nsys_%h \
#     ./local_scripts/train_lambda.sh --nsys-window --nvtx --max-steps 20
#
# Environment (all optional):
#   NPROC        processes on this node (default: the GPUs this process may use: CUDA_VISIBLE_DEVICES' entries when
#                it is set, else nvidia-smi's count; without GPUs, 2 CPU processes on gloo)
#   NNODES       number of nodes (default 1); with NODE_RANK, MASTER_ADDR, MASTER_PORT for multi-node
#   NODE_RANK    this node's rank (default 0)
#   MASTER_ADDR  address of node 0 (default 127.0.0.1)
#   MASTER_PORT  rendezvous port (default 29500)
#   MIXED_PRECISION  no | fp16 | bf16 (default no)
#   TRAIN_SCRIPT training entry point (default python_scripts/train_modernBERT.py)
#   SKIP_PREFLIGHT=1  skip the flag check that runs once before launching
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

gpu_count() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    # What the ranks can see: "0,1" is 2, "" and "-1" hide every GPU.
    if [[ -z "$CUDA_VISIBLE_DEVICES" || "$CUDA_VISIBLE_DEVICES" == -* ]]; then echo 0; return; fi
    tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c . || true
  else
    echo 0
  fi
}

GPUS=$(gpu_count)
if [[ "${GPUS:-0}" -gt 0 ]]; then DEFAULT_NPROC=$GPUS; else DEFAULT_NPROC=2; fi
NPROC=${NPROC:-$DEFAULT_NPROC}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
MIXED_PRECISION=${MIXED_PRECISION:-no}
TRAIN_SCRIPT=${TRAIN_SCRIPT:-$REPO_ROOT/python_scripts/train_modernBERT.py}

# The strategy, from the arguments (they all go on to the training script, --strategy included).
STRATEGY=ddp
ARGS=("$@")
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  case "${ARGS[$i]}" in
    --strategy=*) STRATEGY=${ARGS[$i]#--strategy=} ;;
    --strategy) STRATEGY=${ARGS[$((i + 1))]:-} ;;
    -h | --help) exec python "$TRAIN_SCRIPT" "$@" ;;  # the help once, not once more per rank
  esac
done
if [[ "$STRATEGY" != ddp && "$STRATEGY" != fsdp ]]; then
  echo "train_lambda.sh: --strategy must be ddp or fsdp, got '$STRATEGY'" >&2
  exit 2
fi

if ! [[ "$NPROC" =~ ^[1-9][0-9]*$ ]]; then
  echo "train_lambda.sh: NPROC must be a positive integer, got '$NPROC'" >&2
  exit 2
fi

TOTAL=$((NPROC * NNODES))
LAUNCH_ARGS=(
  --num_processes "$TOTAL"
  --num_machines "$NNODES"
  --machine_rank "$NODE_RANK"
  --main_process_ip "$MASTER_ADDR"
  --main_process_port "$MASTER_PORT"
  --mixed_precision "$MIXED_PRECISION"
  --dynamo_backend no
)
if [[ "$STRATEGY" == fsdp && "${GPUS:-0}" -gt 0 ]]; then
  # accelerate's FSDP2; the command-line settings above win over the file's.
  LAUNCH_ARGS=(--config_file "$REPO_ROOT/local_scripts/accelerate/fsdp2.yaml" "${LAUNCH_ARGS[@]}")
elif [[ "$TOTAL" -gt 1 ]]; then
  # --multi_gpu is accelerate's switch for any multi-process run; without GPUs it runs MULTI_CPU on gloo.
  # (--cpu with several processes would start only ONE.)
  LAUNCH_ARGS=(--multi_gpu "${LAUNCH_ARGS[@]}")
fi
if [[ "${GPUS:-0}" -eq 0 ]]; then
  echo "train_lambda.sh: no GPU found; running $NPROC CPU process(es) per node on gloo" >&2
  if [[ "$STRATEGY" == fsdp ]]; then
    echo "train_lambda.sh: --strategy fsdp on CPU: the training script shards the model with FSDP2 itself" \
      "(accelerate's FSDP plugin does not run on CPU)" >&2
  fi
fi

# Pre-flight: a bad flag fails here, once, with exit status 2 and the flag's name, instead of in every
# rank behind the launcher's traceback. Only our own script knows HF_DISTPROF_PARSE_ONLY; SKIP_PREFLIGHT=1
# skips the check (it costs one interpreter start and the transformers import, a few seconds).
if [[ "${SKIP_PREFLIGHT:-0}" != "1" && "$TRAIN_SCRIPT" -ef "$REPO_ROOT/python_scripts/train_modernBERT.py" ]]; then
  HF_DISTPROF_PARSE_ONLY=1 python "$TRAIN_SCRIPT" "$@"
fi

exec accelerate launch "${LAUNCH_ARGS[@]}" "$TRAIN_SCRIPT" "$@"
