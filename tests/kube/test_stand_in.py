"""The API stand-in refuses what the real API server refuses, so a test against it cannot pass
on a request a cluster would reject: invalid label keys and values (422), a write at a stale
resourceVersion (409), a create of an existing name (409), paged lists that end."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import kube as kube_module
from agent.coordinator.kube import KubeLister
from agent.coordinator.planning import claimdemand
from agent.errors import AgentError, Conflict, InvalidSpec
from agent.kube import InClusterKubeClient
from tests.kube.fake_api import FakeKubeApi, label_problem
from tests.kube.fixtures import NODE


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpu-agent.io/cache.llama", "ready"),
        ("nvidia.com/mig.config", "all-1g.10gb"),
        ("pool", ""),
        ("a" * 63, "b" * 63),
    ],
)
def test_valid_labels_pass(key: str, value: str) -> None:
    assert label_problem(key, value) is None


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("gpu-agent.io/cache.llama 8b", "ready", "name part"),
        ("Bad_Prefix.io/x", "y", "prefix part"),
        ("pool", "a" * 64, "label value"),
        ("pool", "-leading", "label value"),
        ("a" * 64, "x", "name part"),
        ("", "x", "name part"),
    ],
)
def test_invalid_labels_are_refused_like_the_api_server(key: str, value: str, why: str) -> None:
    problem = label_problem(key, value)
    assert problem is not None and why in problem


def test_a_patch_with_an_invalid_label_is_422_and_changes_nothing(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    before = dict(api.nodes[NODE])
    with pytest.raises(AgentError, match=r"422.*label value"):
        kube.patch_node_labels(NODE, {"gpu-agent.io/ok": "yes", "pool": "not valid!"})
    assert api.nodes[NODE] == before


def test_a_node_patch_at_a_stale_resource_version_is_409(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    version = kube.get(f"/api/v1/nodes/{NODE}")["metadata"]["resourceVersion"]  # type: ignore[index]
    kube.patch_node_labels(NODE, {"pool": "a"})  # someone else writes in between
    with pytest.raises(Conflict, match="the object has been modified"):
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{NODE}",
            body={"metadata": {"resourceVersion": version, "labels": {"pool": "b"}}},
            content_type="application/merge-patch+json",
        )
    assert api.nodes[NODE]["pool"] == "a"


def test_creating_an_existing_lease_is_409_already_exists(
    kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]
) -> None:
    api, url = kube_api
    lister = KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}
    lister.create_lease("ns", lease)
    with pytest.raises(Conflict, match="already exists"):
        lister.create_lease("ns", lease)


def test_a_paged_list_returns_every_item_once(
    kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]
) -> None:
    api, url = kube_api
    for i in range(7):
        api.nodes[f"extra-{i}"] = {}
    lister = KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
    items, version = lister.list_all("/api/v1/nodes", page_size=3)
    names = [i["metadata"]["name"] for i in items]
    assert sorted(names) == sorted(api.nodes) and len(names) == len(set(names)) == 9
    assert version == str(api.version)
    assert len([r for r in api.requests if r.path == "/api/v1/nodes"]) == 3


def test_one_pager_serves_every_list_its_cap_and_its_page_bound(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``InClusterKubeClient.pages`` is the one pager: the planner's capped lists read page by
    page and stop at their cap; a server whose list never ends is refused after MAX_PAGES."""
    api, _ = kube_api
    for i in range(7):
        api.nodes[f"extra-{i}"] = {}
    monkeypatch.setattr(claimdemand, "_PAGE", 3)
    assert len(claimdemand.list_capped(kube, "/api/v1/nodes", 9, "nodes")) == 9
    with pytest.raises(InvalidSpec, match="more than 5 nodes in the cluster: not read"):
        claimdemand.list_capped(kube, "/api/v1/nodes", 5, "nodes")
    monkeypatch.setattr(kube_module, "MAX_PAGES", 2)
    with pytest.raises(AgentError, match="did not end after 2 pages"):
        kube.list_all("/api/v1/nodes", page_size=3)


def test_node_status_conditions_merge_by_type_as_a_strategic_merge_patch(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = kube_api
    api.node_conditions[NODE] = [{"type": "Ready", "status": "True"}]
    path = f"/api/v1/nodes/{NODE}/status"
    smp = "application/strategic-merge-patch+json"
    for status in ("False", "True"):
        body = {"status": {"conditions": [{"type": "GPUHealthy", "status": status}]}}
        kube.request("PATCH", path, body=body, content_type=smp)
    node = kube.get(f"/api/v1/nodes/{NODE}")
    assert isinstance(node, dict)
    assert node["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "GPUHealthy", "status": "True"},
    ]
    with pytest.raises(AgentError, match="415"):  # a JSON merge patch would replace the list
        kube.request(
            "PATCH", path, body={"status": {}}, content_type="application/merge-patch+json"
        )
    with pytest.raises(AgentError, match="422"):
        bad = {"status": {"conditions": [{"type": "GPUHealthy", "status": "maybe"}]}}
        kube.request("PATCH", path, body=bad, content_type=smp)
