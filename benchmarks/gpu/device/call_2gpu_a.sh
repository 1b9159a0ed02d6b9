# nvidia-h200-x2, first call, carry .gpu/c1 .gpu/sh: installs c1, then the full-path weight sync
# benchmark over NCCL (producer cuda:0, engine cuda:1), then CUDA IPC (both on cuda:0), and IPC once
# more for the 4b with the training allocator setting (expandable segments) the producer must undo.
export CALL_BUDGET=${CALL_BUDGET:-420}
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
sync_models nccl 0.5b 1.5b 4b
sync_models ipc 0.5b 1.5b 4b
SYNC_TAG=expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True sync_models ipc 4b
