"""The API stand-in answers what the real API server answers to a request's form, so a test
cannot pass on a request a cluster would refuse or on an event it would not send: a body's
media type (415), a time not in its wire format (400: MicroTime is RFC3339Micro, Time RFC3339),
a Node taint the server's validation refuses (422), and BOOKMARK events only on a watch that
asked for them (``allowWatchBookmarks``)."""

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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("renewTime", "2026-12-08T01:00:00Z"),  # RFC 3339 without the six digits
        ("renewTime", "2026-12-08T01:00:00.123Z"),  # three digits
        ("acquireTime", "2026-12-08 01:00:00.000000Z"),  # no T
        ("acquireTime", "2026-12-08T01:00:00.000000"),  # no zone
    ],
)
def test_a_lease_time_not_in_microtime_wire_format_is_400(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], field: str, value: str
) -> None:
    """The server decodes a MicroTime with Go's RFC3339Micro layout: anything else does not
    decode, and the request is 400 BadRequest before anything is stored."""
    api, _ = kube_api
    with pytest.raises(AgentError, match=f"400 .*cannot be handled as a Lease.*{field}"):
        kube.request("POST", LEASES, body=_lease("l", **{field: value}))
    assert not api.leases
    right = {"acquireTime": "2026-12-08T01:00:00.000000Z", "renewTime": "2026-12-08T01:00:00+01:00"}
    with pytest.raises(AgentError, match="400"):  # an offset is a zone, but six digits it needs
        kube.request("POST", LEASES, body=_lease("l", **right))
    right["renewTime"] = "2026-12-08T01:00:00.123456+01:00"
    kube.request("POST", LEASES, body=_lease("l", **right))
    assert api.leases[("gpu-agent", "l")]["spec"]["renewTime"] == right["renewTime"]


def test_an_event_time_not_in_rfc3339_is_400_and_a_time_may_have_no_fraction(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{NODE}."},
        "involvedObject": {"kind": "Node", "name": NODE},
        "firstTimestamp": "2026-12-08T01:00:00Z",
        "lastTimestamp": "2026-12-08T01:00:00.5Z",  # a Time (RFC 3339): a fraction may be there
    }
    kube.request("POST", "/api/v1/namespaces/default/events", body=event)
    for field, value in (("lastTimestamp", "2026-12-08"), ("eventTime", "2026-12-08T01:00:00Z")):
        with pytest.raises(AgentError, match=f"400 .*cannot be handled as a Event.*{field}"):
            kube.request("POST", "/api/v1/namespaces/default/events", body=event | {field: value})
    assert len(api.events) == 1


@pytest.mark.parametrize(
    ("taint", "why"),
    [
        ({"key": "gpu-agent.io/health", "value": "failed", "effect": "Bogus"}, "effect"),
        ({"key": "bad key!", "effect": "NoSchedule"}, "key"),
        ({"key": "gpu-agent.io/health", "effect": ""}, "effect: Required"),
        ({"key": "gpu-agent.io/health", "value": "not valid!", "effect": "NoSchedule"}, "value"),
        ({"key": "", "effect": "NoSchedule"}, "key: Required"),
    ],
)
def test_an_invalid_node_taint_is_422_and_changes_nothing(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str], taint: dict[str, str], why: str
) -> None:
    api, _ = kube_api
    body = {"metadata": {"labels": {"pool": "a"}}, "spec": {"taints": [taint]}}
    with pytest.raises(AgentError, match=f"422 .*spec\\.taints\\[0\\]\\.{why}"):
        kube.request("PATCH", NODE_PATH, body=body, content_type=MERGE)
    assert not api.node_taints.get(NODE) and "pool" not in api.nodes[NODE]


def test_node_taints_are_unique_by_key_and_effect_and_a_valid_one_is_kept(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    taint = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
    twice = {"spec": {"taints": [taint, dict(taint, value="other")]}}
    with pytest.raises(AgentError, match=r"422 .*unique by key and effect"):
        kube.request("PATCH", NODE_PATH, body=twice, content_type=MERGE)
    both = [taint, dict(taint, effect="NoExecute"), dict(taint, effect="PreferNoSchedule")]
    kube.request("PATCH", NODE_PATH, body={"spec": {"taints": both}}, content_type=MERGE)
    assert api.node_taints[NODE] == both


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
