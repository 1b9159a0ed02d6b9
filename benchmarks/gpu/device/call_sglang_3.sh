# nvidia-h200-x2, a third call if device time is left (carry .gpu/sh): the NCCL weight sync into SGLang
# (0.5B and 4B, both GPUs), then the rollout throughput at 1.5B on GPU 1 beside nothing else.
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j
SYNC_LIMIT=120 sync_models nccl 0.5b 4b
export CUDA_VISIBLE_DEVICES=1
step throughput-1.5b 280 python3 benchmarks/gpu/rollout_throughput.py THROUGHPUT_ARGS_1_5B
pack
summary
