"""What the API server refused, in words an admin can act on (pure).

A 403 from the API server names the verb, the resource and the identity in its message; the
operator logs it whole, posts it as an event and shows it in the job's Stalled condition, so a
missing rule in the chart's role is found from `kubectl describe`, not from a silent retry loop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kubernetes_asyncio.client.exceptions import ApiException

from rljob_api.resource import GROUP, PLURAL

_FORBIDDEN = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>[\w-]+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "(?P<group>[^"]*)")?(?: in the namespace "(?P<namespace>[^"]*)")?'
)
# The OwnerReferencesPermissionEnforcement admission plugin's refusal names neither user nor verb:
# children owned with blockOwnerDeletion need `update` on the owner's finalizers (ours: the job's).
_OWNER_FINALIZERS = "cannot set blockOwnerDeletion"
# RBAC's escalation check: the operator may grant (in the runtime's Role) only what it holds.
_ESCALATION = "is attempting to grant RBAC permissions not currently held"


@dataclass(frozen=True)
class Denial:
    """One refused API call: `verb` on `resource` (plural[/subresource]) of `group`."""

    verb: str
    resource: str
    group: str
    namespace: str
    user: str
    detail: str  # the API server's whole message

    @property
    def what(self) -> str:
        if not self.verb:
            return f"do this: {self.detail}"
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f" in namespace {self.namespace}" if self.namespace else ""
        if "at the cluster scope" in self.detail:
            where = " (cluster scope)"
        return f"{self.verb} {resource}{where}"

    def message(self) -> str:
        who = f" ({self.user})" if self.user else ""
        return (
            f"the operator{who} is not allowed to {self.what}. Grant it in the operator's "
            "ClusterRole (or the namespace's Role): `helm upgrade` with the chart of this version "
            "restores every rule it needs."
        )


def api_message(exc: ApiException) -> str:
    """The Status message of an API error, whole (the field or permission at fault is often at its end)."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.body or exc.reason or "")


def denial(exc: BaseException) -> Denial | None:
    """The refused call of a 403 for a permission the operator lacks, or None."""
    if not isinstance(exc, ApiException) or exc.status != 403:
        return None
    message = api_message(exc)
    found = _FORBIDDEN.search(message)
    if found is not None:
        return Denial(
            found["verb"],
            found["resource"],
            found["group"] or "",
            found["namespace"] or "",
            found["user"],
            message,
        )
    if _OWNER_FINALIZERS in message:
        return Denial("update", f"{PLURAL}/finalizers", GROUP, "", "", message)
    if _ESCALATION in message:
        return Denial("", "", "", "", "", message)
    return None  # another refusal (a namespace being deleted, a webhook): not a missing permission


def describe_api_error(exc: BaseException) -> str:
    """One line for the log: the API's whole message, or the exception."""
    if isinstance(exc, ApiException):
        return f"API error {exc.status} {exc.reason}: {api_message(exc)}"
    return f"{type(exc).__name__}: {exc}"
