# same machine, next call within 30 s, carry .gpu/sh (the kit is installed): the 4b weight sync over NCCL
# (cuda:0 -> cuda:1) and over IPC on one H200, each at 1 GiB and 2 GiB buckets.
[ -f /tmp/site/.c1 ] || { echo "NO C1: the machine was recycled; start with call_2gpu_a.sh"; exit 3; }
export CALL_BUDGET=${CALL_BUDGET:-300}
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
for mb in 1024 2048; do
  SYNC_TAG=$mb SYNC_ARGS="--bucket-mb $mb" sync_models nccl 4b
  SYNC_TAG=$mb SYNC_ARGS="--bucket-mb $mb" sync_models ipc 4b
done
