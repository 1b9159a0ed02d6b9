# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: more 1b MFU runs (bf16 grads,
# unfused SwiGLU for comparison). The 4b does not fit one 80 GB H100 for full-parameter Adam (16 bytes
# a parameter before activations; megatron-core's CPU optimizer offload needs TransformerEngine), so
# it runs on one H200 in call_2gpu_b.sh, with a 78 GiB cap to show that.
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 1b --micro-batches 8"
step mfu 150 $MFU --grad-dtype bf16 --profile --json $J/mfu-1b-bf16grad.json
step mfu 150 $MFU --swiglu unfused --json $J/mfu-1b-unfused.json
grep -E "^\| 1b|rc=|category|idle" $OUT/mfu.log
