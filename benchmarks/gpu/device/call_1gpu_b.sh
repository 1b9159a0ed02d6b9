# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: the 4b MFU runs (80 GB: see the
# benchmark's docstring for what makes it fit).
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_1gpu_a.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 4b --ce-fusion"
step mfu 170 $MFU --grad-dtype bf16 --recompute full --profile --json $J/mfu-4b-full.json
step mfu 170 $MFU --grad-dtype bf16 --recompute selective --json $J/mfu-4b-sel.json
step mfu 170 $MFU --grad-dtype bf16 --json $J/mfu-4b-none.json
grep -E "^\| 4b|rc=|category|idle" $OUT/mfu.log
