"""What to do about a failed API call (pure): retry it quietly, retry it and say so, or stop and
say why.

A conflict, a timeout or a 5xx passes by itself: the pass is retried with backoff, and from the
second failure in a row the job's Reconciling condition says "retrying (attempt N)". A write of a
child that the API server refuses (422 from KubeRay's CRD schema, a webhook's or a policy's
denial, a kind that is not served) will be refused again until someone changes the job or the
cluster: the job is Stalled with the API server's whole message. A permission the operator lacks
is a refusal too, described by permissions.Denial.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes_asyncio.client.exceptions import ApiException

from .permissions import api_message, denial, describe_api_error

SHOWN_FROM_ATTEMPT = 2  # one conflict is routine; two failures in a row are worth telling
_TRANSIENT = {408, 409, 429}  # and every 5xx
_NAMESPACE_GOING = "because it is being terminated"


class ChildWriteError(Exception):
    """Applying one of the job's children failed; `cause` is the client's exception."""

    def __init__(self, kind: str, name: str, cause: BaseException) -> None:
        super().__init__(f"applying {kind} {name}: {describe_api_error(cause)}")
        self.kind = kind
        self.name = name
        self.cause = cause


@dataclass(frozen=True)
class Trouble:
    """How a failed pass shows on the job: Stalled=True (a refusal) or Reconciling=True (a retry)."""

    reason: str
    message: str
    stalled: bool


def cause_of(exc: BaseException) -> BaseException:
    return exc.cause if isinstance(exc, ChildWriteError) else exc


def describe(exc: BaseException) -> str:
    """One line for the log and the job: what was being done, and the API's whole message."""
    return str(exc) if isinstance(exc, ChildWriteError) else describe_api_error(exc)


def trouble(exc: BaseException, attempt: int, delay: float) -> Trouble | None:
    """What to put on the job for a pass that raised `exc` (its `attempt`-th failure in a row, retried
    in `delay` s); None: nothing yet (a first transient failure)."""
    cause = cause_of(exc)
    refused = denial(cause)
    if refused is not None:
        return Trouble("PermissionDenied", refused.message(), stalled=True)
    if isinstance(exc, ChildWriteError) and _refusal(cause):
        return Trouble("ApplyRefused", _refused_message(exc), stalled=True)
    if attempt < SHOWN_FROM_ATTEMPT:
        return None
    return Trouble("Retrying", f"retrying (attempt {attempt}) in {delay:g} s: {describe(exc)}", False)


def _refusal(exc: BaseException) -> bool:
    """An answer that a retry of the same request cannot change."""
    if not isinstance(exc, ApiException) or exc.status is None:
        return False
    if _NAMESPACE_GOING in api_message(exc):
        return False  # the job goes with its namespace: nothing for anyone to fix
    return 400 <= exc.status < 500 and exc.status not in _TRANSIENT


def _refused_message(exc: ChildWriteError) -> str:
    cause = exc.cause
    assert isinstance(cause, ApiException)
    said = api_message(cause)
    if "admission webhook" in said:
        advice = (
            "A webhook refused it: change what it names, or ask the cluster's administrator about the policy."
        )
    elif cause.status == 404 and exc.kind.startswith("Ray"):
        advice = (
            "The API server does not serve this kind: install KubeRay (its CRDs), then restart the operator."
        )
    elif cause.status == 404:
        advice = "Something it refers to is missing: create what the message names."
    elif cause.status in (400, 422):
        advice = (
            "Change the field it names in the job's spec; if the field is one the operator sets, check that "
            "KubeRay's version is one the operator supports (docs/install.md)."
        )
    else:
        advice = "Change what it names in the job's spec, or ask the cluster's administrator."
    return (
        f"the API server refused to apply {exc.kind} {exc.name} ({cause.status} {cause.reason}): {said}. "
        f"{advice} The operator retries and goes on once it is accepted."
    )
