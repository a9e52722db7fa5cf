"""A whole agent against the API stand-in, nothing changing: silent (docs/architecture.md, "The
Kubernetes edge"). With every timer that once re-wrote the Node sped up, the agent makes no
write and no request beside its two watches (its Node, its ResourceSlices; on a DRA node a third,
the agents' DeviceClasses), and never holds more than those; while the API server is away its
metrics say which cache is stale."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

import agent.api.inventory
import agent.health.publish
import agent.mig.labels
import agent.mig.recovery
import agent.reclaim
from agent.kube import InClusterKubeClient
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE
from tests.kube.test_dra_api import gpu_slice
from tests.unit.api.support import InProcessAgent, agent_config, wait_for

WINDOW_S = 4.0


def _quiet_for(api: EdgeKubeApi, seconds: float) -> bool:
    calls = api.since(0)
    return not calls or time.monotonic() - calls[-1].at >= seconds


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _caches(port: int) -> dict[str, float]:
    text = _metrics(port)
    found = re.findall(r'^gpu_agent_kube_cache_current\{resource="([^"]+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


@pytest.mark.parametrize("dra", [False, True], ids=["device-plugin", "dra"])
def test_an_agent_with_nothing_changing_makes_no_write_and_holds_two_watches(
    tmp_path: Path,
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
    dra: bool,
) -> None:
    """On a DRA node (its GPUs in a gpu.nvidia.com ResourceSlice) the sharing refresh reads the
    agents' DeviceClasses: by a third watch, never a list every 5 s."""
    api, _ = edge_api
    api.set_labels(NODE, {"feature.node.kubernetes.io/x": "true", "team": "vision"})
    if dra:
        api.put_dra("resourceslices", gpu_slice("node-gpus", NODE, ["gpu-0"]))
    caches = {"nodes", "resourceslices"} | ({"deviceclasses"} if dra else set())
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    # The periods of every pass that used to re-write the Node or poll beside a watch.
    for module, name in (
        (agent.health.publish, "PUBLISH_S"),
        (agent.reclaim, "RECLAIM_S"),
        (agent.mig.labels, "RESYNC_S"),
        (agent.mig.recovery, "ALLOCATION_CHECK_S"),
        (agent.api.inventory, "SHARING_EVERY_S"),
    ):
        monkeypatch.setattr(module, name, 0.2)
    root = tmp_path / "agent"
    config = agent_config(
        root,
        node_name=NODE,
        telemetry={
            "kubelet_socket": str(root / "kubelet.sock"),
            "interval_s": 0.2,
            "idle_reclaim_after_s": 3600,
        },
        driver={"check_s": 0.2},
    )
    with InProcessAgent(root, config) as running:
        wait_for(lambda: api.nodes[NODE].get("gpu-agent.io/health") == "healthy", "the marks")
        wait_for(lambda: _quiet_for(api, 1.0), "the start's requests to end", timeout=20)
        began = time.monotonic()
        time.sleep(WINDOW_S)  # the window measured: nothing may happen in it
        calls = api.since(began)
        labels = dict(api.nodes[NODE])
        most_watches = api.most_watches
        port = running.node.metrics_port
        assert _caches(port) == dict.fromkeys(caches, 1.0)
        # The API server goes away: the agent says which cache is stale, and recovers.
        api.restart()
        wait_for(lambda: _caches(port) == dict.fromkeys(caches, 0.0), "stale", 15)
        api.up()
        wait_for(lambda: _caches(port) == dict.fromkeys(caches, 1.0), "current", 60)
    assert [c for c in calls if c.write] == []
    assert [(c.method, c.path) for c in calls if not c.watch] == []
    assert most_watches <= len(caches)
    watched = {(c.path, c.query.get("fieldSelector")) for c in api.since(0) if c.watch}
    assert watched == {
        ("/api/v1/nodes", f"metadata.name={NODE}"),
        ("/apis/resource.k8s.io/v1/resourceslices", f"spec.nodeName={NODE}"),
    } | ({("/apis/resource.k8s.io/v1/deviceclasses", None)} if dra else set())
    assert labels["feature.node.kubernetes.io/x"] == "true" and labels["team"] == "vision"


def _component(running: InProcessAgent, name: str) -> tuple[bool, str]:
    node = running.node.services.inventory.response().node
    (found,) = [c for c in node.health.components if c.name == name]
    return found.healthy, found.detail


def test_with_the_api_server_away_get_node_says_kubernetes_is_degraded_and_gpus_still_serve(
    tmp_path: Path,
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GetNode (`gpu-agent status`) had no word of Kubernetes: with the API server away its
    node said healthy while every watch was stale and no Node write went through; only a
    metric told. It now names each stale cache with why, and says healthy once it is back."""
    api, _ = edge_api
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    root = tmp_path / "agent"
    config = agent_config(
        root,
        node_name=NODE,
        telemetry={"kubelet_socket": str(root / "kubelet.sock"), "interval_s": 0.2},
        driver={"check_s": 0.2},
    )
    with InProcessAgent(root, config) as running:
        wait_for(lambda: _component(running, "kubernetes")[0], "the watches current", 20)
        api.restart()
        wait_for(lambda: "stale" in _component(running, "kubernetes")[1], "said stale", 15)
        healthy, detail = _component(running, "kubernetes")
        assert not healthy and "/api/v1/nodes" in detail and "503" in detail
        assert _component(running, "gpu-driver")[0]  # GPU work goes on
        api.up()
        wait_for(lambda: _component(running, "kubernetes")[0], "healthy again", 60)


def test_a_hung_api_server_does_not_hold_the_agents_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the agent asked discovery for the ResourceSlices' version at once: an API
    server that takes connections and never answers held the start for the client's 10 s
    timeout (gRPC and /metrics not serving) before the allocation's bounded 3 s wait. The
    informer asks discovery on its own thread now; the start waits only that bound."""
    import socket

    from agent.node import ALLOCATION_SYNC_S

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # connections complete in the backlog; nothing is ever read or answered
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    # Half the real 10 s timeout: a start that waits for one call is still past the bound.
    kube = InClusterKubeClient(url, None, token="t", timeout=ALLOCATION_SYNC_S + 2)
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    root = tmp_path / "agent"
    config = agent_config(root, node_name=NODE, driver={"check_s": 0.2})
    began = time.monotonic()
    try:
        with InProcessAgent(root, config) as running:
            took = time.monotonic() - began
            assert took < ALLOCATION_SYNC_S + 3, f"the start took {took:.1f} s"
            assert not _component(running, "kubernetes")[0]  # said, not waited for
            assert _component(running, "gpu-driver")[0]
    finally:
        hung.close()


def test_an_agent_started_in_an_api_outage_says_kubernetes_reachable_once_it_is_back(
    tmp_path: Path,
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hourly doctor kept the start's answers: an agent started in an API outage reported
    gpu_agent_doctor_check_state{check="reachable"} 2 for an hour or until `gpu-agent doctor`,
    GetNode's "kubernetes" component long healthy. Its watches being current asks again."""
    import agent.doctor.service

    api, _ = edge_api
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    monkeypatch.setattr(agent.doctor.service, "KUBE_RECHECK_S", 0.2, raising=False)
    root = tmp_path / "agent"
    config = agent_config(root, node_name=NODE, driver={"check_s": 0.2})
    api.restart()  # 503 to every call, from before the start

    def reachable(running: InProcessAgent) -> float | None:
        found = re.search(
            r'^gpu_agent_doctor_check_state\{check="reachable",duty="kubernetes"\} (\S+)$',
            _metrics(running.node.metrics_port),
            re.M,
        )
        return float(found.group(1)) if found else None

    with InProcessAgent(root, config) as running:
        wait_for(lambda: reachable(running) == 2.0, "the start's doctor: not reachable", 20)
        api.up()
        wait_for(lambda: _component(running, "kubernetes")[0], "the watches current", 30)
        wait_for(lambda: reachable(running) == 0.0, "reachable, asked again", 10)
