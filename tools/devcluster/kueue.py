"""Kueue's manager (sigs.k8s.io/kueue, built from the Go module proxy), run out of cluster like KubeRay.

Opt-in: `devcluster.py up --kueue`, or `devcluster.py kueue` on a running cluster (the Kueue e2e
test does that); `devcluster.py kueue --stop` stops it. Nothing else builds or starts it.

Kueue runs with `manageJobsWithoutQueueName: true` and the RayJob integration, but only for the
namespaces labelled MANAGED_LABEL: its `managedJobsNamespaceSelector` and the namespaceSelector of
its RayJob webhooks both select them, so on a shared cluster the other tests' RayJobs are never
suspended by Kueue, and nothing outside those namespaces is refused when Kueue is stopped.

Webhooks: the API server calls Kueue's webhook server at https://127.0.0.1:<port> (the
Mutating/ValidatingWebhookConfigurations of Kueue's module, config/components/webhook, with a URL in
place of the in-cluster Service) and trusts a self-signed certificate for IP 127.0.0.1 made here.
Kueue's internal certificate management is off (it would certify an in-cluster Service name), and
then Kueue v0.17 reads the certificate of its metrics server from the fixed directory
/etc/kueue/metrics/certs (cmd/kueue/main.go), where an installation mounts one: it is made there
when missing, which needs write access to /etc.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from build import ensure_one, gomod_versions, kueue_binary
from common import LOOPBACK, HarnessError, cache_root, log
from controlplane import install_crds
from procs import file_lock, free_ports, http_get, pid_alive, spawn, stop_pid, wait_for
from state import Ctx, save_state

NAMESPACE = "kueue-system"
MANAGED_LABEL = "devcluster.rljob.dev/kueue"  # value "managed": Kueue manages the namespace's RayJobs
MANAGED_VALUE = "managed"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # fixed in Kueue v0.17's cmd/kueue/main.go
WEBHOOK_NAMES = ("rljob-devcluster-kueue-mutating", "rljob-devcluster-kueue-validating")
# The webhooks registered: the RayJob integration's and those of Kueue's own kinds.
_KUEUE_GROUP = "kueue.x-k8s.io"


def _self_signed(directory: Path) -> None:
    """tls.crt / tls.key for IP 127.0.0.1 (and localhost), valid ten years."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
            "-subj",
            f"/CN={LOOPBACK}",
            "-addext",
            f"subjectAltName=IP:{LOOPBACK},DNS:localhost",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise HarnessError("kueue certificates", f"openssl failed: {proc.stderr.strip()}")


def ensure_metrics_cert() -> None:
    """A self-signed pair in METRICS_CERT_DIR unless one is there (shared by every cluster)."""
    with file_lock(cache_root() / "bin" / ".kueue-metrics-cert.lock"):
        if all((METRICS_CERT_DIR / f).exists() for f in ("tls.crt", "tls.key")):
            return
        try:
            METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=METRICS_CERT_DIR.parent))
        except PermissionError as exc:
            raise HarnessError(
                "kueue",
                f"cannot write {METRICS_CERT_DIR} ({exc}): with internalCertManagement off, Kueue v0.17 "
                "reads its metrics certificate there; make one there once as root (any self-signed "
                "tls.crt and tls.key)",
            ) from exc
        try:
            _self_signed(tmp)
            for name in ("tls.key", "tls.crt"):
                os.replace(tmp / name, METRICS_CERT_DIR / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def kueue_config(ctx: Ctx, webhook: int, metrics: int, health: int, cert_dir: Path) -> Path:
    conf = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{metrics}"},
        "webhook": {"host": LOOPBACK, "port": webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: MANAGED_VALUE}},
        "integrations": {"frameworks": ["ray.io/rayjob"]},
        # The visibility API server would bind a fixed port (8082) on every interface.
        "featureGates": {"VisibilityOnDemand": False},
    }
    path = ctx.dir / "kueue" / "config.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


def webhook_configurations(manifests: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, reduced to the RayJob integration and Kueue's own kinds,
    calling `url` + each webhook's path; the RayJob ones only in namespaces Kueue manages here."""
    out = []
    for doc, name in zip(yaml.safe_load_all(manifests.read_text()), WEBHOOK_NAMES, strict=True):
        hooks = []
        for hook in doc["webhooks"]:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            resources = {r for rule in hook.get("rules") or [] for r in rule.get("resources") or []}
            if _KUEUE_GROUP not in groups and "rayjobs" not in resources:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca_bundle}
            if "rayjobs" in resources:
                hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: MANAGED_VALUE}}
            hooks.append(hook)
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out


_PROBE = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
    "spec": {
        "entrypoint": "true",
        "shutdownAfterJobFinishes": True,
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray"}]}},
            }
        },
    },
}


def _webhook_answers(ctx: Ctx) -> bool:
    proc = ctx.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(_PROBE), check=False
    )
    return proc.returncode == 0 and bool(json.loads(proc.stdout)["spec"].get("suspend"))


def healthy(state: dict[str, Any]) -> bool:
    info = state.get("kueue") or {}
    return pid_alive(info.get("pid")) and http_get(f"{info.get('health')}/readyz")[0] == 200


def start_kueue(ctx: Ctx, state: dict[str, Any]) -> None:
    """Starts Kueue on this cluster (builds it on first use); reuses a healthy one."""
    if healthy(state):
        log(f"Kueue is already running (pid {state['kueue']['pid']})")
        return
    stop_kueue(ctx, state)  # a dead or unhealthy one: its webhooks would refuse every RayJob
    t0 = time.monotonic()
    binary = ensure_one(kueue_binary())
    version = gomod_versions()["kueue"]
    ensure_metrics_cert()
    ctx.kubectl("create", "namespace", NAMESPACE, check=False)
    install_crds(ctx, binary.parent / "crds")
    cert_dir = ctx.dir / "kueue" / "certs"
    _self_signed(cert_dir)
    webhook, metrics, health = free_ports(3)
    conf = kueue_config(ctx, webhook, metrics, health, cert_dir)
    logfile = ctx.logs / "kueue.log"
    proc = spawn([str(binary), f"--config={conf}"], logfile, ctx.env())
    state["kueue"] = {
        "pid": proc.pid,
        "version": version,
        "health": f"http://{LOOPBACK}:{health}",
        "webhook": f"https://{LOOPBACK}:{webhook}",
        "managed_namespace_label": f"{MANAGED_LABEL}={MANAGED_VALUE}",
        "log": str(logfile),
    }
    save_state(ctx, state)
    wait_for("kueue", lambda: http_get(f"http://{LOOPBACK}:{health}/readyz")[0] == 200, 120, logfile, proc)
    ca = base64.b64encode((cert_dir / "tls.crt").read_bytes()).decode()
    manifests = binary.parent / "webhook" / "manifests.yaml"
    for conf_obj in webhook_configurations(manifests, f"https://{LOOPBACK}:{webhook}", ca):
        ctx.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(conf_obj))
    # The API server picks webhook configurations up from a watch: wait until its calls reach Kueue
    # (a server-side dry run of a RayJob in a managed namespace comes back suspended).
    ctx.kubectl("label", "namespace", NAMESPACE, f"{MANAGED_LABEL}={MANAGED_VALUE}", "--overwrite")
    wait_for("kueue webhooks", lambda: _webhook_answers(ctx), 60, logfile, proc, interval=1.0)
    log(
        f"Kueue {version} running (pid {proc.pid}, webhooks at https://{LOOPBACK}:{webhook}; manages "
        f"namespaces labelled {MANAGED_LABEL}={MANAGED_VALUE}) in {time.monotonic() - t0:.0f} s"
    )


def stop_kueue(ctx: Ctx, state: dict[str, Any]) -> None:
    """Removes Kueue's webhook configurations (first: they would refuse RayJobs without it), then
    stops it. Its CRDs and objects stay."""
    info = state.pop("kueue", None)
    if ctx.kubeconfig.exists():
        for kind, name in zip(
            ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"), WEBHOOK_NAMES, strict=True
        ):
            with contextlib.suppress(HarnessError, subprocess.TimeoutExpired):
                ctx.kubectl("delete", kind, name, "--ignore-not-found", check=False, timeout=30)
    if info and info.get("pid"):
        stop_pid(int(info["pid"]), "kueue", "kueue", 15.0)
        log(f"stopped Kueue (pid {info['pid']})")
    save_state(ctx, state)
