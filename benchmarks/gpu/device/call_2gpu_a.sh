# nvidia-h200-x2, first call, carry .gpu/c1 .gpu/sh: installs c1, then the full-path weight sync
# benchmark over NCCL (producer cuda:0, engine cuda:1).
source .gpu/sh/setup.sh || exit 1
source .gpu/sh/lib.sh
sync_models nccl 0.5b 1.5b 4b
