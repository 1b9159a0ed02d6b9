"""Conversion jobs on the real API server, the real KubeRay and the local Ray: the operator's
conversion RayJobs run `rljob-runtime convert` for real there.

- A megatron job with a model cache: the operator converts model.path to a Megatron distributed
  checkpoint in the cache (phase Converting, status.conversions, children.conversionJobs) before it
  creates the training RayJob; the checkpoint's tensors equal the source's. A second job of the same
  model converts nothing (the cache's files are untouched).
- A job with checkpoint.export.huggingFace: after training, the operator exports the final
  checkpoint; transformers loads the export and its tensors equal the checkpoint's.

Stand-ins, named: kwok pods run no containers, so the local Ray runs the entrypoints, with the pods'
model cache path given through the rljob.dev/entrypoint-env annotation; the megatron job's training
(megatron needs GPUs) is replaced, through rljob.dev/entrypoint, by `rljob-runtime convert verify`
of the converted checkpoint, which the training would load. Claims are bound to PersistentVolumes so
the pods get scheduled; the local Ray reads and writes the same paths directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_process import OperatorProcess
from test_operator import H100, condition, in_phase, status, tiny_training_job, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def operator(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"), resync_seconds=5)
    proc.start()
    yield proc
    proc.stop()


def _bound_claim(crd: Any, namespace: str, name: str, path: Path) -> None:
    """A PersistentVolumeClaim bound to a hostPath PersistentVolume of its own (no provisioner here)."""
    volume = f"{namespace}-{name}"
    crd.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(path)},
                "claimRef": {"namespace": namespace, "name": name},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def converted(cache: Path, model: Path) -> Path:
    """Where the conversion job puts `model`'s Megatron checkpoint in the model cache `cache`."""
    from rljob_runtime.models.megatron_cache import CACHE_DIR, source_key

    return cache / CACHE_DIR / source_key(model)


def _megatron_job(tmp_path: Path, name: str, namespace: str, model: Path, cache: Path) -> dict[str, Any]:
    doc = tiny_training_job(tmp_path / name, name, namespace, num_rollout=1)
    spec = doc["spec"]
    spec["model"]["path"] = str(model)
    spec["training"]["backend"] = "megatron"
    spec["resources"] = {
        **H100,
        "device": "cuda",
        "trainer": {"nodes": 1, "gpusPerNode": 1, "cpu": "1", "memory": "2Gi"},
        "modelCache": {"claimName": "model-cache"},
    }
    doc["metadata"]["annotations"] = {
        "rljob.dev/entrypoint-env": f"RLJOB_CACHE={cache}",
        # The training would load this checkpoint; here it is checked against the model instead.
        "rljob.dev/entrypoint": f"rljob-runtime convert verify --checkpoint {converted(cache, model)} --model {model}",
    }
    return doc


def _finished(crd: Any, namespace: str, name: str, operator: OperatorProcess) -> dict[str, Any]:
    st = wait_for(
        f"{name} to finish", in_phase(crd, namespace, name, "Succeeded", "Failed"), operator, timeout=420
    )
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    return st


def _phases(crd: Any, namespace: str, name: str) -> list[str]:
    """The phase changes the operator announced (its events), in order."""
    events = crd.list("events", namespace, "")
    mine = [e for e in events if e["involvedObject"].get("name") == name and "->" in (e.get("message") or "")]
    mine.sort(key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
    return [e["message"].split(":")[0] for e in mine]


def test_a_megatron_job_converts_its_model_once_per_revision(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    from rljob_runtime.models.tiny_model import make_tiny_model
    from rljob_runtime.trainer.megatron.checkpoint_convert import verify

    model = make_tiny_model(tmp_path / "tiny", arch="llama", seed=0)
    cache = tmp_path / "model-cache"
    _bound_claim(crd, namespace, "model-cache", cache)
    crd.apply(_megatron_job(tmp_path, "convert-first", namespace, model, cache))
    first = _finished(crd, namespace, "convert-first", operator)
    (entry,) = first["conversions"]
    assert entry["kind"] == "MegatronCheckpoint" and entry["state"] == "Succeeded", entry
    assert first["children"]["conversionJobs"] == [entry["rayJob"]] == ["convert-first-convert"]
    assert "Pending -> Converting" in _phases(crd, namespace, "convert-first")
    # The training RayJob was created once the conversion had finished.
    conversion = crd.get("rayjob", "convert-first-convert", namespace)
    training = crd.get("rayjob", "convert-first", namespace)
    assert conversion["status"]["endTime"] <= training["metadata"]["creationTimestamp"]
    assert "RLJOB_MEGATRON_CACHE: '1'" in training["spec"]["runtimeEnvYAML"]
    made = converted(cache, model)
    comparison = verify(made, model)
    assert comparison.ok and comparison.max_abs_diff, comparison.summary()
    stamps = {p: p.stat().st_mtime_ns for p in made.rglob("*")}

    crd.apply(_megatron_job(tmp_path, "convert-again", namespace, model, cache))
    again = _finished(crd, namespace, "convert-again", operator)
    assert again["conversions"][0]["state"] == "Succeeded"
    assert {p: p.stat().st_mtime_ns for p in made.rglob("*")} == stamps  # nothing converted again
    assert sorted(p.name for p in (cache / "megatron").iterdir() if not p.name.startswith(".")) == [made.name]


def test_a_finished_job_exports_its_final_checkpoint(
    crd: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    doc = tiny_training_job(tmp_path, "export-final", namespace, num_rollout=2)
    checkpoints = Path(doc["spec"]["checkpoint"]["path"])
    _bound_claim(crd, namespace, "checkpoints", checkpoints)
    doc["spec"]["checkpoint"]["volume"] = {"claimName": "checkpoints"}
    doc["spec"]["checkpoint"]["export"] = {"huggingFace": True}
    crd.apply(doc)
    st = _finished(crd, namespace, "export-final", operator)
    out = checkpoints / "hf" / "iter_0000002"
    assert condition(st, "Ready")["message"].endswith(f"; exported to {out}")
    assert st["conversions"] == [
        {
            "rayJob": "export-final-export-2",
            "kind": "Export",
            "path": str(out),
            "state": "Succeeded",
            "step": 2,
            "message": "",
        }
    ]
    phases = _phases(crd, namespace, "export-final")
    assert phases[-2:] == ["Running -> Converting", "Converting -> Succeeded"], phases
    exported = AutoModelForCausalLM.from_pretrained(out)
    source = load_file(str(checkpoints / "iter_0000002" / "model" / "model.safetensors"))
    state = exported.state_dict()
    for name, tensor in source.items():
        assert state[name].equal(tensor), name
    # What the operator writes is what the API server keeps: later passes (resync every 5 s) patch nothing.
    version = crd.get("rljob", "export-final", namespace)["metadata"]["resourceVersion"]
    time.sleep(12)
    assert crd.get("rljob", "export-final", namespace)["metadata"]["resourceVersion"] == version
    assert status(crd, namespace, "export-final")["phase"] == "Succeeded"
