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

# Volume names the operator uses: the checkpoint volume, /dev/shm, the model cache, the token.
CHECKPOINT_VOLUME = "checkpoints"
SHM_VOLUME = "dshm"
MODEL_CACHE_VOLUME = "model-cache"
HF_TOKEN_VOLUME = "hf-token"
RESERVED_VOLUME_NAMES = (CHECKPOINT_VOLUME, SHM_VOLUME, MODEL_CACHE_VOLUME, HF_TOKEN_VOLUME)
