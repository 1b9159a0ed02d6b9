# same machine, next call within 30 s, carry .gpu/sh (the kit is installed): MFU of the 1b with the plain-torch
# fusions (wgrad, norm, rope; fused Adam is the default), with a profile, then at 16 micro-batches;
# the host's CPU (the fused step is host-bound: docs/BENCHMARKS.md, session 5). The 4b does not fit
# an 80 GB H100 with full Adam: it runs on an H200 (call_2gpu_a.sh).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 1b --fusions wgrad,norm,rope"
step mfu 80 $MFU --micro-batches 8 --profile --json $J/mfu-1b-fused.json
step mfu 80 $MFU --micro-batches 16 --json $J/mfu-1b-fused-mb16.json
grep -E "^\| 1b|rc=|category|idle|error" $OUT/mfu.log
