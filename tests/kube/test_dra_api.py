"""The API stand-in's resource.k8s.io/v1 objects behave as the API reference says, so DRA code
tested against it meets the same refusals and events as on a 1.34+ cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent.errors import AgentError, NotFound
from agent.kube import InClusterKubeClient
from agent.kube_watch import Informer
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"


def gpu_slice(name: str, node: str, devices: list[str], generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": d,
                    "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{d}"}},
                }
                for d in devices
            ],
        },
    }


def claim(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }


def test_slices_list_by_node_and_refuse_what_the_server_refuses(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    kube.request("POST", SLICES, body=gpu_slice("a", NODE, ["gpu-0", "gpu-1"]))
    kube.request("POST", SLICES, body=gpu_slice("b", "gpu-node-2", ["gpu-0"]))
    mine, _ = kube.list_all(SLICES, {"fieldSelector": f"spec.nodeName={NODE}"})
    assert [s["metadata"]["name"] for s in mine] == ["a"]
    assert "namespace" not in mine[0]["metadata"]  # cluster scoped
    bad = gpu_slice("c", NODE, ["GPU_0"])
    bad["spec"]["allNodes"] = True
    with pytest.raises(AgentError) as refused:
        kube.request("POST", SLICES, body=bad)
    assert "spec.devices[0].name" in str(refused.value)
    assert "exactly one of `nodeName`" in str(refused.value)
    assert [s["metadata"]["name"] for s in kube_api[0].dra("resourceslices")] == ["a", "b"]
    with pytest.raises(NotFound):
        kube.get("/apis/resource.k8s.io/v1beta1/resourceslices")
    too_many = gpu_slice("d", NODE, [f"gpu-{i}" for i in range(129)])
    with pytest.raises(AgentError, match="at most 128"):
        kube.request("POST", SLICES, body=too_many)


RESERVED = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}]}


def test_claim_status_is_a_subresource_and_spec_is_immutable(kube: InClusterKubeClient) -> None:
    made = kube.request("POST", CLAIMS, body=claim("train") | {"status": RESERVED})
    assert "status" not in made
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"}
                ]
            }
        }
    }
    put = kube.request("PUT", f"{CLAIMS}/train/status", body=dict(made, status=status))
    assert put["status"] == status
    changed = dict(put, spec={"devices": {"requests": []}})
    with pytest.raises(AgentError, match="immutable"):
        kube.request("PUT", f"{CLAIMS}/train", body=changed)
    relabel = dict(put, metadata=dict(put["metadata"], labels={"team": "a"}), status={})
    kept = kube.request("PUT", f"{CLAIMS}/train", body=relabel)
    assert kept["status"] == status  # a PUT on the object never writes status
    stale = dict(
        kept, metadata=dict(kept["metadata"], resourceVersion=made["metadata"]["resourceVersion"])
    )
    with pytest.raises(AgentError, match="modified"):
        kube.request("PUT", f"{CLAIMS}/train", body=stale)


def test_an_informer_sees_a_republished_slice(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api = kube_api[0]
    api.put_dra("resourceslices", gpu_slice("a", NODE, ["gpu-0"]))
    informer = Informer(kube, SLICES, {"fieldSelector": f"spec.nodeName={NODE}"}).start()
    try:
        assert informer.synced.wait(5)
        api.put_dra("resourceslices", gpu_slice("a", NODE, ["mig-0-0", "mig-0-1"], generation=2))
        api.put_dra("resourceslices", gpu_slice("z", "gpu-node-2", ["gpu-0"]))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            devices = [d["name"] for s in informer.objects() for d in s["spec"]["devices"]]
            if devices == ["mig-0-0", "mig-0-1"]:
                break
            time.sleep(0.02)
        assert devices == ["mig-0-0", "mig-0-1"]
        api.delete_dra("resourceslices", "a")
        deadline = time.monotonic() + 5
        while informer.objects() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert informer.objects() == []
    finally:
        informer.stop()
