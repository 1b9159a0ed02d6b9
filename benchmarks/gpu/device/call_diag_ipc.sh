# nvidia-h100-x1, carry .gpu/c1 .gpu/sh: the 4b IPC sync alone, for the hf server's per-phase timings.
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
SYNC_TAG=diag sync_models ipc 4b
grep -E "sync [0-9]|rc=" $OUT/sync.log | tail -12
