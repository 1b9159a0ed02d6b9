"""A core/v1 Event about an RLTrainingJob, as the operator and the runtime both post them (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .resource import API_VERSION, KIND

MESSAGE_LIMIT = 1024


def event_body(
    obj: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    *,
    component: str,
    instance: str,
    action: str,
    now: datetime,
) -> dict[str, Any]:
    """An Event on ``obj`` (its metadata: name, namespace and uid, which `kubectl describe` matches)."""
    meta = obj["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", API_VERSION),
            "kind": obj.get("kind", KIND),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "action": action,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance[:128],
        # Microseconds, so events of one second keep their order.
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
