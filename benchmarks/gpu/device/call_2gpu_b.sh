# same machine, next call within 30 s, carry .gpu/smol-a .gpu/sh: MFU of the 4b on one H200, capped
# at an H100's 78 GiB and uncapped; the megatron group through Ray on two GPUs (TP 2); the trainer
# rank at TP1/TP2/PP2 against the torch backend.
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_2gpu_a.sh"; exit 3; }
export CALL_BUDGET=${CALL_BUDGET:-400}
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 4b --micro-batches 8 --steps 3 --warmup 1"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step mfu 120 $MFU --grad-dtype bf16 --recompute full --memory-limit-gib 78 --profile --json $J/mfu-4b-h100cap.json
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step mfu 100 $MFU --json $J/mfu-4b-h200.json
grep -E "^\| 4b|rc=|category" $OUT/mfu.log
step group 150 python3 -m pytest tests/gpu/test_megatron_group.py -q -s -p no:cacheprovider
step backend 120 python3 -m pytest tests/gpu/test_megatron_backend.py -q -s -p no:cacheprovider
grep -v -i warn $OUT/group.log | tail -12; grep -E "passed|failed|rc=" $OUT/backend.log
