"""The republish step of a MIG apply on a dra node (agent.dra.republish), against the API
stand-in: with no kubelet plugin pod to restart, or no right to delete it, it says so and names
the settings, before waiting for anything."""

from __future__ import annotations

import pytest

from agent.dra.republish import Expected, Republisher
from agent.dra.watch import AllocationWatch
from agent.errors import Conflict
from agent.kube import InClusterKubeClient
from tests.kube.fake_api import FakeKubeApi, Pod
from tests.kube.fixtures import NODE


def republisher(kube: InClusterKubeClient) -> Republisher:
    watch = AllocationWatch(kube, NODE, "gpu.nvidia.com")
    return Republisher(
        kube,
        watch,
        namespace="gpu-operator",
        label_selector="app=nvidia-dra-driver-kubelet-plugin",
        timeout_s=1,
    )


def test_no_plugin_pod_on_this_node_is_named_with_the_settings(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    # The driver's pod on another node is not this node's.
    api.pods.append(
        Pod("gpu-operator", "plugin-x", "gpu-node-2", {"app": "nvidia-dra-driver-kubelet-plugin"})
    )
    with pytest.raises(Conflict) as refused:
        republisher(kube).republish(Expected(("MIG-a",)), lambda _: None)
    message = str(refused.value)
    assert "no DRA kubelet plugin pod on this node matched" in message
    assert "dra.plugin_namespace" in message and "dra.plugin_label_selector" in message
    assert [p.name for p in api.pods if p.name == "plugin-x"] == ["plugin-x"]  # left alone


def test_a_forbidden_delete_says_so(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.pods.append(
        Pod("gpu-operator", "plugin-1", NODE, {"app": "nvidia-dra-driver-kubelet-plugin"})
    )
    api.forbidden.add(("DELETE", "/api/v1/namespaces/gpu-operator/pods/plugin-1"))
    with pytest.raises(Conflict, match=r"could not restart the DRA driver's kubelet plugin.*403"):
        republisher(kube).restart()
