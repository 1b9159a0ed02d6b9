# nvidia-h100-x1, session 14 (#18), after call_18_a.sh on the same warm machine: carry [".gpu/sh"].
#   bash benchmarks/gpu/device/call_18_b.sh
# Qwen3-4B's shape (random weights), GRPO colocated with a stock SGLang engine on one 80 GB H100, the
# megatron trainer with training.offloadOptimizer: the memory of every phase (benchmarks/gpu/colocated_step.py);
# then a layout that cannot fit (4096-token responses, no recompute, no offload): the trainer refuses it
# with its estimate before building anything.
[ -f /tmp/site/.kit-id ] || { echo "NO KIT: the machine was recycled; start again with the part calls"; exit 3; }
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-560}
source .gpu/sh/lib.sh
export STEP_LOGS=j FAIL_TAIL=30
C="python3 benchmarks/gpu/colocated_step.py --model 4b --backend megatron --mem-fraction 0.6 --steps 3 --model-root /tmp/rljob-models"
[ -n "$SKIP_TEST" ] || step offload-test 60 python3 -m pytest tests/gpu/test_optimizer_offload_gpu.py -q -s -p no:cacheprovider --timeout 55
step colocated-4b 400 $C --offload-optimizer --json $J/colocated-4b-offload.json
step colocated-4b-refused 100 $C --steps 1 --response-len 4096 --no-recompute --json $J/colocated-4b-refused.json
free -g | head -2
pack
summary
grep -h "does not fit\|estimated GPU memory" $J/logs/colocated-*.log | cut -c1-900 | head -6
