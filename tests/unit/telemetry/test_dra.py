"""DRA attribution: a pod that got a GPU or a MIG device through a DRA claim (kubelet's
``dynamic_resources``, resolved through this node's ResourceSlices) carries its pod labels."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agent.telemetry.dra import DraDevices, slice_devices
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.stats import TelemetryStats
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import sim_node


def _slices(node: str, devices: list[tuple[str, str, str]], *, v1: bool = True) -> dict:  # type: ignore[type-arg]
    """A ResourceSliceList of NVIDIA's DRA driver: (device name, type, uuid)."""

    def device(name: str, kind: str, uuid: str) -> dict:  # type: ignore[type-arg]
        attrs = {"type": {"string": kind}, "uuid": {"string": uuid}}
        return (
            {"name": name, "attributes": attrs}
            if v1
            else {"name": name, "basic": {"attributes": attrs}}
        )

    return {
        "items": [
            {"spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node},
                      "devices": [device(*d) for d in devices]}},
            {"spec": {"driver": "other.example.com", "pool": {"name": node},
                      "devices": [device("gpu-0", "gpu", "GPU-not-this")]}},
        ]
    }  # fmt: skip


def test_slices_map_pool_and_device_to_the_uuid_in_either_version() -> None:
    for v1 in (True, False):
        got = slice_devices(
            _slices("n1", [("gpu-0", "gpu", "GPU-a"), ("mig-1", "mig", "MIG-b")], v1=v1)
        )
        assert got == {("n1", "gpu-0"): "GPU-a", ("n1", "mig-1"): "MIG-b"}
    assert slice_devices({"items": [{"spec": "nonsense"}, 7]}) == {}
    assert slice_devices("not a list") == {}


def test_a_dra_claim_attributes_its_gpu_and_its_mig_device(tmp_path: Path) -> None:
    node = sim_node(tmp_path / "state")
    gi = node.create_instance(1, "3g.40gb")
    mig_uuid = next(
        ci.uuid
        for layout_gi in node.driver.layout(node.uuids[1]).instances
        if layout_gi.id == gi.id
        for ci in layout_gi.compute_instances
    )
    assert mig_uuid is not None
    asked: list[tuple[str, Mapping[str, str]]] = []

    def get(path: str, query: Mapping[str, str]) -> object:
        asked.append((path, query))
        return _slices(
            "node-1", [("gpu-0", "gpu", node.uuids[0]), ("gpu-1-mig-0", "mig", mig_uuid)]
        )

    kubelet = FakeKubelet(
        dra_rows=[
            ("ml", "train-0", "main", "gpu-claim", "gpu.nvidia.com", "node-1", "gpu-0"),
            ("ml", "infer-0", "srv", "mig-claim", "gpu.nvidia.com", "node-1", "gpu-1-mig-0"),
            ("ml", "other", "x", "c", "other.example.com", "node-1", "gpu-0"),
        ]
    )
    socket = tmp_path / "kubelet.sock"
    with serve(socket, kubelet):
        dra = DraDevices(get, "node-1")
        watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats(), dra)
        watcher.refresh()
        sampler = node.sampler(pods=watcher)
        snapshot = sampler.tick()
        watcher.stop()
    assert asked[0] == (
        "/apis/resource.k8s.io/v1/resourceslices",
        {"fieldSelector": "spec.nodeName=node-1"},
    )
    pods = {
        (s.entity.gpu.index, s.entity.instance.gpu_instance_id if s.entity.instance else None): (
            s.pod.namespace, s.pod.name, s.pod.container
        )
        for s in snapshot.entities
        if s.pod is not None
    }  # fmt: skip
    assert pods == {(0, None): ("ml", "train-0", "main"), (1, gi.id): ("ml", "infer-0", "srv")}


def test_an_api_server_without_v1_falls_back_and_failures_keep_the_last_answer() -> None:
    calls: list[str] = []
    answer: list[object] = [_slices("n", [("gpu-0", "gpu", "GPU-a")], v1=False)]

    def get(path: str, query: Mapping[str, str]) -> object:
        calls.append(path)
        if "/v1/" in path or isinstance(answer[0], Exception):
            raise OSError("404")
        return answer[0]

    clock = [0.0]
    dra = DraDevices(get, "n", period_s=30, clock=lambda: clock[0])
    assert dra.lookup() == {("n", "gpu-0"): "GPU-a"}
    assert calls == [
        "/apis/resource.k8s.io/v1/resourceslices",
        "/apis/resource.k8s.io/v1beta2/resourceslices",
    ]
    answer[0] = OSError("down")
    clock[0] = 31
    assert dra.lookup() == {("n", "gpu-0"): "GPU-a"}  # kept
    assert calls[-1] == "/apis/resource.k8s.io/v1beta2/resourceslices"  # the version that worked
