# nvidia-h100-x1, the call that carries the kit's last part (carry .gpu/sh .gpu/pN, after calls that
# carried .gpu/p1 ... .gpu/pN-1 with `source .gpu/sh/setup.sh`; README.md): installs the kit; the fusions' GPU test; the full-path
# weight sync over CUDA IPC (0.5B/1.5B/4B, one process each, runtime defaults); MFU 1b unfused.
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
step fusions 150 python3 -m pytest tests/gpu/test_megatron_fusions_gpu.py -q -s -p no:cacheprovider
sync_models ipc 0.5b 1.5b 4b  # before the allocator setting below: the sync figures are without it
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step mfu 150 python3 benchmarks/gpu/megatron_mfu.py --models 1b --micro-batches 8 --json $J/mfu-1b-mb8.json
tail -3 $OUT/fusions.log; grep -E "^\| 1b|rc=" $OUT/mfu.log
