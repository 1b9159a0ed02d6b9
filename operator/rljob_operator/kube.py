"""The only module that talks to the API server: reads, server-side apply, status, events.

Uses the official (blocking) kubernetes client from worker threads so the kopf event loop stays
free. Every write is a server-side apply under the operator's field manager with force, so the
operator owns exactly the fields it sets and leaves the runtime's `status.progress` alone.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rljob_api.contract import OPERATOR_FIELD_MANAGER
from rljob_api.events import event_body
from rljob_api.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION

from .checks import NodeInfo

# apiVersion/kind -> plural, for the kinds the operator writes or reads.
PLURALS = {
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("ray.io/v1", "RayJob"): "rayjobs",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    (API_VERSION, KIND): PLURAL,
}
EVENT_COMPONENT = "rljob-operator"
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def load_config() -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str = "") -> str:
    plural = PLURALS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class Kube:
    """Async facade over the blocking client."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or client.ApiClient()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query_params: list[tuple[str, str]] | None = None,
        header_params: dict[str, str] | None = None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": "application/json", **(header_params or {})}

        def call() -> Any:
            _, url, headers_out, body_out, post = self.api.param_serialize(
                method,
                path,
                query_params=query_params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(method, url, headers_out, body_out, post, _request_timeout=60)
            response.read()
            if not 200 <= response.status < 300:
                raise ApiException(http_resp=response)
            return json.loads(response.data) if response.data else None

        return await asyncio.to_thread(call)

    async def _get_or_none(self, path: str, **kwargs: Any) -> dict[str, Any] | None:
        try:
            return await self._call("GET", path, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def apply(
        self, obj: Mapping[str, Any], *, subresource: str = "", manager: str = OPERATOR_FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply `obj` (force: the operator owns what it sets)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"], subresource)
        return await self._call(
            "PATCH",
            path,
            body=json.loads(json.dumps(obj)),
            query_params=[("fieldManager", manager), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml"},
        )

    async def apply_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return await self.apply(body, subresource="status")

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(object_path(API_VERSION, KIND, namespace, name))

    async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        path = f"/apis/{GROUP}/{VERSION}/" + (f"namespaces/{namespace}/{PLURAL}" if namespace else PLURAL)
        return (await self._call("GET", path))["items"]

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(object_path("ray.io/v1", "RayJob", namespace, name))

    async def list_rayjobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs"
        return (await self._call("GET", path, query_params=[("labelSelector", selector)]))["items"]

    async def delete_rayjob(self, namespace: str, name: str, uid: str) -> None:
        """Delete this RayJob, and only this one (a uid precondition: never a newer RayJob of the
        same name), in the foreground: it goes once its RayCluster and pods are gone, so the job's
        next RayJob does not start beside them. Already gone is fine."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Foreground",
            "preconditions": {"uid": uid},
        }
        try:
            await self._call("DELETE", object_path("ray.io/v1", "RayJob", namespace, name), body=body)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_quotas(self, namespace: str) -> list[dict[str, Any]]:
        return (await self._call("GET", f"/api/v1/namespaces/{namespace}/resourcequotas"))["items"]

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{namespace}/pods"
        return (await self._call("GET", path, query_params=[("labelSelector", selector)]))["items"]

    async def list_nodes(self) -> list[NodeInfo]:
        items = (await self._call("GET", "/api/v1/nodes"))["items"]
        return [
            NodeInfo(
                n["metadata"]["name"],
                n["metadata"].get("labels") or {},
                (n.get("status") or {}).get("allocatable") or {},
            )
            for n in items
            if not (n.get("spec") or {}).get("unschedulable")
        ]

    async def post_event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on `obj`, posted by this client: kopf's own poster works only inside a
        kopf handler, and transitions found by the resync or a retry must be announced too."""
        body = event_body(
            obj,
            type_,
            reason,
            message,
            component=EVENT_COMPONENT,
            instance=socket.gethostname(),
            action="Reconcile",
            now=datetime.now(UTC),
        )
        namespace = obj["metadata"]["namespace"]
        await self._call("POST", f"/api/v1/namespaces/{namespace}/events", body=body)

    async def exists(self, namespace: str, resource: str, name: str) -> bool:
        """Whether a core object (secrets, persistentvolumeclaims) exists; reads metadata only."""
        path = f"/api/v1/namespaces/{namespace}/{resource}/{name}"
        return await self._get_or_none(path, header_params={"Accept": _METADATA_ONLY}) is not None
