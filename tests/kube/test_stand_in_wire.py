"""The API stand-in answers what the real API server answers to a request's form, so a test
cannot pass on a request a cluster would refuse or on an event it would not send: a body's media
type (415), BOOKMARK events only on a watch that asked for them (``allowWatchBookmarks``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.errors import AgentError
from agent.kube import InClusterKubeClient
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE

LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpu-agent/leases"
NODE_PATH = f"/api/v1/nodes/{NODE}"
MERGE = "application/merge-patch+json"


def _lease(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, **spec},
    }


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", MERGE])
def test_a_create_or_update_in_another_media_type_is_415(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], media: str
) -> None:
    api, _ = kube_api
    with pytest.raises(AgentError, match=r"415 .*unknown format.*application/json"):
        kube.request("POST", LEASES, body=_lease("l"), content_type=media)
    assert not api.leases
    kube.request("POST", LEASES, body=_lease("l"), content_type="application/json; charset=utf-8")
    stored = api.leases[("gpu-agent", "l")]
    with pytest.raises(AgentError, match="415"):
        kube.request("PUT", f"{LEASES}/l", body=stored | {"spec": {}}, content_type=media)
    assert api.leases[("gpu-agent", "l")]["spec"]["holderIdentity"] == "a"


@pytest.mark.parametrize("media", ["application/json", "text/plain"])
def test_a_patch_in_a_type_that_is_no_patch_type_is_415(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], media: str
) -> None:
    api, _ = kube_api
    with pytest.raises(AgentError, match=r"415 .*merge-patch\+json"):
        kube.request(
            "PATCH", NODE_PATH, body={"metadata": {"labels": {"a": "b"}}}, content_type=media
        )
    assert "a" not in api.nodes[NODE]


def _watched(kube: InClusterKubeClient, query: dict[str, str]) -> list[str]:
    """The types of the events a one-second node watch gets."""
    response = kube.stream("/api/v1/nodes", {"watch": "1", "timeoutSeconds": "1", **query}, 10)
    try:
        return [json.loads(line)["type"] for line in response.read().splitlines()]
    finally:
        response.close()


@pytest.mark.parametrize(
    ("asked", "types"),
    [
        (None, ["MODIFIED"]),
        ("false", ["MODIFIED"]),
        ("0", ["MODIFIED"]),
        ("true", ["BOOKMARK", "MODIFIED"]),
        ("1", ["BOOKMARK", "MODIFIED"]),
    ],
)
def test_bookmarks_are_sent_only_to_a_watch_that_asked_for_them(
    kube: InClusterKubeClient,
    edge_api: tuple[EdgeKubeApi, str],
    asked: str | None,
    types: list[str],
) -> None:
    api, _ = edge_api
    since = str(api.version)
    api.bookmark("nodes")
    api.set_labels(NODE, {"pool": "a"})
    query = {"resourceVersion": since} | ({} if asked is None else {"allowWatchBookmarks": asked})
    assert _watched(kube, query) == types
