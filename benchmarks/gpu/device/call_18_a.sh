# nvidia-h100-x1, session 14 (#18), the install call's work: carry [".gpu/sh", ".gpu/p4"] after the calls
# carrying .gpu/p1 ... .gpu/p3 (README.md); on a machine with the kit installed, [".gpu/sh"] only.
#   bash benchmarks/gpu/device/call_18_a.sh
# The streamed optimizer offload against megatron-core's real DistributedOptimizer (GPU test), the 4b
# on one H100 with training.offloadOptimizer (MFU, 3 runs), the 1b at one and two sequences per
# micro-batch (MFU, 3 runs, host CPU recorded).
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-480}  # setup.sh's unpack (about a minute) came before this budget
source .gpu/sh/lib.sh
export STEP_LOGS=j FAIL_TAIL=25
step kit 60 python3 benchmarks/gpu/device/kit_check.py
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc; uptime
step offload-test 150 python3 -m pytest tests/gpu/test_optimizer_offload_gpu.py -q -s -p no:cacheprovider --timeout 140
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope --runs 3"
step mfu-4b-offload 220 $MFU --models 4b --offload-optimizer --micro-batches 8 --steps 2 --warmup 1 --json $J/mfu-4b-offload.json
step mfu-1b 110 $MFU --models 1b --micro-batches 8 --steps 3 --warmup 2 --json $J/mfu-1b.json
step mfu-1b-b2 110 $MFU --models 1b --micro-batches 4 --micro-batch-size 2 --steps 3 --warmup 2 --json $J/mfu-1b-b2.json
pack
summary
grep -h "^{" $J/logs/mfu-*.log 2>/dev/null | cut -c1-600
