"""A job's RoleBinding is sent only once its Role exists. The API server checks that an identity
without the `bind` verb (the operator's) holds every rule of the Role it binds, reading the Role
when the request arrives: a RoleBinding sent beside its Role was refused (404) and the job showed
ApplyRefused until the retry. Seen on a real API server with the operator running as a pod."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from fake_kube import RAYJOB, ROLE, api_error, one_gpu_job


def test_the_role_binding_waits_for_its_role(monkeypatch: pytest.MonkeyPatch) -> None:
    h = one_gpu_job()
    real_apply = h.kube.apply

    async def apply(obj: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        if obj["kind"] == "RoleBinding":  # the escalation check reads the Role as the request arrives
            role = (ROLE, obj["metadata"]["namespace"], obj["roleRef"]["name"])
            if role not in h.kube.store:
                raise api_error(404, "NotFound", f'roles.rbac.authorization.k8s.io "{role[2]}" not found')
        await asyncio.sleep(0)  # a round trip: requests sent together are in flight together
        return await real_apply(obj, **kw)

    monkeypatch.setattr(h.kube, "apply", apply)
    h.reconcile("job-a")
    assert not [e for e in h.events if e[1] == "ApplyRefused"], h.events
    assert h.condition("job-a", "Stalled")["status"] == "False"
    assert any(key[0] == RAYJOB for key in h.kube.store), "the RayJob follows its prerequisites"
