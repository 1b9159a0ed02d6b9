# nvidia-h100-x1, carry .gpu/c1 .gpu/sh: the 1b with the fusions at 8 and then 16 micro-batches on one
# machine (a 16-micro-batch run on another H100 had come out 30 % slower per micro-batch).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope --models 1b"
step mfu 70 $MFU --micro-batches 8 --json $J/mfu-1b-fused-mb8-again.json
step mfu 70 $MFU --micro-batches 16 --json $J/mfu-1b-fused-mb16-again.json
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,temperature.gpu --format=csv
grep -E "^\| 1b|rc=" $OUT/mfu.log
