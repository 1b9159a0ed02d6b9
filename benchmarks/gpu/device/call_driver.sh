# same machine, next call within 30 s, carry .gpu/smol-b .gpu/sh (SmolLM2 is whole now): the GPU sync
# driver test (torch/megatron x ipc/nccl) and the Megatron equivalence (now with SDPA attention).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_sync.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
timeout 420 env RLJOB_RESULTS_DIR=$OUT python3 -m pytest tests/gpu/test_gpu_sync_grpo.py -q -s -p no:cacheprovider > $OUT/grpo.log 2>&1
echo "grpo rc=$?" >> $OUT/grpo.log; grep -E "pushes|after last|passed|failed|Error" $OUT/grpo.log | tail -20
timeout 120 env RLJOB_SMOLLM2_DIR=$RLJOB_CACHE/models/SmolLM2-135M-Instruct python3 -m pytest tests/gpu/test_megatron_equivalence.py -q -s -p no:cacheprovider > $OUT/equiv.log 2>&1
echo "equiv rc=$?" >> $OUT/equiv.log; tail -12 $OUT/equiv.log
