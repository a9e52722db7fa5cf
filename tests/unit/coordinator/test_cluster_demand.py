"""Demand from the cluster: Pending pods' MIG requests plus what running pods hold."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from agent.coordinator.planning import clusterdemand
from agent.coordinator.planning.clusterdemand import (
    demand_from_pods,
    list_pods,
    mig_profile,
    sharing_replicas,
)
from agent.coordinator.planning.demand import DemandEntry
from agent.kube import InClusterKubeClient
from tests.kube.fake_api import FakeKubeApi, _reply, _status


def pod(
    name: str,
    phase: str,
    limits: dict[str, object],
    *,
    node: str = "",
    priority: int | None = None,
    selector: dict[str, str] | None = None,
    init: dict[str, object] | None = None,
) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if selector:
        spec["nodeSelector"] = selector
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": init}}]
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}


def test_resource_names_of_the_mixed_strategy_are_profiles() -> None:
    assert mig_profile("nvidia.com/mig-1g.10gb") == ("1g.10gb", False)
    assert mig_profile("nvidia.com/mig-1g.10gb.me") == ("1g.10gb+me", False)
    assert mig_profile("nvidia.com/mig-3g.40gb.shared") == ("3g.40gb", True)
    assert mig_profile("nvidia.com/mig-lots") is None
    assert mig_profile("nvidia.com/gpu") is None


def test_pending_and_running_pods_make_the_demand_by_priority_and_pool() -> None:
    pods = [
        pod("wait-1", "Pending", {"nvidia.com/mig-1g.10gb": 2}, priority=100),
        pod("wait-2", "Pending", {"nvidia.com/mig-1g.10gb": "1"}, priority=100),
        pod("run-1", "Running", {"nvidia.com/mig-1g.10gb": 1}, node="n1", priority=100),
        pod(
            "train",
            "Pending",
            {"nvidia.com/mig-7g.80gb": 1},
            selector={"pool": "training"},
            init={"nvidia.com/mig-7g.80gb": 1},
        ),
        pod("media", "Pending", {"nvidia.com/mig-1g.10gb.me": 1}),
        pod("done", "Succeeded", {"nvidia.com/mig-1g.10gb": 5}),
        pod("whole", "Pending", {"nvidia.com/gpu": 1}),
        pod("typo", "Pending", {"nvidia.com/mig-9x.10gb": 1}),
    ]
    found = demand_from_pods(pods)
    assert found.demand.entries == (
        DemandEntry("1g.10gb", 4, None, 100),
        DemandEntry("1g.10gb+me", 1, None, 0),
        DemandEntry("7g.80gb", 1, None, 0, "pool=training"),
    )
    assert (found.pending, found.running) == (4, 1)
    assert any("whole GPUs" in n for n in found.notes)
    assert any("nvidia.com/mig-9x.10gb" in n for n in found.notes)


def test_time_sliced_requests_count_replicas_over_the_replicas_per_device() -> None:
    replicas = sharing_replicas(["time-slicing nvidia.com/mig-1g.10gb x4, nvidia.com/gpu x2"])
    assert replicas == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/gpu": 2}
    pods = [pod(f"p{i}", "Pending", {"nvidia.com/mig-1g.10gb": 1}) for i in range(5)]
    pods.append(pod("renamed", "Pending", {"nvidia.com/mig-1g.10gb.shared": 2}))
    found = demand_from_pods(pods, replicas)
    # 7 replicas at 4 per device: 2 devices.
    assert found.demand.entries == (DemandEntry("1g.10gb", 2),)


@dataclass
class PodsApi(FakeKubeApi):
    """The fake API server, also listing pods cluster-wide in pages (limit / continue)."""

    items: list[dict[str, object]] = field(default_factory=list)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        if url.path != "/api/v1/pods":
            return super()._handle(h)
        query = dict(urllib.parse.parse_qsl(url.query))
        if h.headers.get("Authorization") != f"Bearer {self.token_path.read_text().strip()}":
            return _reply(h, 401, _status(401, "Unauthorized"))
        assert query["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
        start = int(query.get("continue") or 0)
        limit = int(query["limit"])
        page = self.items[start : start + limit]
        more = start + limit < len(self.items)
        meta = {"continue": str(start + limit)} if more else {}
        return _reply(h, 200, {"kind": "PodList", "metadata": meta, "items": page})


@pytest.fixture
def pods_api(tmp_path: Path, tls_cert: tuple[Path, Path]) -> Iterator[tuple[PodsApi, str]]:
    token = tmp_path / "token"
    token.write_text("t\n")
    api = PodsApi(token_path=token)
    server, url = api.serve(*tls_cert)
    try:
        yield api, url
    finally:
        server.shutdown()
        server.server_close()


def test_pods_are_listed_through_the_kubernetes_api_page_by_page(
    pods_api: tuple[PodsApi, str], tls_cert: tuple[Path, Path]
) -> None:
    api, url = pods_api
    api.items = [pod(f"p{i}", "Pending", {"nvidia.com/mig-1g.10gb": 1}) for i in range(1201)]
    client = InClusterKubeClient(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)
    items = list_pods(client)
    assert len(items) == 1201
    assert demand_from_pods(items).demand.entries == (DemandEntry("1g.10gb", 1201),)


def test_the_cluster_demand_is_read_with_the_kubeconfig_outside_a_pod(
    kube_api: tuple[FakeKubeApi, str],
    tls_cert: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fleet plan --from-cluster` from a laptop said 'not running in a Kubernetes pod:
    KUBERNETES_SERVICE_HOST is unset', though every other fleet command that talks to the API
    reads the kubeconfig as kubectl does (docs/coordinator.md, Kubeconfigs)."""
    from tests.kube.fake_api import Pod
    from tests.kube.fixtures import stand_in_kubeconfig

    fake, url = kube_api
    fake.pods.append(Pod("ml", "job", "n1", {}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(stand_in_kubeconfig(tmp_path / "kc", url, tls_cert[0])))
    client = clusterdemand.cluster_client()
    assert client.server == url
    listed = client.get("/api/v1/namespaces/ml/pods")  # the fake serves namespaced lists
    assert [p["metadata"]["name"] for p in listed["items"]] == ["job"]  # type: ignore[index]
