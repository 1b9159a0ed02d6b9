"""The module that talks to the API server: reads, server-side apply, status, events (leader.py and
catch_up.py build on its Kube class).

Built on kubernetes_asyncio (the asyncio client generated from the Kubernetes OpenAPI spec), so no
call blocks the kopf event loop. Objects go in and come out as plain dicts (`_preload_content=False`
and the JSON body): the reconciler reads them as the API server wrote them. Every write is a
server-side apply under the operator's field manager with force, so the operator owns exactly the
fields it sets and leaves the runtime's `status.progress` alone. Lists are read in pages.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from rljob_api.contract import OPERATOR_FIELD_MANAGER
from rljob_api.events import event_body
from rljob_api.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION

from .checks import NodeInfo
from .pod_states import NodeDown, not_ready

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
APPLY = "application/apply-patch+yaml"
PAGE = 500  # objects per list request: a large namespace is read in pieces, never in one response
REQUEST_TIMEOUT_S = 60
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def timeout_message(call: str) -> str:
    return f"no answer from the API server within {REQUEST_TIMEOUT_S} s ({call})"


async def load_config() -> None:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()


def env_proxy(url: str) -> str | None:
    """The proxy the environment (HTTPS_PROXY, NO_PROXY, ...) names for `url`, as aiohttp would pick it."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):  # type: ignore[attr-defined]  # undocumented: not in typeshed
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


def without_env_lookups(api: client.ApiClient) -> None:
    """kubernetes_asyncio's aiohttp session trusts the environment, so every request reads ~/.netrc and
    the proxy variables in a worker thread: about a tenth of the operator's CPU in a burst of jobs, and a
    thread hop per call. The proxy is looked up once here instead (the kubeconfig's own wins); the API
    server's credentials come from the kubeconfig, never from netrc."""
    rest = api.rest_client
    if rest.proxy is None:
        rest.proxy = env_proxy(api.configuration.host)
    rest.pool_manager._trust_env = False  # aiohttp reads it per request; no public setter


async def _json(response: Any) -> Any:
    """The body of a `_preload_content=False` response, as the API server sent it; an error status
    raises the ApiException the client raises for its other calls (it checks only preloaded ones)."""
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = data.decode("utf-8", "replace")  # the API server's Status, as JSON
        error.headers = response.headers
        raise error
    return json.loads(data) if data else None


class Kube:
    """The operator's API calls, each returning plain dicts."""

    def __init__(
        self,
        api: client.ApiClient | None = None,
        on_request: Callable[[str, float], None] | None = None,
    ) -> None:
        """`on_request(call, seconds)`: told the wall time of every request (the operator's metrics)."""
        self.on_request = on_request
        if api is None:
            api = client.ApiClient()
            without_env_lookups(api)
        self.api = api
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.networking = client.NetworkingV1Api(self.api)

    async def close(self) -> None:
        await self.api.close()

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            response = await method(
                *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs
            )
            return await _json(response)
        except TimeoutError as exc:  # aiohttp's says nothing
            raise TimeoutError(timeout_message(method.__name__)) from exc
        finally:
            if self.on_request is not None:
                self.on_request(method.__name__, time.perf_counter() - started)

    async def _get_or_none(self, method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any] | None:
        try:
            return await self._call(method, *args)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _pages(
        self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """Every item of a list call, PAGE at a time (the `continue` token between pages)."""
        return [item async for item in self._paged(method, *args, **kwargs)]

    async def _paged(
        self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        token = None
        while True:
            extra: dict[str, Any] = {"_continue": token} if token else {}
            page = await self._call(method, *args, limit=PAGE, **kwargs, **extra)
            for item in page.get("items") or []:
                yield item
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # ---------------------------------------------------------------------------------- writes

    async def apply(
        self, obj: Mapping[str, Any], *, subresource: str = "", manager: str = OPERATOR_FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply `obj` (force: the operator owns what it sets)."""
        body = json.loads(json.dumps(obj))
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        options = {"field_manager": manager, "force": True, "_content_type": APPLY}
        key = (obj["apiVersion"], obj["kind"])
        if key not in PLURALS:
            raise KeyError(key)  # a kind the operator does not write
        if obj["apiVersion"] == "v1":  # ServiceAccount
            return await self._call(
                self.core.patch_namespaced_service_account, name, namespace, body, **options
            )
        if key == ("rbac.authorization.k8s.io/v1", "Role"):
            return await self._call(self.rbac.patch_namespaced_role, name, namespace, body, **options)
        if key == ("rbac.authorization.k8s.io/v1", "RoleBinding"):
            return await self._call(self.rbac.patch_namespaced_role_binding, name, namespace, body, **options)
        if key == ("networking.k8s.io/v1", "NetworkPolicy"):
            return await self._call(
                self.networking.patch_namespaced_network_policy, name, namespace, body, **options
            )
        group, version = obj["apiVersion"].split("/")
        patch = (
            self.custom.patch_namespaced_custom_object_status
            if subresource == "status"
            else self.custom.patch_namespaced_custom_object
        )
        return await self._call(patch, group, version, namespace, PLURALS[key], name, body, **options)

    async def apply_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return await self.apply(body, subresource="status")

    async def delete_rayjob(self, namespace: str, name: str, uid: str) -> None:
        """Delete this RayJob, and only this one (a uid precondition: never a newer RayJob of the
        same name), in the foreground: it goes once its RayCluster and pods are gone, so the job's
        next RayJob does not start beside them. Already gone is fine."""
        options = client.V1DeleteOptions(
            propagation_policy="Foreground", preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            await self._call(
                self.custom.delete_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayjobs",
                name,
                body=options,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

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
        await self._call(self.core.create_namespaced_event, obj["metadata"]["namespace"], body)

    # ----------------------------------------------------------------------------------- reads

    def cached_job(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(True, the job or None) when a watch cache answers (watch_cache.CachedKube); (False, None):
        none does, read it."""
        return False, None

    def cached_rayjob(self, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(True, the RayJob or None) when a watch cache answers (watch_cache.CachedKube); (False,
        None): none does, read it."""
        return False, None

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )

    async def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace:
            return await self._pages(
                self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
            )
        return await self._pages(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(
            self.custom.get_namespaced_custom_object, "ray.io", "v1", namespace, "rayjobs", name
        )

    async def list_rayjobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return await self._pages(
            self.custom.list_namespaced_custom_object,
            "ray.io",
            "v1",
            namespace,
            "rayjobs",
            label_selector=selector,
        )

    async def list_quotas(self, namespace: str) -> list[dict[str, Any]]:
        return await self._pages(self.core.list_namespaced_resource_quota, namespace)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return await self._pages(self.core.list_namespaced_pod, namespace, label_selector=selector)

    async def nodes_not_ready(self) -> dict[str, NodeDown]:
        """The nodes whose Ready condition is not True, by name."""
        return not_ready(await self._pages(self.core.list_node))

    async def list_nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(
                n["metadata"]["name"],
                n["metadata"].get("labels") or {},
                (n.get("status") or {}).get("allocatable") or {},
            )
            for n in await self._pages(self.core.list_node)
            if not (n.get("spec") or {}).get("unschedulable")
        ]

    async def exists(self, namespace: str, resource: str, name: str) -> bool:
        """Whether a core object (secrets, persistentvolumeclaims) exists. Reads its metadata only
        (a Secret's data never reaches the operator): the client's typed reads cannot ask for that, so
        this is its generic call_api with the Accept header of a PartialObjectMetadata."""
        try:
            response = await self.api.call_api(
                f"/api/v1/namespaces/{namespace}/{resource}/{name}",
                "GET",
                header_params={"Accept": _METADATA_ONLY},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            await _json(response)  # raises the error status (call_api checks only preloaded ones)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
