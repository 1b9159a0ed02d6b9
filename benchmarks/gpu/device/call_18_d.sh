# nvidia-h200-x2, session 14 (#18): the 4th call (carry [".gpu/sh", ".gpu/p4"] after the calls carrying
# .gpu/p1 ... .gpu/p3), or [".gpu/sh"] on a machine with the kit.
#   bash benchmarks/gpu/device/call_18_d.sh
# Dynamic batching on CUDA (bf16 packed vs padded through the varlen kernel), Qwen3-8B's shape at TP2 on
# the two GPUs with the optimizer offloaded and each GPU capped at 78 GiB (an 80 GB H100's share), the
# dynamic-batching throughput on a long-tail mix, then MFU on one H200 (4b, 1b); 3 runs per MFU figure.
# In priority order: a step the call's budget cannot fit is skipped. As run (session 14) it got 2 x H100, not
# H200s: the "-h200" JSON names are that machine's; the dynamic-batching benchmark then ran out of memory
# (fixed in schedule.token_stats) and was rerun on another H100 (docs/BENCHMARKS.md, session 14).
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-550}
source .gpu/sh/lib.sh
export STEP_LOGS=j FAIL_TAIL=30
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc; uptime
step dynbatch-test 90 python3 -m pytest tests/gpu/test_dynamic_batch_gpu.py -q -s -p no:cacheprovider --timeout 85
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope --runs 3"
step mfu-8b-tp2 170 torchrun --nproc-per-node 2 benchmarks/gpu/megatron_mfu.py --models 8b --tp 2 --offload-optimizer \
  --memory-limit-gib 78 --fusions wgrad,norm,rope --micro-batches 8 --runs 3 --steps 2 --warmup 1 --json $J/mfu-8b-tp2.json
unset PYTORCH_CUDA_ALLOC_CONF
step dynbatch-bench 110 python3 benchmarks/gpu/dynamic_batch.py --shape 1b --steps 2 --json $J/dynamic-batch-1b.json
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CUDA_VISIBLE_DEVICES=0
step mfu-4b-h200 110 $MFU --models 4b --micro-batches 8 --steps 2 --warmup 1 --json $J/mfu-4b-h200.json
step mfu-1b-b2-h200 60 $MFU --models 1b --micro-batches 4 --micro-batch-size 2 --steps 3 --warmup 2 --json $J/mfu-1b-b2-h200.json
step mfu-1b-h200 60 $MFU --models 1b --micro-batches 8 --steps 3 --warmup 2 --json $J/mfu-1b-h200.json
pack
summary
grep -h "^{" $J/logs/dynbatch-bench.log | cut -c1-500
