"""DRA attribution: this node's ResourceSlices watched on the API stand-in (a republished slice
seen at once, a relist on 410, the last answer kept while the API server is down), and the
claims' devices, DynamicMIG ones included, resolved to the GPUs and MIG instances NVML reports."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from agent.kube import InClusterKubeClient
from agent.telemetry.dra import (
    PATH,
    DraDevices,
    DraReader,
    DraSlicesCollector,
    SliceDevice,
    slice_devices,
)
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.reader import Frame
from agent.telemetry.stats import TelemetryStats
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.api.support import wait_for
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import sim_node

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
MIG_A = "MIG-99999999-8888-7777-6666-555555555555"


def gpu_device(name: str, uuid: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}}}


def mig_device(name: str, parent: str, profile: str, uuid: str | None = None) -> dict[str, Any]:
    """A MIG device as NVIDIA's driver publishes it: static MIG with the instance's UUID,
    DynamicMIG (an abstract placement, made when a claim is prepared) without one."""
    attrs = {
        "type": {"string": "mig"},
        "parentUUID": {"string": parent},
        "profile": {"string": profile},
    }
    if uuid is not None:
        attrs["uuid"] = {"string": uuid}
    return {"name": name, "attributes": attrs}


def resource_slice(
    name: str, devices: list[dict[str, Any]], node: str = NODE, generation: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_slices_name_gpus_static_and_dynamic_mig_devices() -> None:
    other = resource_slice("other-driver", [gpu_device("gpu-0", "GPU-not-this")])
    other["spec"]["driver"] = "other.example.com"
    vfio = {"name": "gpu-vfio-0", "attributes": {"type": {"string": "vfio"}}}
    orphan = mig_device("gpu-0-mig-1g10gb-19-0", "", "1g.10gb")  # no parentUUID: skipped
    got = slice_devices(
        [
            resource_slice(
                "s",
                generation=2,
                devices=[
                    gpu_device("gpu-0", GPU_A),
                    mig_device("gpu-0-mig-1g10gb-19-2", GPU_A, "1g.10gb", MIG_A),
                    mig_device("gpu-0-mig-3g40gb-9-4", GPU_A, "3g.40gb"),
                    mig_device("oddly-named", GPU_A, "1g.10gb"),
                    vfio,
                    orphan,
                ],
            ),
            # The pool mid-republish: the older generation's slice no longer counts.
            resource_slice("s-old", [gpu_device("gpu-0", "GPU-old"), gpu_device("gpu-9", "GPU-x")]),
            other,
            {"spec": "nonsense"},
            7,
        ]
    )
    assert got == {
        (NODE, "gpu-0"): SliceDevice("gpu", uuid=GPU_A),
        (NODE, "gpu-0-mig-1g10gb-19-2"): SliceDevice(
            "mig", MIG_A, GPU_A, "1g.10gb", parent_minor=0, profile_id=19, placement_start=2
        ),
        (NODE, "gpu-0-mig-3g40gb-9-4"): SliceDevice(
            "mig", None, GPU_A, "3g.40gb", parent_minor=0, profile_id=9, placement_start=4
        ),
        (NODE, "oddly-named"): SliceDevice("mig", None, GPU_A, "1g.10gb"),
    }


def test_a_canonical_name_with_digits_no_driver_writes_is_oddly_named_not_an_error() -> None:
    """int() of 5000 digits (or of another script's) raised ValueError out of the informer's
    handler; such a name reads as one not in the driver's canonical form."""
    names = ["gpu-0-mig-1g10gb-19-" + "9" * 5000, "gpu-\u0663-mig-1g10gb-19-0"]
    got = slice_devices([resource_slice("s", [mig_device(n, GPU_A, "1g.10gb") for n in names])])
    assert got == {(NODE, n): SliceDevice("mig", None, GPU_A, "1g.10gb") for n in names}


def _requests(api: FakeKubeApi, *, watch: bool) -> list[Any]:
    return [
        r
        for r in api.requests
        if r.path == PATH and r.method == "GET" and (r.query.get("watch") == "1") == watch
    ]


def test_a_republished_slice_is_seen_by_the_watch_within_a_second(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.put_dra("resourceslices", resource_slice("node-gpus", [gpu_device("gpu-0", GPU_A)]))
    api.put_dra(
        "resourceslices",
        resource_slice("elsewhere", [gpu_device("gpu-0", "GPU-not-this")], node="gpu-node-2"),
    )
    dra = DraDevices(kube, NODE)
    dra.start()
    try:
        wait_for(lambda: dra.lookup(), "the first list", timeout=10)
        assert dict(dra.lookup()) == {(NODE, "gpu-0"): SliceDevice("gpu", uuid=GPU_A)}
        assert dra.status()[0]
        # The driver republishes the slice with a MIG instance made since.
        republished = time.monotonic()
        api.put_dra(
            "resourceslices",
            resource_slice(
                "node-gpus",
                [
                    gpu_device("gpu-0", GPU_A),
                    mig_device("gpu-0-mig-1g10gb-19-0", GPU_A, "1g.10gb", MIG_A),
                ],
                generation=2,
            ),
        )
        wait_for(lambda: len(dra.lookup()) == 2, "the republished slice", timeout=5, every=0.01)
        assert time.monotonic() - republished < 1.0
        lists, watches = _requests(api, watch=False), _requests(api, watch=True)
        assert len(lists) == 1  # one list, then the watch: no period, no polling
        assert watches and watches[0].query["resourceVersion"]
        assert {r.query["fieldSelector"] for r in lists + watches} == {
            f"spec.nodeName={NODE},spec.driver=gpu.nvidia.com"
        }
    finally:
        dra.stop()


def test_a_410_lists_again_and_keeps_following_changes(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.put_dra("resourceslices", resource_slice("node-gpus", [gpu_device("gpu-0", GPU_A)]))
    dra = DraDevices(kube, NODE, watch_timeout_s=1)
    dra.start()
    try:
        wait_for(lambda: dra.lookup(), "the first list", timeout=10)
        api.compact()  # the watch's version is gone: 410 at the next watch
        wait_for(lambda: len(_requests(api, watch=False)) == 2, "a relist after 410", timeout=10)
        api.delete_dra("resourceslices", "node-gpus")
        wait_for(lambda: not dra.lookup(), "the deletion by watch", timeout=5)
        assert len(_requests(api, watch=False)) == 2
    finally:
        dra.stop()


def test_an_api_server_down_keeps_the_last_answer_and_says_it_is_stale(
    kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    api.put_dra("resourceslices", resource_slice("node-gpus", [gpu_device("gpu-0", GPU_A)]))
    dra = DraDevices(kube, NODE, watch_timeout_s=1)
    collector = DraSlicesCollector(dra)

    def gauges() -> dict[str, float]:
        return {m.name: m.samples[0].value for m in collector.collect()}

    dra.start()
    try:
        wait_for(lambda: dra.status()[0], "the first list", timeout=10)
        assert gauges() == {"gpu_agent_dra_slices_current": 1.0, "gpu_agent_dra_slice_devices": 1.0}
        reader = DraReader(dra, lambda: ())
        assert reader.read(Frame(0.0, (), {})).degraded is None
        api.unavailable.add(PATH)
        wait_for(lambda: not dra.status()[0], "the outage to be noticed", timeout=10)
        _, detail = dra.status()
        assert "stale" in detail and "503" in detail
        assert dict(dra.lookup()) == {(NODE, "gpu-0"): SliceDevice("gpu", uuid=GPU_A)}
        assert gauges() == {"gpu_agent_dra_slices_current": 0.0, "gpu_agent_dra_slice_devices": 1.0}
        # The dra source serves the last answer and says so (gpu_agent_collection_source_up,
        # `metrics --sources`, `status`): it read "up" while its slices were stale.
        assert reader.read(Frame(0.0, (), {})).degraded == detail
        api.unavailable.clear()
        wait_for(lambda: dra.status()[0], "the watch to come back", timeout=15)
        # The claims come from kubelet's List: while it fails they are its last answer (or
        # none once that is too old), and the dra source says so, as the pods source does.
        kubelet = "kubelet pod-resources List failed (UNAVAILABLE): pods not attributed yet"
        failing = DraReader(dra, lambda: (), lambda: kubelet)
        assert failing.read(Frame(0.0, (), {})).degraded == kubelet
    finally:
        dra.stop()


def test_dynamic_mig_devices_resolve_to_their_instances_and_never_guess(
    tmp_path: Path,
    kube: InClusterKubeClient,
    kube_api: tuple[FakeKubeApi, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two 1g.10gb instances on one GPU, made by the driver when their claims were prepared:
    each claim's device (by GI profile and placement in its name) is its own instance; a
    placement with no instance and a name whose minor is another GPU's stay unattributed,
    counted and logged once."""
    api, _ = kube_api
    node = sim_node(tmp_path / "state")
    parent = node.uuids[1]
    # Made in this order, GI ids do not follow placements (the simulator gives 10, then 8).
    high = node.create_instance(1, "1g.10gb", slot=3)
    low = node.create_instance(1, "1g.10gb", slot=1)
    assert high.id != low.id and high.profile_id == low.profile_id
    pid = low.profile_id

    def name(start: int, minor: int = 1) -> str:
        return f"gpu-{minor}-mig-1g10gb-{pid}-{start}"

    api.put_dra(
        "resourceslices",
        resource_slice(
            "node-gpus",
            [gpu_device("gpu-0", node.uuids[0])]
            + [mig_device(name(s), parent, "1g.10gb") for s in range(7)]
            + [mig_device(name(1, minor=0), parent, "1g.10gb")],
        ),
    )
    kubelet = FakeKubelet(
        dra_rows=[
            ("ml", "infer-high", "srv", "claim-high", "gpu.nvidia.com", NODE, name(3)),
            ("ml", "infer-low", "srv", "claim-low", "gpu.nvidia.com", NODE, name(1)),
            ("ml", "no-instance", "srv", "claim-5", "gpu.nvidia.com", NODE, name(5)),
            ("ml", "wrong-gpu", "srv", "claim-w", "gpu.nvidia.com", NODE, name(1, minor=0)),
            ("ml", "unpublished", "srv", "claim-u", "gpu.nvidia.com", NODE, "gpu-7"),
        ]
    )
    socket = tmp_path / "kubelet.sock"
    dra = DraDevices(kube, NODE)
    dra.start()
    try:
        wait_for(lambda: dra.lookup(), "the slices", timeout=10)
        with serve(socket, kubelet):
            watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats(), dra)
            watcher.refresh()
            watcher.stop()
    finally:
        dra.stop()
    sampler = node.sampler(pods=watcher, dra=dra)
    with caplog.at_level(logging.WARNING, logger="agent.telemetry.sampler"):
        sampler.tick()
        snapshot = sampler.tick()
    layout = {gi.id: gi for gi in node.driver.layout(parent).instances}
    got = {
        s.entity.instance.gpu_instance_id: (s.pod.name, s.claim.name, s.claim.mig_device_uuid)
        for s in snapshot.entities
        if s.pod is not None and s.claim is not None and s.entity.instance is not None
    }
    assert got == {
        high.id: ("infer-high", "claim-high", layout[high.id].compute_instances[0].uuid),
        low.id: ("infer-low", "claim-low", layout[low.id].compute_instances[0].uuid),
    }
    assert {s.pod.name for s in snapshot.entities if s.pod is not None} == {
        "infer-high",
        "infer-low",
    }
    unattributed = [r.getMessage() for r in caplog.records if "left unattributed" in r.message]
    assert len(unattributed) == 3  # once each, over two ticks
    assert {m.split("(pod ml/")[1].split(")")[0] for m in unattributed} == {
        "no-instance",
        "wrong-gpu",
        "unpublished",
    }
    assert dict(node.stats.view().errors)["dra_unresolved"] == 3


def test_before_the_first_list_no_claim_is_judged(
    tmp_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """An API server down from the start: no slice is known, so a claim's device is neither
    attributed nor reported unresolved, and the device count is unknown, not 0."""
    api, _ = kube_api
    api.unavailable.add(PATH)
    dra = DraDevices(kube, NODE)
    dra.start()
    try:
        wait_for(lambda: "503" in dra.status()[1], "the failed list", timeout=10)
        assert dra.status()[0] is False and "not listed yet" in dra.status()[1]
        assert dra.lookup() is None
        samples = {m.name: m.samples for m in DraSlicesCollector(dra).collect()}
        assert samples["gpu_agent_dra_slice_devices"] == []
        assert samples["gpu_agent_dra_slices_current"][0].value == 0.0
        socket = tmp_path / "kubelet.sock"
        rows = [("ml", "p", "c", "claim", "gpu.nvidia.com", NODE, "gpu-0")]
        with serve(
            socket, FakeKubelet(rows=[("ml", "q", "c", "nvidia.com/gpu", [GPU_A])], dra_rows=rows)
        ):
            watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats(), dra)
            watcher.refresh()
            watcher.stop()
        assert [a.pod.name for a in watcher.current()] == ["q"]
    finally:
        dra.stop()
