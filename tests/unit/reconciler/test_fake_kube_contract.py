"""FakeKube has exactly the async methods of the real client, with the same parameters, so the
reconciler tests cannot pass against an interface the operator does not have."""

from __future__ import annotations

import inspect

import pytest
from fake_kube import FakeKube

from rljob_operator.kube import Kube


def _async_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }


def test_the_fake_has_every_async_method_of_kube_and_no_other() -> None:
    assert set(_async_methods(FakeKube)) == set(_async_methods(Kube))


@pytest.mark.parametrize("method", sorted(_async_methods(Kube)))
def test_each_method_takes_the_same_parameters(method: str) -> None:
    real, fake = _async_methods(Kube)[method], _async_methods(FakeKube)[method]
    shape = [(p.name, p.kind, p.default) for p in real.parameters.values()]
    assert [(p.name, p.kind, p.default) for p in fake.parameters.values()] == shape


def test_failures_can_be_injected_only_into_methods_kube_has() -> None:
    with pytest.raises(ValueError, match="apply_status"):
        FakeKube().fail("apply_status", TimeoutError())
