"""Checkpoint conversion jobs (pure): which conversions a job needs now, the command each runs, and
their state as status.conversions keeps it.

Two kinds, each a RayJob of its own (one pod like the head, the job's volumes; `build.py`):
- MegatronCheckpoint, before training: for the megatron backend with resources.modelCache and no
  model.megatronCheckpoint, model.path becomes a Megatron distributed checkpoint in the model cache,
  once per model revision (`rljob-runtime convert megatron-cache`: a later job of the same model
  finds it and converts nothing). The training RayJob is created when it has succeeded, and tells
  the runtime to start from it (MEGATRON_CACHE_ENV).
- Export: a saved iteration to a Hugging Face directory, <export root>/iter_<step>
  (`rljob-runtime convert export`): the final one once training has succeeded
  (checkpoint.export.huggingFace; the job is Converting until it is written), and each of
  checkpoint.export.steps as soon as the run has saved it.

A conversion's outcome is kept in status.conversions, so a finished one is never run again, even
after its RayJob is gone. A failed one is run again when its RayJob is deleted (what its message
tells a person to do once the cause is fixed).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rljob_api.spec_ops import export_root
from rljob_api.status import CONVERSIONS_MAX

from .job import Job
from .names import RAYJOB_NAME_MAX
from .restarts import failed, failure_of, one_line

MEGATRON = "MegatronCheckpoint"
EXPORT = "Export"
RUNNING, SUCCEEDED, FAILED = "Running", "Succeeded", "Failed"
CONVERT_COMMAND = "rljob-runtime convert"
MEGATRON_CACHE_DIR = "megatron"  # below the model cache's rljob/ directory (the runtime's cache_root())
# The phase's reasons around conversions (Ready's reason while Converting).
CONVERTING, CONVERSION_FAILED = "ConvertingCheckpoint", "ConversionFailed"
EXPORTING, EXPORT_FAILED = "Exporting", "ExportFailed"


@dataclass(frozen=True)
class Wanted:
    """A conversion the job needs."""

    name: str  # its RayJob
    kind: str  # MEGATRON or EXPORT
    step: int | None  # EXPORT: the iteration
    path: str  # what it writes
    command: str  # the entrypoint


def child_name(job: str, suffix: str) -> str:
    """`<job>-<suffix>`, within KubeRay's RayJob name limit: a long job name is cut and a hash of
    it keeps the names of two such jobs apart."""
    name = f"{job}-{suffix}"
    if len(name) <= RAYJOB_NAME_MAX:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:5]
    keep = RAYJOB_NAME_MAX - len(suffix) - len(digest) - 2
    return f"{job[:keep].rstrip('-')}-{digest}-{suffix}"


def needs_megatron_checkpoint(job: Job) -> bool:
    """Whether training waits for a MegatronCheckpoint conversion: megatron backend, a shared model
    cache to keep it in (without one the trainer reads model.path's weights itself), and no
    checkpoint of the user's own."""
    spec = job.spec
    return (
        spec.training.backend == "megatron"
        and spec.resources.model_cache is not None
        and spec.model.megatron_checkpoint is None
    )


def megatron_conversion(job: Job, cache_root: str) -> Wanted:
    spec = job.spec
    par = spec.training.parallelism
    args = [
        "megatron-cache",
        "--model",
        str(spec.model.path),
        "--tp",
        str(par.tensor),
        "--pp",
        str(par.pipeline),
    ]
    return Wanted(
        child_name(job.name, "convert"),
        MEGATRON,
        None,
        f"{cache_root}/{MEGATRON_CACHE_DIR}",
        _command(args),
    )


def export_conversion(job: Job, step: int) -> Wanted:
    spec = job.spec
    out = f"{export_root(spec.checkpoint).rstrip('/')}/iter_{step:07d}"
    args = [
        "export",
        "--checkpoints",
        str(spec.checkpoint.path),
        "--step",
        str(step),
        "--out",
        out,
        "--model",
        str(spec.model.path),
    ]
    return Wanted(child_name(job.name, f"export-{step}"), EXPORT, step, out, _command(args))


def _command(args: list[str]) -> str:
    return f"{CONVERT_COMMAND} {shlex.join(args)}"


def training_succeeded(job: Job, rayjob: Mapping[str, Any] | None) -> bool:
    """The training RayJob succeeded: now, or before (the job is Converting its final export; its
    RayJob may be gone since, by ttlSecondsAfterFinished)."""
    if rayjob is not None:
        status = rayjob.get("status") or {}
        if status.get("jobDeploymentStatus") == "Complete" and status.get("jobStatus") == "SUCCEEDED":
            return True
    return exporting(job.status)


def exporting(status: Mapping[str, Any]) -> bool:
    """Whether the job's last status says training finished and the final export is not done."""
    if status.get("phase") != "Converting":
        return False
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return ready.get("reason") in (EXPORTING, EXPORT_FAILED)


def export_steps(job: Job, succeeded: bool) -> list[int]:
    """The iterations to export now: checkpoint.export.steps the run has saved (all of them once it
    finished), and the final one once training succeeded when huggingFace is on."""
    export = job.spec.checkpoint.export
    finished = succeeded or job.status.get("phase") in ("Succeeded", "Failed")
    saved = int(((job.status.get("progress") or {}).get("lastCheckpointStep")) or 0)
    steps = {step for step in export.steps if finished or step <= saved}
    if export.hugging_face and succeeded:
        steps.add(job.spec.training.num_rollout)
    return sorted(steps)


def final_export(job: Job) -> Wanted | None:
    """The export the job's success waits for, if any."""
    if not job.spec.checkpoint.export.hugging_face:
        return None
    return export_conversion(job, job.spec.training.num_rollout)


# ------------------------------------------------------------------------------ status entries


def entries(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """status.conversions by RayJob name."""
    return {e["rayJob"]: dict(e) for e in status.get("conversions") or [] if e.get("rayJob")}


def state_of(rayjob: Mapping[str, Any]) -> tuple[str, str]:
    """(Running | Succeeded | Failed, the last line it printed when it failed)."""
    status = rayjob.get("status") or {}
    if status.get("jobDeploymentStatus") == "Complete" and status.get("jobStatus") == "SUCCEEDED":
        return SUCCEEDED, ""
    failure = failure_of(rayjob)
    if failure is not None or failed(rayjob):
        return FAILED, failure.line if failure is not None else "the Ray job failed"
    return RUNNING, ""


def conversion_entries(
    status: Mapping[str, Any],
    wanted: list[Wanted],
    seen: Mapping[str, Mapping[str, Any] | None],
) -> list[dict[str, Any]]:
    """status.conversions after a pass: each earlier entry kept (a finished one as it was, unless its
    RayJob was deleted after a failure: it runs again), each wanted conversion the pass saw a RayJob
    of added or updated. `seen`: the RayJobs this pass looked up, by name (None: not there)."""
    out = entries(status)
    for want in wanted:
        if want.name not in seen:
            continue  # not looked up: a finished entry stays as it is
        rayjob = seen[want.name]
        if rayjob is None:
            out.pop(want.name, None)  # deleted after a failure, or not created yet
            continue
        state, message = state_of(rayjob)
        entry: dict[str, Any] = {"rayJob": want.name, "kind": want.kind, "path": want.path, "state": state}
        if want.step is not None:
            entry["step"] = want.step
        entry["message"] = one_line(message)  # always: the API server defaults it to ""
        out[want.name] = entry
    return list(out.values())[-CONVERSIONS_MAX:]


def entry_of(status_entries: list[dict[str, Any]], wanted: Wanted | None) -> dict[str, Any] | None:
    if wanted is None:
        return None
    return next((e for e in status_entries if e.get("rayJob") == wanted.name), None)


def failed_message(entry: Mapping[str, Any], what: str) -> str:
    return (
        f"{what} failed: {entry.get('message') or 'no message'}. Fix the cause, then delete RayJob "
        f"{entry['rayJob']} to run it again (`kubectl describe rayjob {entry['rayJob']}` shows its last lines)."
    )


def events(before: Mapping[str, Any], after: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(type, reason, message) for each conversion that started, succeeded or failed since `before`
    (the job's earlier status)."""
    old = entries(before)
    out = []
    for entry in after:
        state = entry["state"]
        if (old.get(entry["rayJob"]) or {}).get("state") == state:
            continue
        what = f"iter_{entry['step']:07d} export" if entry.get("step") is not None else "Megatron checkpoint"
        if state == RUNNING:
            out.append(
                ("Normal", "ConversionStarted", f"{what}: RayJob {entry['rayJob']} writes {entry['path']}")
            )
        elif state == SUCCEEDED:
            out.append(("Normal", "ConversionSucceeded", f"{what} done: {entry['path']}"))
        else:
            message = failed_message(entry, what)
            out.append(
                ("Warning", CONVERSION_FAILED if entry["kind"] == MEGATRON else EXPORT_FAILED, message)
            )
    return out
