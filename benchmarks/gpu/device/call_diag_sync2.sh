# nvidia-h200-x2, carry .gpu/c1 .gpu/sh: the 4b sync over NCCL (cuda:0 -> cuda:1) and over IPC, after
# session 5's changes (batched copies, cached engine weights, stream-ordered NCCL receive).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
SYNC_TAG=s5 sync_models nccl 4b
SYNC_TAG=s5 sync_models ipc 4b
SYNC_TAG=s5-2g SYNC_ARGS="--bucket-mb 2048" sync_models nccl 4b
SYNC_TAG=s5-2g SYNC_ARGS="--bucket-mb 2048" sync_models ipc 4b
grep -E "sync [0-9]|GB/s vs|rc=" $OUT/sync.log | tail -40
