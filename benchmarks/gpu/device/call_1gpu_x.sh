# nvidia-h100-x1 (fresh machine), carry .gpu/c1 .gpu/sh: installs c1; the fusions' GPU test; the 4b
# with bf16 grads (fused Adam; full recompute only if that ran out of memory); the 1b at 16 micro-batches.
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
step fusions 100 python3 -m pytest tests/gpu/test_megatron_fusions_gpu.py -q -p no:cacheprovider
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --fusions wgrad,norm,rope"
step mfu 100 $MFU --models 4b --micro-batches 8 --steps 3 --warmup 1 --grad-dtype bf16 --json $J/mfu-4b-bf16g.json
if grep -q '"error"' $J/mfu-4b-bf16g.json 2>/dev/null || [ ! -f $J/mfu-4b-bf16g.json ]; then
  step mfu 100 $MFU --models 4b --micro-batches 8 --steps 3 --warmup 1 --grad-dtype bf16 --recompute full --json $J/mfu-4b-bf16g-full.json
fi
step mfu 100 $MFU --models 1b --micro-batches 16 --json $J/mfu-1b-fused-mb16.json
tail -2 $OUT/fusions.log; grep -E "^\| (1b|4b)|rc=" $OUT/mfu.log
