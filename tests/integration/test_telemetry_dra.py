"""DRA claims on /metrics end to end: the node's ResourceSlices watched on the API stand-in, a
real gRPC PodResources server on a Unix socket reporting the claims, kubelet's log links naming
the pods' UIDs, and the scraped text. A device-plugin pod on the same node keeps its labels."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import TelemetrySettings
from agent.gpu.readings import NodeReader
from agent.kube import InClusterKubeClient
from agent.telemetry.service import TelemetryService, build_telemetry
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
from tests.unit.telemetry.httpd import scrape, serve_metrics
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import SimNode, sim_node
from tests.unit.telemetry.test_dra import gpu_device, mig_device, resource_slice

pytestmark = pytest.mark.integration

DRIVER = "gpu.nvidia.com"
#: pod -> (namespace, container, pod UID)
PODS = {
    "dp-train": ("ml", "main", "0b0b0b0b-1111-4111-8111-000000000001"),
    "dra-train": ("ml", "main", "0b0b0b0b-1111-4111-8111-000000000002"),
    "infer-static": ("serving", "srv", "0b0b0b0b-1111-4111-8111-000000000003"),
    "infer-dynamic": ("serving", "srv", "0b0b0b0b-1111-4111-8111-000000000004"),
}


@pytest.fixture
def cluster(
    tmp_path: Path, kube: InClusterKubeClient, kube_api: tuple[FakeKubeApi, str]
) -> Iterator[tuple[SimNode, TelemetryService, dict[str, str]]]:
    """GPU 0 from the device plugin; GPU 2 whole by a DRA claim; GPU 1 in MIG mode with a
    static 3g.40gb instance (its UUID in the slice) and a DynamicMIG 1g.10gb one (none)."""
    api, _ = kube_api
    node = sim_node(tmp_path / "state")
    logs = tmp_path / "containers"
    logs.mkdir()
    for n, (pod, (ns, container, uid)) in enumerate(PODS.items()):
        link = logs / f"{pod}_{ns}_{container}-{n:064x}.log"
        link.symlink_to(f"/var/log/pods/{ns}_{pod}_{uid}/{container}/0.log")
    minor = NodeReader(node.driver).gpus()[1].minor
    static = node.create_instance(1, "3g.40gb", slot=0)
    dynamic = node.create_instance(1, "1g.10gb", slot=6)
    layout = {gi.id: gi for gi in node.driver.layout(node.uuids[1]).instances}
    mig_uuids = {gi: layout[gi].compute_instances[0].uuid or "" for gi in layout}
    static_name = f"gpu-{minor}-mig-3g40gb-{static.profile_id}-{static.placement.start}"
    dynamic_name = f"gpu-{minor}-mig-1g10gb-{dynamic.profile_id}-{dynamic.placement.start}"
    api.put_dra(
        "resourceslices",
        resource_slice(
            "node-gpus",
            [
                gpu_device("gpu-2", node.uuids[2]),
                mig_device(static_name, node.uuids[1], "3g.40gb", mig_uuids[static.id]),
                mig_device(dynamic_name, node.uuids[1], "1g.10gb"),
            ],
        ),
    )
    kubelet = FakeKubelet(
        rows=[("ml", "dp-train", "main", "nvidia.com/gpu", [node.uuids[0]])],
        dra_rows=[
            ("ml", "dra-train", "main", "train-gpu", DRIVER, NODE, "gpu-2"),
            ("serving", "infer-static", "srv", "static-mig", DRIVER, NODE, static_name),
            ("serving", "infer-dynamic", "srv", "dynamic-mig", DRIVER, NODE, dynamic_name),
        ],
    )
    expected = {
        "static_name": static_name,
        "dynamic_name": dynamic_name,
        "static_gi": str(static.id),
        "dynamic_gi": str(dynamic.id),
        "static_uuid": mig_uuids[static.id],
        "dynamic_uuid": mig_uuids[dynamic.id],
    }
    socket = tmp_path / "kubelet.sock"
    settings = TelemetrySettings(interval_s=0.2, kubelet_socket=socket, container_log_dir=logs)
    with serve(socket, kubelet):
        service = build_telemetry(
            node.driver, settings, hostname=NODE, proc_root=node.control.proc_root, kube=kube
        )
        service.start()
        try:
            _wait_until(service, lambda f: len(_claimed(f)) == 3)
            yield node, service, expected
        finally:
            service.stop()


def _families(service: TelemetryService) -> dict[str, list]:  # type: ignore[type-arg]
    with serve_metrics(service.exporter) as port:
        _, body = scrape(port, "text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


def _claimed(families: dict[str, list]) -> list:  # type: ignore[type-arg]
    return [s for s in families.get("DCGM_FI_DEV_FB_USED", []) if "dra_claim_name" in s.labels]


def _wait_until(service: TelemetryService, check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check(_families(service)):
        assert time.monotonic() < deadline, "the DRA claims never reached /metrics"
        time.sleep(0.05)


DRA_LABELS = (
    "pod",
    "namespace",
    "container",
    "pod_uid",
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
    "dra_mig_profile",
    "dra_mig_device_uuid",
)


def test_claimed_gpu_and_mig_rows_carry_the_dra_labels_and_the_pod_uid(cluster) -> None:  # type: ignore[no-untyped-def]
    _node, service, want = cluster
    families = _families(service)
    rows = {
        (s.labels["gpu"], s.labels.get("GPU_I_ID")): {k: s.labels.get(k) for k in DRA_LABELS}
        for s in families["DCGM_FI_DEV_FB_USED"]
    }
    uid = {pod: PODS[pod][2] for pod in PODS}
    assert rows[("2", None)] == {
        "pod": "dra-train",
        "namespace": "ml",
        "container": "main",
        "pod_uid": uid["dra-train"],
        "dra_claim_name": "train-gpu",
        "dra_claim_namespace": "ml",
        "dra_driver_name": DRIVER,
        "dra_pool_name": NODE,
        "dra_device_name": "gpu-2",
        "dra_mig_profile": None,  # a whole GPU: dcgm-exporter sets the MIG pair only for MIG
        "dra_mig_device_uuid": None,
    }
    assert rows[("1", want["static_gi"])] == {
        "pod": "infer-static",
        "namespace": "serving",
        "container": "srv",
        "pod_uid": uid["infer-static"],
        "dra_claim_name": "static-mig",
        "dra_claim_namespace": "serving",
        "dra_driver_name": DRIVER,
        "dra_pool_name": NODE,
        "dra_device_name": want["static_name"],
        "dra_mig_profile": "3g.40gb",
        "dra_mig_device_uuid": want["static_uuid"],
    }
    # DynamicMIG: no UUID in the slice; the instance NVML reports at that placement gives it.
    assert rows[("1", want["dynamic_gi"])] == {
        "pod": "infer-dynamic",
        "namespace": "serving",
        "container": "srv",
        "pod_uid": uid["infer-dynamic"],
        "dra_claim_name": "dynamic-mig",
        "dra_claim_namespace": "serving",
        "dra_driver_name": DRIVER,
        "dra_pool_name": NODE,
        "dra_device_name": want["dynamic_name"],
        "dra_mig_profile": "1g.10gb",
        "dra_mig_device_uuid": want["dynamic_uuid"],
    }
    # The device-plugin pod on the same node keeps its labels, without DRA's.
    assert rows[("0", None)] == dict.fromkeys(DRA_LABELS) | {
        "pod": "dp-train",
        "namespace": "ml",
        "container": "main",
    }
    # The same labels on every series of the claimed entities, not only the framebuffer.
    temperature = {
        (s.labels["gpu"], s.labels.get("GPU_I_ID")): s.labels.get("dra_claim_name")
        for s in families.get("DCGM_FI_DEV_GPU_TEMP", [])
    }
    assert temperature[("2", None)] == "train-gpu"
    assert families["gpu_agent_dra_slices_current"][0].value == 1.0


def test_a_slice_republished_without_the_device_drops_its_labels(cluster, kube_api) -> None:  # type: ignore[no-untyped-def]
    """The driver removes the whole-GPU device: its row loses the claim at the next refresh
    (never a stale claim on a device the node no longer publishes)."""
    node, service, want = cluster
    api, _ = kube_api
    api.put_dra(
        "resourceslices",
        resource_slice(
            "node-gpus",
            [mig_device(want["static_name"], node.uuids[1], "3g.40gb", want["static_uuid"])],
            generation=2,
        ),
    )
    _wait_until(service, lambda f: len(_claimed(f)) == 1, timeout=10)
    (row,) = _claimed(_families(service))
    assert row.labels["dra_claim_name"] == "static-mig"
