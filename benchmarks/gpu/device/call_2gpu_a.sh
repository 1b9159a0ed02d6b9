# nvidia-h200-x2, the call that carries the kit's last part (carry .gpu/sh .gpu/pN, after the calls
# carrying .gpu/p1 ... .gpu/pN-1; README.md): installs the kit; the fusions' GPU test; MFU with the
# fusions on one H200 (1b, 4b: the 4b does not fit an 80 GB H100 with full Adam); the megatron trainer
# rank (TP1xDP2/TP2/PP2, fused Adam) and the TP 2 group through Ray with a checkpoint round trip; the
# NCCL weight sync at 0.5B and 1.5B (the 4B ran in call_diag_sync2.sh).
export CALL_BUDGET=${CALL_BUDGET:-480}
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
step fusions 80 python3 -m pytest tests/gpu/test_megatron_fusions_gpu.py -q -p no:cacheprovider
MFU="python3 benchmarks/gpu/megatron_mfu.py --micro-batches 8 --fusions wgrad,norm,rope"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step mfu 70 $MFU --models 1b --json $J/mfu-1b-fused-h200.json
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step mfu 90 $MFU --models 4b --steps 3 --warmup 1 --json $J/mfu-4b-fused-h200.json
step backend 100 python3 -m pytest tests/gpu/test_megatron_backend.py -q -s -p no:cacheprovider
step group 130 python3 -m pytest tests/gpu/test_megatron_group.py -q -s -p no:cacheprovider
SYNC_TAG=s5 sync_models nccl 0.5b 1.5b
tail -2 $OUT/fusions.log; grep -E "^\| (1b|4b)|rc=" $OUT/mfu.log; grep -E "passed|failed|rc=" $OUT/backend.log $OUT/group.log
