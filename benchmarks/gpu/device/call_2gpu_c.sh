# same machine, next call within 30 s, carry .gpu/sh (the kit, SmolLM2's GGUF in it, is installed): the GPU sync
# driver test across GPUs (NCCL), torch and megatron; the Megatron equivalence (SDPA attention).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_2gpu_a.sh"; exit 3; }
export CALL_BUDGET=${CALL_BUDGET:-480}
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J
step grpo 130 python3 -m pytest tests/gpu/test_gpu_sync_grpo.py -q -s -p no:cacheprovider -k "torch-nccl"
step grpo 130 python3 -m pytest tests/gpu/test_gpu_sync_grpo.py -q -s -p no:cacheprovider -k "megatron-nccl"
step equiv 190 env RLJOB_SMOLLM2_DIR=$RLJOB_CACHE/models/SmolLM2-135M-Instruct python3 -m pytest tests/gpu/test_megatron_equivalence.py -q -s -p no:cacheprovider
grep -E "pushes|after last|passed|failed|Error|rc=" $OUT/grpo.log | tail -20; tail -14 $OUT/equiv.log
