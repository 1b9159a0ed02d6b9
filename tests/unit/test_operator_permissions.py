"""A 403 from the API server becomes a sentence naming the verb, the resource and the identity."""

from __future__ import annotations

import json

from kubernetes_asyncio.client.exceptions import ApiException

from rljob_operator.permissions import api_message, denial, describe_api_error


def _error(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden" if status == 403 else "Error")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return exc


NAMESPACED = (
    'rayjobs.ray.io "job-a" is forbidden: User "system:serviceaccount:rljob-system:rljob-operator" '
    'cannot patch resource "rayjobs" in API group "ray.io" in the namespace "ml"'
)
CLUSTER = (
    'nodes is forbidden: User "system:serviceaccount:rljob-system:rljob-operator" cannot list '
    'resource "nodes" in API group "" at the cluster scope'
)


def test_a_namespaced_denial_names_verb_resource_group_and_namespace() -> None:
    found = denial(_error(403, NAMESPACED))
    assert found is not None
    assert (found.verb, found.resource, found.group, found.namespace) == ("patch", "rayjobs", "ray.io", "ml")
    assert found.what == "patch rayjobs.ray.io in namespace ml"
    assert "system:serviceaccount:rljob-system:rljob-operator" in found.message()


def test_a_cluster_scoped_denial_and_a_subresource() -> None:
    found = denial(_error(403, CLUSTER))
    assert found is not None and found.what == "list nodes (cluster scope)"
    status = NAMESPACED.replace(
        '"rayjobs" in API group "ray.io"', '"rltrainingjobs/status" in API group "rljob.dev"'
    )
    found = denial(_error(403, status))
    assert found is not None and found.what == "patch rltrainingjobs/status.rljob.dev in namespace ml"


def test_other_errors_are_not_denials_and_messages_are_never_cut() -> None:
    assert denial(_error(409, "conflict")) is None
    assert denial(RuntimeError("x")) is None
    long = "spec.x: Invalid value: " + "y" * 2000 + " the field at fault"
    assert api_message(_error(422, long)) == long
    assert describe_api_error(_error(422, long)).endswith("the field at fault")
    assert describe_api_error(ValueError("bad")) == "ValueError: bad"


def test_the_owner_reference_refusal_names_the_finalizers_grant() -> None:
    message = (
        'serviceaccounts "probe-runtime" is forbidden: cannot set blockOwnerDeletion if an '
        "ownerReference refers to a resource you can't set finalizers on: , <nil>"
    )
    found = denial(_error(403, message))
    assert found is not None and found.what == "update rltrainingjobs/finalizers.rljob.dev"


def test_the_escalation_refusal_keeps_the_api_message_and_other_403s_are_not_denials() -> None:
    message = (
        'roles.rbac.authorization.k8s.io "j-runtime" is forbidden: user "system:serviceaccount:s:op" '
        '(groups=["system:serviceaccounts"]) is attempting to grant RBAC permissions not currently held:'
        '\n{APIGroups:["rljob.dev"], Resources:["rltrainingjobs/status"], Verbs:["get"]}'
    )
    found = denial(_error(403, message))
    assert found is not None and 'Resources:["rltrainingjobs/status"]' in found.message()
    terminating = 'rayjobs.ray.io "j" is forbidden: unable to create new content in namespace x because it is being terminated'
    assert denial(_error(403, terminating)) is None
