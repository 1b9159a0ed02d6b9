"""The operator's client layer (kube.py) on canned responses of the client's typed calls: lists read
page by page with the `continue` token, an error status raised as the client's ApiException with the
API server's Status, a timeout that says what it waited for, server-side apply of each kind through
its typed call. The e2e tests run it against the real API server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rljob_operator.kube import APPLY, PAGE, Kube, env_proxy, without_env_lookups
from rljob_operator.permissions import api_message


class Response:
    """What the client returns with _preload_content=False (an aiohttp response)."""

    def __init__(self, status: int, body: Any, reason: str = "OK") -> None:
        self.status, self.reason, self.headers = status, reason, {}
        self.data = json.dumps(body).encode()
        self.released = False

    async def read(self) -> bytes:
        return self.data

    def release(self) -> None:
        self.released = True


def _with_kube(use: Any) -> Any:
    """`use(kube)` with a Kube made inside the event loop (its aiohttp session needs one), then closed."""

    async def main() -> Any:
        kube = Kube()
        try:
            return await use(kube)
        finally:
            await kube.close()

    return asyncio.run(main())


def test_lists_are_read_page_by_page() -> None:
    calls: list[dict[str, Any]] = []
    pages = {None: ("tok-1", ["a", "b"]), "tok-1": ("tok-2", ["c"]), "tok-2": ("", ["d"])}

    async def list_namespaced_pod(namespace: str, **kwargs: Any) -> Response:
        calls.append({"namespace": namespace, **kwargs})
        token, names = pages[kwargs.get("_continue")]
        items = [{"metadata": {"name": n}} for n in names]
        return Response(200, {"metadata": {"continue": token} if token else {}, "items": items})

    async def use(kube: Kube) -> Any:
        kube.core.list_namespaced_pod = list_namespaced_pod  # type: ignore[method-assign]
        return await kube.list_pods("ml", "rljob.dev/job=a")

    pods = _with_kube(use)
    assert [p["metadata"]["name"] for p in pods] == ["a", "b", "c", "d"]
    assert [c.get("_continue") for c in calls] == [None, "tok-1", "tok-2"]
    assert all(c["limit"] == PAGE and c["label_selector"] == "rljob.dev/job=a" for c in calls)
    assert all(c["_preload_content"] is False for c in calls)


def test_an_error_status_is_the_clients_api_exception_with_the_whole_status() -> None:
    status = {"kind": "Status", "message": 'rayjobs.ray.io "x" is forbidden: User "op" cannot patch'}
    response = Response(403, status, reason="Forbidden")

    async def get_namespaced_custom_object(*_: Any, **__: Any) -> Response:
        return response

    async def use(kube: Kube) -> Any:
        kube.custom.get_namespaced_custom_object = get_namespaced_custom_object  # type: ignore[method-assign]
        return await kube.get_rayjob("ml", "x")

    with pytest.raises(ApiException) as caught:
        _with_kube(use)
    assert (caught.value.status, caught.value.reason) == (403, "Forbidden")
    assert api_message(caught.value) == status["message"] and response.released


def test_a_missing_object_is_none_and_a_timeout_says_what_it_waited_for() -> None:
    async def missing(*_: Any, **__: Any) -> Response:
        return Response(404, {"kind": "Status", "reason": "NotFound"}, reason="Not Found")

    async def slow(*_: Any, **__: Any) -> Response:
        raise TimeoutError

    async def use(kube: Kube) -> Any:
        kube.custom.get_namespaced_custom_object = missing  # type: ignore[method-assign]
        assert await kube.get_job("ml", "gone") is None
        kube.custom.get_namespaced_custom_object = slow  # type: ignore[method-assign]
        return await kube.get_job("ml", "x")

    with pytest.raises(TimeoutError, match=r"no answer from the API server within 60 s \(slow\)"):
        _with_kube(use)


@pytest.mark.parametrize(
    ("api_version", "kind", "method"),
    [
        ("v1", "ServiceAccount", "core.patch_namespaced_service_account"),
        ("rbac.authorization.k8s.io/v1", "Role", "rbac.patch_namespaced_role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "rbac.patch_namespaced_role_binding"),
        ("networking.k8s.io/v1", "NetworkPolicy", "networking.patch_namespaced_network_policy"),
        ("ray.io/v1", "RayJob", "custom.patch_namespaced_custom_object"),
    ],
)
def test_each_kind_is_applied_server_side_with_force_through_its_typed_call(
    api_version: str, kind: str, method: str
) -> None:
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    async def patch(*args: Any, **kwargs: Any) -> Response:
        seen.append((args, kwargs))
        return Response(200, args[-1])

    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x", "namespace": "ml"}}

    async def use(kube: Kube) -> Any:
        api, name = method.split(".")
        setattr(getattr(kube, api), name, patch)
        return await kube.apply(obj, manager="me")

    assert _with_kube(use) == obj
    ((args, kwargs),) = seen
    assert args[-1] == obj and ("x" in args and "ml" in args)
    assert (kwargs["field_manager"], kwargs["force"], kwargs["_content_type"]) == ("me", True, APPLY)


def test_exists_reads_metadata_only_and_a_404_is_false() -> None:
    asked: list[dict[str, Any]] = []

    def answering(status: int) -> Any:
        async def call_api(path: str, method: str, **kwargs: Any) -> Response:
            asked.append({"path": path, "method": method, **kwargs})
            return Response(status, {"kind": "Status"} if status >= 400 else {"metadata": {"name": "hf"}})

        return call_api

    async def use(kube: Kube) -> tuple[bool, bool]:
        kube.api.call_api = answering(200)  # type: ignore[method-assign]
        found = await kube.exists("ml", "secrets", "hf")
        kube.api.call_api = answering(404)  # type: ignore[method-assign]
        return found, await kube.exists("ml", "secrets", "hf")

    assert _with_kube(use) == (True, False)
    assert asked[0]["path"] == "/api/v1/namespaces/ml/secrets/hf" and asked[0]["method"] == "GET"
    assert "PartialObjectMetadata" in asked[0]["header_params"]["Accept"]


def test_the_session_reads_no_netrc_or_proxy_variables_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's trust_env costs a thread hop and a ~/.netrc read per call: off, with the
    environment's proxy for the API server looked up once instead."""
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    for name in ("https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    async def use(kube: Kube) -> Any:
        return kube.api.rest_client.pool_manager.trust_env

    assert _with_kube(use) is False

    async def session(host: str) -> tuple[bool, str | None]:
        api = client.ApiClient(client.Configuration(host=host))
        try:
            without_env_lookups(api)
            return api.rest_client.pool_manager.trust_env, api.rest_client.proxy
        finally:
            await api.close()

    assert asyncio.run(session("https://10.0.0.1:6443")) == (False, "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.1,.svc")
    assert asyncio.run(session("https://10.0.0.1:6443")) == (False, None)
    assert env_proxy("https://kubernetes.default.svc") is None
    monkeypatch.delenv("HTTPS_PROXY")
    assert env_proxy("https://api.example:6443") is None
