"""A cluster without the DRA API (no ``resource.k8s.io``): the agent's ResourceSlice informer
is started on every node (``dra.mode: auto``), and listed a path the server 404s every 15-45 s
forever, about 170 requests a second from 5,000 nodes, GetNode saying the kubernetes component
degraded all along. Discovery says the API is not served: nothing is listed, the status says
so (healthy), and discovery is asked again hourly, the informer starting once it is served."""

from __future__ import annotations

import time

import pytest

import agent.kube_discovery
import agent.kube_watch
from agent.kube import InClusterKubeClient
from agent.kube_discovery import ApiVersions
from agent.kube_edge import KubeEdge
from agent.kube_node import NodeOwner
from agent.kube_watch import InformerFactory
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE
from tests.kube.test_dra_api import gpu_slice
from tests.unit.api.support import wait_for

WINDOW_S = 2.0


def _edge(kube: InClusterKubeClient, **informers_kw: float) -> KubeEdge:
    # 600 times the agent's pace
    informers = InformerFactory(kube, backoff=(0.05, 0.2), **informers_kw)  # type: ignore[arg-type]
    owner = NodeOwner(kube, NODE, informers.node(NODE))
    return KubeEdge(kube, NODE, informers, ApiVersions(kube), owner)


def test_on_a_cluster_without_the_dra_api_no_resourceslice_is_ever_asked_for(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    api, _ = edge_api
    del api.served["resource.k8s.io"]
    edge = _edge(kube)
    try:
        began = time.monotonic()
        slices = edge.slices().start()
        wait_for(lambda: slices.synced.is_set(), "the slices known empty", 10)
        time.sleep(WINDOW_S)  # the window measured: a back-off of 0.05-0.2 s lists 10+ times
        asked = [(c.method, c.path) for c in api.since(began)]
        assert [c for c in asked if "resourceslices" in c[1]] == []
        assert asked == [("GET", "/apis/resource.k8s.io")]  # discovery, once
        assert slices.listed() == []
        current, detail = slices.status()
        assert current and "not served" in detail
        edge.node_informer().start()
        wait_for(lambda: edge.health()[0], "the kubernetes component healthy", 10)
        assert "not served: resource.k8s.io serves no version" in edge.health()[1]
    finally:
        edge.stop()


def test_a_dra_api_turned_on_later_is_found_and_watched_without_a_restart(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, _ = edge_api
    served = api.served.pop("resource.k8s.io")
    monkeypatch.setattr(agent.kube_discovery, "UNSERVED_RECHECK_S", 0.3)  # an hour
    monkeypatch.setattr(agent.kube_watch, "UNSERVED_RECHECK_S", 0.3)
    edge = _edge(kube)
    try:
        slices = edge.slices().start()
        wait_for(lambda: slices.unserved != "", "not served", 10)
        api.put_dra("resourceslices", gpu_slice("node-gpus", NODE, ["gpu-0"]))
        api.served["resource.k8s.io"] = served  # the cluster upgraded under the agent
        wait_for(lambda: len(slices.objects()) == 1, "the slice listed", 10)
        assert slices.status()[0] and not slices.unserved
        assert "resourceslices" not in edge.apis.unserved
    finally:
        edge.stop()


def test_a_dra_api_turned_off_later_is_not_listed_every_back_off(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Discovery's answer was kept for good: an API turned off under the agent (a feature
    gate off, a downgrade) was listed at its old path, 404 every back-off, forever, and the
    component said degraded. A 404 there asks discovery again: not served, current."""
    api, _ = edge_api
    edge = _edge(kube, watch_timeout_s=0.5)  # each watch ends soon, and is asked again
    try:
        slices = edge.slices().start()
        wait_for(lambda: slices.synced.is_set() and slices.status()[0], "listed", 10)
        del api.served["resource.k8s.io"]  # the API turned off under the agent
        began = time.monotonic()
        api.compact()  # the next watch is 410: the relist meets the 404
        wait_for(lambda: slices.unserved != "", "found not served", 10)
        time.sleep(WINDOW_S)  # a back-off of 0.05-0.2 s would list 10+ times meanwhile
        lists = [c for c in api.since(began) if "resourceslices" in c.path and not c.watch]
        assert len(lists) <= 2, [(c.method, c.path) for c in lists]
        assert slices.status()[0] and "not served" in slices.status()[1]
    finally:
        edge.stop()
