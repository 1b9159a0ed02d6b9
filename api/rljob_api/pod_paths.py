"""Paths and volume names the operator puts in every job pod (user volumes may not reuse them)."""

from __future__ import annotations

SHM_PATH = "/dev/shm"
# The model cache: resources.modelCache (a PVC shared by jobs) or a per-pod emptyDir. Hub
# downloads go to its huggingface/ directory (HF_HOME), models the runtime converts to rljob/.
MODEL_CACHE_PATH = "/var/cache/rljob"
HF_HOME = f"{MODEL_CACHE_PATH}/huggingface"
RLJOB_CACHE = f"{MODEL_CACHE_PATH}/rljob"
# resources.secrets.huggingFaceToken, mounted as a file (huggingface_hub reads HF_TOKEN_PATH).
HF_TOKEN_DIR = "/var/run/secrets/rljob/huggingface"
HF_TOKEN_PATH = f"{HF_TOKEN_DIR}/token"
RESERVED_MOUNT_PATHS = (SHM_PATH, MODEL_CACHE_PATH, HF_TOKEN_DIR)
# On a read-only root filesystem (resources.securityContext.readOnlyRootFilesystem) every container
# writes only to volumes: /tmp (Ray's session directory, torch's and Triton's temporary files) and
# HOME (~/.cache, ~/.ray, ~/.triton) are emptyDirs of their own. HOME is the runtime image's own home
# directory, set for any image. A user volume (or the checkpoint volume) mounted at exactly one of
# those paths takes its place; volumes below them are mounted inside.
TMP_PATH = "/tmp"
HOME_PATH = "/home/rljob"

# Volume names the operator uses: the checkpoint volume, /dev/shm, the model cache, the token.
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
MODEL_CACHE_VOLUME = "model-cache"
HF_TOKEN_VOLUME = "hf-token"
TMP_VOLUME = "rljob-tmp"
HOME_VOLUME = "rljob-home"
RESERVED_VOLUME_NAMES = (
    CHECKPOINT_VOLUME,
    SHM_VOLUME,
    MODEL_CACHE_VOLUME,
    HF_TOKEN_VOLUME,
    TMP_VOLUME,
    HOME_VOLUME,
)
