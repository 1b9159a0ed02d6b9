"""Paths compared by whole segments after normalisation: the operator's hostPath allow-list, and the
path forms every path field of the spec is held to (the rules themselves: spec_cases_safety)."""

from __future__ import annotations

import re

import pytest
from operator_fixtures import job_from_spec

from rljob_api.paths import ABSOLUTE_PATH_PATTERN, RELATIVE_PATH_PATTERN, has_dot_dot, is_within, segments
from rljob_operator.checks import check_host_paths


@pytest.mark.parametrize(
    ("path", "root", "within"),
    [
        ("/mnt/nvme", "/mnt/nvme", True),
        ("/mnt/nvme/models", "/mnt/nvme", True),
        ("/mnt/nvme/models", "/mnt/nvme/", True),  # the admin's trailing '/'
        ("/mnt/nvme/models", "/mnt//nvme", True),
        ("/mnt/nvme/models", "/mnt/./nvme", True),
        ("/mnt/nvme/models", "/", True),
        ("/mnt/nvme-x", "/mnt/nvme", False),  # a prefix of the text, not a parent directory
        ("/mnt/nvme-x/models", "/mnt/nvme", False),
        ("/mnt/nv", "/mnt/nvme", False),
        ("/mnt", "/mnt/nvme", False),
        ("/mnt/nvme/../etc", "/mnt/nvme", False),  # '..' resolved before comparing
        ("/mnt/nvme/../../etc", "/mnt/nvme", False),
        ("/mnt/nvme/a/../b", "/mnt/nvme", True),
        ("/../mnt/nvme/x", "/mnt/nvme", True),  # nothing is above '/'
        ("mnt/nvme/x", "/mnt/nvme", False),  # relative: within nothing
        ("/mnt/nvme/x", "mnt/nvme", False),
    ],
)
def test_is_within_compares_whole_segments(path: str, root: str, within: bool) -> None:
    assert is_within(path, root) is within


def test_segments_resolve_dots_lexically() -> None:
    assert segments("//a/./b//c/../d/") == ["a", "b", "d"]
    assert segments("/..") == []


def _host_path_job(*paths: str):  # type: ignore[no-untyped-def]
    volumes = [{"name": f"h{i}", "mountPath": f"/h{i}", "hostPath": {"path": p}} for i, p in enumerate(paths)]
    return job_from_spec({"resources": {"volumes": volumes}})


def test_the_allow_list_is_not_a_text_prefix() -> None:
    refused = check_host_paths(_host_path_job("/mnt/nvme-x"), ("/mnt/nvme",))
    assert refused is not None and refused.reason == "HostPathNotAllowed"
    assert "'/mnt/nvme-x' (spec.resources.volumes[0], h0)" in refused.message
    assert check_host_paths(_host_path_job("/mnt/nvme/models", "/mnt/nvme"), ("/mnt/nvme/",)) is None


def test_the_allow_list_is_normalised_and_names_every_refused_volume() -> None:
    allowed = ("/mnt//nvme/", "/data/./cache")
    assert check_host_paths(_host_path_job("/mnt/nvme/a", "/data/cache/b"), allowed) is None
    refused = check_host_paths(_host_path_job("/mnt/nvme/a", "/data/cache2", "/mnt/nvmex"), allowed)
    assert refused is not None
    assert "(spec.resources.volumes[0]" not in refused.message
    assert "'/data/cache2' (spec.resources.volumes[1], h1)" in refused.message
    assert "'/mnt/nvmex' (spec.resources.volumes[2], h2)" in refused.message


def test_a_relative_allow_list_entry_allows_nothing() -> None:
    assert check_host_paths(_host_path_job("/mnt/nvme/a"), ("mnt/nvme",)) is not None


@pytest.mark.parametrize(
    ("text", "absolute", "relative", "dot_dot"),
    [
        ("/", True, False, False),
        ("/shared/models", True, False, False),
        ("/shared/models/", False, False, False),
        ("/shared//models", False, False, False),
        ("/shared/m:x", False, False, False),
        ("/a/../b", True, False, True),
        ("models", False, True, False),
        ("a/b", False, True, False),
        ("a/../b", False, True, True),
        ("..", False, True, True),
        ("..a/b..", False, True, False),
        ("a//b", False, False, False),
        ("a/", False, False, False),
    ],
)
def test_path_forms(text: str, absolute: bool, relative: bool, dot_dot: bool) -> None:
    assert (re.fullmatch(ABSOLUTE_PATH_PATTERN, text) is not None) is absolute
    assert (re.fullmatch(RELATIVE_PATH_PATTERN, text) is not None) is relative
    assert has_dot_dot(text) is dot_dot
