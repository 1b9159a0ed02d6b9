# nvidia-h100-x1, first call, carry .gpu/c1 .gpu/sh: installs c1, then the full-path weight sync
# benchmark over CUDA IPC (engine and producer on the one GPU) and the 1b MFU runs.
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
sync_models ipc 0.5b 1.5b 4b  # before the allocator setting below: the sync figures are without it
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MFU="python3 benchmarks/gpu/megatron_mfu.py --models 1b"
step mfu 150 $MFU --profile --json $J/mfu-1b-fused.json
step mfu 120 $MFU --ce-fusion --profile --json $J/mfu-1b-ce.json
step mfu 120 $MFU --ce-fusion --micro-batches 8 --json $J/mfu-1b-ce-mb8.json
grep -E "^\| 1b|rc=|category|idle" $OUT/mfu.log
