# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: MFU 1B and 4B (each its own process;
# fused SwiGLU is torch.compile'd: if it fails there, the unfused run follows), then TP2 through Ray.
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_sync.sh"; exit 3; }
source .gpu/sh/setup.sh || exit 1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for m in 1b 4b; do
  timeout 150 python3 benchmarks/gpu/megatron_mfu.py --models $m --json $OUT/mfu_$m.json > $OUT/mfu_$m.log 2>&1 \
    || timeout 150 python3 benchmarks/gpu/megatron_mfu.py --models $m --swiglu unfused --json $OUT/mfu_$m.json >> $OUT/mfu_$m.log 2>&1
  grep -v -i warn $OUT/mfu_$m.log | tail -4
done
timeout 180 python3 -m pytest tests/gpu/test_megatron_group.py -q -s -p no:cacheprovider > $OUT/group.log 2>&1
echo "group rc=$?" >> $OUT/group.log; grep -v Warning $OUT/group.log | tail -8
