# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: MFU with the plain-torch fusions
# (wgrad, norm, rope; fused Adam is the default): 1b with a profile, then the 4b on the 80 GB H100
# (without recompute first; full recompute only if that ran out of memory).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --micro-batches 8 --fusions wgrad,norm,rope"
step mfu 170 $MFU --models 1b --profile --json $J/mfu-1b-fused.json
step mfu 170 $MFU --models 4b --steps 3 --warmup 1 --json $J/mfu-4b-fused.json
if grep -q '"error"' $J/mfu-4b-fused.json 2>/dev/null || [ ! -f $J/mfu-4b-fused.json ]; then
  step mfu 170 $MFU --models 4b --steps 3 --warmup 1 --recompute full --json $J/mfu-4b-fused-full.json
fi
grep -E "^\| (1b|4b)|rc=|category|idle|error" $OUT/mfu.log
