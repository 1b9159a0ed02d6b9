# same machine, next call within 30 s, carry .gpu/sh (the kit, SmolLM2's GGUF in it, is installed):
# the GPU sync driver test, colocated (CUDA IPC), torch and megatron
# backends (megatron: fused Adam on GPU).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export RLJOB_RESULTS_DIR=$J
step grpo 200 python3 -m pytest tests/gpu/test_gpu_sync_grpo.py -q -s -p no:cacheprovider -k "torch-ipc"
step grpo 200 python3 -m pytest tests/gpu/test_gpu_sync_grpo.py -q -s -p no:cacheprovider -k "megatron-ipc"
grep -E "pushes|after last|passed|failed|Error|rc=" $OUT/grpo.log | tail -20
