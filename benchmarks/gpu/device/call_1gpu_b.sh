# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: the 4b MFU runs. 4B on an 80 GB GPU:
# bf16 params 8 GB + fp32 grads 16 + fp32 main params 16 + Adam 32 do not fit with activations, so
# half the Adam state on the CPU (megatron-core's HybridDeviceOptimizer), then all of it with bf16
# grads and no recompute; 8 micro-batches a step (the CPU optimizer step amortised as in training).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 4b --ce-fusion --micro-batches 8 --steps 3 --warmup 1"
step mfu 200 $MFU --recompute full --optimizer-offload 0.5 --profile --json $J/mfu-4b-full-off05.json
step mfu 200 $MFU --recompute none --optimizer-offload 1.0 --grad-dtype bf16 --json $J/mfu-4b-none-off1.json
step mfu 150 $MFU --recompute full --optimizer-offload 0.5 --offload-overlap --json $J/mfu-4b-full-off05-ov.json
grep -E "^\| 4b|rc=|category|idle" $OUT/mfu.log
