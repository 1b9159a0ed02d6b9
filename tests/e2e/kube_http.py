"""The API server over HTTP with a kubeconfig's credentials, for the tests' reads, applies and dry runs.

In a full e2e run a kubectl process cost 0.16 s per `get` and 0.77 s per `apply` (its start,
discovery, and for apply the OpenAPI schema) of the two cores the operators under test need, and
the tests poll once a second while they wait; so `Cluster.get`, `list` and `apply` come here, one
request each. Reads return what `kubectl get -o json` prints: the object, or a List's items (with
their kind and apiVersion), without `metadata.managedFields` (kubectl hides them unless
--show-managed-fields). Tests that check kubectl's own output or behaviour keep calling kubectl.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    """One API resource as discovery names it."""

    group_version: str  # "v1" or "ray.io/v1"
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = (
            f"/api/{self.group_version}" if "/" not in self.group_version else f"/apis/{self.group_version}"
        )
        ns = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        return f"{base}{ns}/{self.plural}" + (f"/{name}" if name else "")


def matching_resource(kind: str, groups: list[tuple[str, list[dict[str, Any]]]]) -> Resource | None:
    """The resource `kind` names as kubectl resolves it: a plural, singular, short name or Kind, in
    any case, optionally with `.group`; the first match in discovery's order (the core group, then the
    API server's group priority) wins, as in kubectl. `groups` is [(group_version, its resources)]."""
    wanted = kind.lower()
    name, _, group = wanted.partition(".")
    for group_version, resources in groups:
        this_group = group_version.rpartition("/")[0] if "/" in group_version else ""
        if group and not (this_group == group or this_group.startswith(group + ".")):
            continue
        for res in resources:
            if "/" in res["name"]:  # a subresource such as pods/log
                continue
            names = {
                res["name"],
                res.get("singularName", ""),
                res["kind"].lower(),
                *res.get("shortNames", []),
            }
            if name in {n.lower() for n in names if n}:
                return Resource(group_version, res["name"], bool(res["namespaced"]))
    return None


def resource_for_kind(
    api_version: str, kind: str, groups: list[tuple[str, list[dict[str, Any]]]]
) -> Resource | None:
    """The resource whose objects have this apiVersion and Kind (an object's own names)."""
    for group_version, resources in groups:
        if group_version != api_version:
            continue
        for res in resources:
            if "/" not in res["name"] and res["kind"] == kind:
                return Resource(group_version, res["name"], bool(res["namespaced"]))
    return None


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


class KubeHTTP:
    """Requests to the API server of a kubeconfig (its current context), over one connection pool."""

    def __init__(self, kubeconfig: str) -> None:
        import urllib3
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host
        self.auth = (
            {"Authorization": cfg.api_key["authorization"]} if cfg.api_key.get("authorization") else {}
        )
        self.http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            maxsize=4,
        )
        self._groups: list[tuple[str, list[dict[str, Any]]]] | None = None

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", **self.auth}
        if body is not None:
            headers["Content-Type"] = content_type
        resp = self.http.request(method, f"{self.host}{path}", body=body, headers=headers, timeout=60)
        return resp.status, resp.data

    def _json(self, path: str) -> dict[str, Any]:
        status, data = self.request("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {data.decode(errors='replace')[:500]}")
        return json.loads(data)

    def _discover(self) -> list[tuple[str, list[dict[str, Any]]]]:
        groups = [(v, self._json(f"/api/{v}")["resources"]) for v in self._json("/api")["versions"]]
        for group in self._json("/apis")["groups"]:
            version = group["preferredVersion"]["groupVersion"]
            status, data = self.request("GET", f"/apis/{version}")
            if status == 200:  # an aggregated API that is down lists nothing, as in kubectl
                groups.append((version, json.loads(data)["resources"]))
        return groups

    def _find(
        self, match: Callable[[list[tuple[str, list[dict[str, Any]]]]], Resource | None]
    ) -> Resource | None:
        """`match` over discovery; discovered again once when nothing matches (a CRD installed since)."""
        for fresh in (False, True):
            if self._groups is None or fresh:
                self._groups = self._discover()
            found = match(self._groups)
            if found:
                return found
        return None

    def resource_of(self, api_version: str, kind: str) -> Resource:
        """The resource of an object's apiVersion and Kind."""
        found = self._find(lambda groups: resource_for_kind(api_version, kind, groups))
        if found is None:
            raise LookupError(f'no matches for kind "{kind}" in version "{api_version}"')
        return found

    def resource(self, kind: str) -> Resource:
        """`kind` resolved by discovery as kubectl resolves it."""
        found = self._find(lambda groups: matching_resource(kind, groups))
        if found is None:
            raise LookupError(f'the server doesn\'t have a resource type "{kind}"')
        return found

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        path = self.resource(kind).path(namespace, name)
        status, data = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {data.decode(errors='replace')[:500]}")
        return without_managed_fields(json.loads(data))

    def list(self, kind: str, namespace: str | None = None, selector: str = "") -> list[dict[str, Any]]:
        from urllib.parse import quote

        path = self.resource(kind).path(namespace)
        if selector:
            path += f"?labelSelector={quote(selector)}"
        listed = self._json(path)
        # the API server leaves kind and apiVersion out of a list's items; kubectl fills them in
        kind_of = str(listed.get("kind", "")).removesuffix("List")
        return [
            without_managed_fields({"apiVersion": listed.get("apiVersion"), "kind": kind_of, **item})
            for item in listed["items"]
        ]

    def apply(self, obj: dict[str, Any], field_manager: str = "e2e") -> dict[str, Any]:
        """Server-side apply of one object (created or updated, conflicts forced), with the strict
        field validation kubectl asks for; the object as stored. Raises ApplyError with the API
        server's message when it is refused."""
        meta = obj["metadata"]
        res = self.resource_of(obj["apiVersion"], obj["kind"])
        path = res.path(meta.get("namespace") or "default", meta["name"])
        path += f"?fieldManager={field_manager}&force=true&fieldValidation=Strict"
        status, data = self.request(
            "PATCH", path, body=json.dumps(obj).encode(), content_type="application/apply-patch+yaml"
        )
        if status >= 300:
            try:
                message = str(json.loads(data).get("message", ""))
            except ValueError:
                message = data.decode(errors="replace")
            raise ApplyError(f"{obj['kind']} {meta['name']}: {message or f'HTTP {status}'}")
        return json.loads(data)


class ApplyError(RuntimeError):
    """The API server refused an apply."""
