"""The coordinator reads only Node labels, so it lists and watches Nodes as metadata only
(PartialObjectMetadata, as client-go's metadata informer): at 5,000 nodes a full Node is
10-20 KB (its status, the kubelet's 50 images) and every status change streamed it whole. Against
the API stand-in, which converts as the real server does (tests/kube/fake_meta.py), with 200
Nodes whose status is as big as a GPU node's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.coordinator.kube import KubeLister
from agent.errors import AgentError
from agent.kube import InClusterKubeClient
from agent.kube_watch import Informer
from tests.kube.fake_api import FakeKubeApi, Request
from tests.unit.api.support import wait_for

NODES = 200
#: the Accept client-go's metadata client sends (k8s.io/client-go/metadata), protobuf left out
LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


def kubelet_status(i: int, generation: int = 0) -> dict[str, Any]:
    """What a GPU node's kubelet reports: resources, addresses, its 50 largest images (the
    kubelet's --node-status-max-images)."""
    resources = {"cpu": "192", "memory": "2063731820Ki", "nvidia.com/gpu": "8", "pods": "110"}
    images = [
        {
            "names": [
                f"nvcr.io/nvidia/pytorch@sha256:{i * 1000 + j + generation:064x}",
                f"nvcr.io/nvidia/pytorch:24.{j:02}-py3",
            ],
            "sizeBytes": 9_000_000_000 + j,
        }
        for j in range(50)
    ]
    return {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"}],
        "images": images,
    }


@pytest.fixture
def fleet(
    kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]
) -> tuple[FakeKubeApi, KubeLister]:
    api, url = kube_api
    for i in range(NODES):
        api.nodes[f"gpu-{i:03}"] = {"pool": "a" if i % 2 else "b", "nvidia.com/gpu.count": "8"}
        api.node_status[f"gpu-{i:03}"] = kubelet_status(i)
    lister = KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=10.0)
    lister.page_size = 50
    return api, lister


def _sent(api: FakeKubeApi, accept: str, *, watch: bool) -> list[Request]:
    return [
        r
        for r in api.requests
        if r.path == "/api/v1/nodes"
        and r.headers.get("Accept") == accept
        and (r.query.get("watch") == "1") == watch
    ]


def test_the_coordinators_node_list_is_metadata_only_and_a_tenth_of_the_bytes(
    fleet: tuple[FakeKubeApi, KubeLister],
) -> None:
    api, lister = fleet
    labels = lister.node_labels_all()
    assert len(labels) == NODES + 2  # the fixture's two nodes besides
    assert labels["gpu-007"] == {"pool": "a", "nvidia.com/gpu.count": "8"}
    assert labels["gpu-008"]["pool"] == "b"
    pages = _sent(api, LIST_ACCEPT, watch=False)
    asked = [r.headers.get("Accept") for r in api.requests]
    assert asked == [LIST_ACCEPT] * 5, "the coordinator asked for whole Nodes"
    full, _ = lister.list_all("/api/v1/nodes", page_size=50)  # what it asked for before
    assert "images" in full[0]["status"]  # the stand-in served them whole to that
    whole = sum(r.sent for r in _sent(api, "application/json", watch=False))
    metadata = sum(r.sent for r in pages)
    assert metadata < whole / 10, f"{metadata} B of metadata against {whole} B of whole Nodes"

    # A server too old to serve metadata answers the whole Nodes (the Accept's plain JSON, as
    # client-go's metadata client lists it last): the labels are read from them the same.
    api.serves_metadata = False
    assert lister.node_labels_all() == labels


def test_the_coordinators_node_watch_is_metadata_only_and_sees_label_changes(
    fleet: tuple[FakeKubeApi, KubeLister],
) -> None:
    """Every kubelet's status change streams a small event, not the Node; a label change
    still lands in the cache."""
    api, lister = fleet
    nodes = lister.node_informer().start()
    whole = Informer(lister, "/api/v1/nodes").start()  # an agent-style watch, for the bytes
    try:
        assert nodes.synced.wait(30) and whole.synced.wait(30)
        kept = {o["metadata"]["name"]: o for o in nodes.objects()}
        assert kept["gpu-007"] == {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": kept["gpu-007"]["metadata"],
        }
        api.set_labels("gpu-007", {"pool": "inference"})
        for i in range(NODES):
            api.set_node_status(f"gpu-{i:03}", kubelet_status(i, generation=1))

        def caught_up() -> bool:
            latest = str(api.version)
            return nodes.resource_version == latest == whole.resource_version

        wait_for(caught_up, "both watches to see every change", timeout=60)
        kept = {o["metadata"]["name"]: o for o in nodes.objects()}
        assert kept["gpu-007"]["metadata"]["labels"]["pool"] == "inference"
        assert nodes.lists == 1  # the changes came by the watch
        (watch,) = _sent(api, WATCH_ACCEPT, watch=True)
        (full,) = _sent(api, "application/json", watch=True)
        assert watch.sent < full.sent / 10, f"{watch.sent} B of events against {full.sent} B"
    finally:
        nodes.stop()
        whole.stop()


def test_the_stand_in_converts_as_the_api_server_does(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """One Node asked as PartialObjectMetadata is its metadata; a list asked as the single kind
    (or one Node as the list kind) is 406 NotAcceptable, as the real server answers."""
    node = kube.get("/api/v1/nodes/gpu-node-1", accept=WATCH_ACCEPT)
    assert isinstance(node, dict) and set(node) == {"kind", "apiVersion", "metadata"}
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-node-1"}
    for path, accept in (
        ("/api/v1/nodes", WATCH_ACCEPT),
        ("/api/v1/nodes/gpu-node-1", LIST_ACCEPT),
    ):
        with pytest.raises(AgentError, match="406"):
            kube.get(path, accept=accept.removesuffix(",application/json"))
