# nvidia-h200-x2, a third call as device time allows (carry .gpu/sh): one stream per GPU.
#   GPU 0: the IPC weight sync into SGLang (4B first: the target's model, then 0.5B and 1.5B)
#   GPU 1: the rollout throughput of the runtime's path against stock SGLang (0.5B), then the hf engine's
#          (1.5B: the same commands with --model 1.5b, in a call of its own)
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J STEP_LOGS=j
(
  export CUDA_VISIBLE_DEVICES=0 SYNC_LIMIT=120
  sync_models ipc 4b 0.5b 1.5b
) &
(
  export CUDA_VISIBLE_DEVICES=1
  step g1-throughput-0.5b 420 python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes stock runtime \
    --stock-logprobs --model-root /dev/shm/rljob-models --json $J/throughput-0.5b.json
  step g1-throughput-0.5b-hf 120 python3 benchmarks/gpu/rollout_throughput.py --model 0.5b --modes hf \
    --stock-from $J/throughput-0.5b.json --model-root /dev/shm/rljob-models --json $J/throughput-0.5b-hf.json
) &
wait
pack
summary
