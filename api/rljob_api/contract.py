"""The operator <-> runtime contract: names both sides must agree on, in one place.

The operator's RayJob runs ENTRYPOINT with the resolved job (spec + identity) as JSON in the
environment variable JOB_ENV, so no volume is needed and a running step uses a snapshot. The
runtime reports progress by server-side apply of status.progress under RUNTIME_FIELD_MANAGER.
Placement groups find their pods through the custom Ray resources each worker group advertises.
"""

from __future__ import annotations

import json
from typing import Any

# Where the runtime finds the model cache and the hub token (the operator mounts them there).
from .pod_paths import HF_HOME as HF_HOME
from .pod_paths import HF_TOKEN_PATH as HF_TOKEN_PATH
from .pod_paths import MODEL_CACHE_PATH as MODEL_CACHE_PATH
from .pod_paths import RLJOB_CACHE as RLJOB_CACHE
from .resource import API_VERSION, KIND
from .spec import RLTrainingJobSpec

JOB_ENV = "RLJOB_JOB"
ENTRYPOINT = f"rljob-runtime train --config env:{JOB_ENV}"
# Set ("1") on the training RayJob when the operator's MegatronCheckpoint conversion job put
# model.path's Megatron checkpoint in the model cache: the runtime starts from it.
MEGATRON_CACHE_ENV = "RLJOB_MEGATRON_CACHE"
OPERATOR_FIELD_MANAGER = "rljob-operator"
RUNTIME_FIELD_MANAGER = "rljob-runtime"
# status.progress.message (work before the first step, e.g. a model download) has a manager of
# its own, so that posting it never removes the step fields of a resumed run, and clearing it
# at the first step leaves them alone.
RUNTIME_MESSAGE_FIELD_MANAGER = "rljob-runtime-message"

# Custom Ray resources advertised by worker groups (one unit per GPU, or per CPU slot). KubeRay reads
# a group resource whose name ends with "gpu" as Ray's num-gpus, not as a custom resource: no name
# here may end so (tests/unit/test_operator_build.py).
RAY_RESOURCE_COLOCATED = "rljob_colocated"  # group "gpu": trainer and engines share these bundles
RAY_RESOURCE_TRAINER = "rljob_trainer"  # group "trainer" (disaggregated)
RAY_RESOURCE_ROLLOUT = "rljob_rollout"  # group "rollout" (disaggregated)


def resolved_job(
    spec: RLTrainingJobSpec, *, name: str, namespace: str, uid: str, generation: int
) -> dict[str, Any]:
    """The document the runtime receives: an RLTrainingJob with identity and the full defaulted spec."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": generation},
        "spec": spec.to_document(),
    }


def resolved_job_json(
    spec: RLTrainingJobSpec, *, name: str, namespace: str, uid: str, generation: int
) -> str:
    return json.dumps(
        resolved_job(spec, name=name, namespace=namespace, uid=uid, generation=generation),
        separators=(",", ":"),
        sort_keys=True,
    )
