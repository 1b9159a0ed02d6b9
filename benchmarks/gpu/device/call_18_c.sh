# nvidia-h100-x1, session 14 (#18), a second H100 machine: the 4th call (carry [".gpu/sh", ".gpu/p4"] after the
# calls carrying .gpu/p1 ... .gpu/p3), or [".gpu/sh"] on a machine with the kit.
#   bash benchmarks/gpu/device/call_18_c.sh
# After call_18_b.sh's first run (the final checkpoint of the colocated 4B took 105 GB of host memory and
# Ray's OOM killer stopped it; the streamed step let freed chunks pile up): the optimizer-offload GPU test
# (now with the step's peak bounded), the colocated 4B GRPO run again to its end (3 steps and the
# final save), and the 1b at two sequences per micro-batch on this host (the MFU figure's second host).
source .gpu/sh/setup.sh || exit 1
export CALL_BUDGET=${CALL_BUDGET:-540}
source .gpu/sh/lib.sh
export STEP_LOGS=j FAIL_TAIL=30
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc; uptime
step offload-test 60 python3 -m pytest tests/gpu/test_optimizer_offload_gpu.py -q -s -p no:cacheprovider --timeout 55
C="python3 benchmarks/gpu/colocated_step.py --model 4b --backend megatron --mem-fraction 0.6 --steps 3 --model-root /tmp/rljob-models"
step colocated-4b 380 $C --offload-optimizer --json $J/colocated-4b-offload.json
free -g | head -2
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step mfu-1b-b2 70 python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope --runs 3 --models 1b --micro-batches 4 --micro-batch-size 2 --steps 3 --warmup 2 --json $J/mfu-1b-b2.json
pack
summary
grep -h "estimated GPU memory\|the step's peak\|resident .* GB, state" $J/logs/*.log | cut -c1-400 | head -6
