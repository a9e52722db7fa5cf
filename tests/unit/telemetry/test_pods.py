"""Pod attribution from kubelet's PodResources API, against a real gRPC server on a Unix socket."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest

from agent.telemetry.allocation import Allocation, DeviceId, EntityKey, attribute, parse_device_id
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.snapshot import PodRef
from agent.telemetry.stats import TelemetryStats
from tests.unit.telemetry.kubelet import FakeKubelet, serve

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG_1 = "MIG-99999999-8888-7777-6666-555555555555"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (GPU_A, DeviceId(uuid=GPU_A)),
        (f"{GPU_A}::3", DeviceId(uuid=GPU_A, replica=3)),
        (MIG_1, DeviceId(uuid=MIG_1)),
        (f"{MIG_1}::7", DeviceId(uuid=MIG_1, replica=7)),
        (f"MIG-{GPU_A}/2/0", DeviceId(gpu_uuid=GPU_A, gpu_instance_id=2)),
        (f"MIG-{GPU_A}/2/0::1", DeviceId(gpu_uuid=GPU_A, gpu_instance_id=2, replica=1)),
        ("nvidia3", DeviceId(minor=3)),
        ("nvidia3/vgpu2", DeviceId(minor=3, replica=2)),
        ("nvidia0/gi1", DeviceId(minor=0, gpu_instance_id=1)),
        ("nvidia0/gi1/vgpu4", DeviceId(minor=0, gpu_instance_id=1, replica=4)),
    ],
)
def test_every_device_id_form_parses(raw: str, parsed: DeviceId) -> None:
    assert parse_device_id(raw) == parsed


@pytest.mark.parametrize("raw", ["0000:3b:00.0", "GPU-nothex", f"{GPU_A}::x", "mlx5_0", ""])
def test_foreign_ids_are_ignored(raw: str) -> None:
    assert parse_device_id(raw) is None


def _resolver(device: DeviceId) -> EntityKey | None:
    """This node: GPU_A whole, GPU_B with MIG_1 = GI 2 (minor 1)."""
    if device.uuid in (GPU_A, GPU_B):
        return (device.uuid, None)
    if device.uuid == MIG_1 or (device.minor == 1 and device.gpu_instance_id == 2):
        return (GPU_B, 2)
    if device.gpu_uuid is not None:
        return (device.gpu_uuid, device.gpu_instance_id)
    if device.minor == 0:
        return (GPU_A, None)
    return None


def _alloc(ns: str, pod: str, raw: str) -> Allocation:
    device = parse_device_id(raw)
    assert device is not None
    return Allocation(PodRef(ns, pod, "main"), "nvidia.com/gpu", device)


def test_shared_devices_map_to_every_pod_sorted() -> None:
    """Three replicas of one GPU are three pods on that GPU, never 'last writer wins'."""
    allocations = [
        _alloc("b", "p3", f"{GPU_A}::2"),
        _alloc("a", "p1", f"{GPU_A}::0"),
        _alloc("a", "p2", f"{GPU_A}::1"),
        _alloc("a", "p1", f"{GPU_A}::0"),  # duplicates collapse
        _alloc("c", "mig", f"{MIG_1}::0"),
        _alloc("c", "legacy", f"MIG-{GPU_B}/2/0"),
        _alloc("c", "gke", "nvidia1/gi2/vgpu0"),
        _alloc("x", "elsewhere", "GPU-00000000-0000-0000-0000-000000000000"),
    ]
    mapping = attribute(allocations, _resolver)
    assert mapping == {
        (GPU_A, None): (
            PodRef("a", "p1", "main"),
            PodRef("a", "p2", "main"),
            PodRef("b", "p3", "main"),
        ),
        (GPU_B, 2): (
            PodRef("c", "gke", "main"),
            PodRef("c", "legacy", "main"),
            PodRef("c", "mig", "main"),
        ),
    }


def test_client_lists_gpu_allocations_over_the_unix_socket(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    rows = [
        ("ml", "trainer", "main", "nvidia.com/gpu", [GPU_A]),
        ("ml", "trainer", "sidecar", "example.com/foo", ["foo-1"]),
        ("web", "nb", "jupyter", "nvidia.com/mig-1g.10gb", [MIG_1]),
        ("web", "nb2", "jupyter", "nvidia.com/gpu.shared", [f"{GPU_B}::4"]),
        ("net", "rdma", "main", "nvidia.com/rdma_shared_device_a", ["mlx5_0"]),
    ]
    with serve(socket, FakeKubelet(rows)):
        client = PodResourcesClient(socket, timeout_s=5)
        try:
            allocations = client.list()
        finally:
            client.close()
    assert [(a.pod, a.resource, a.device) for a in allocations] == [
        (PodRef("ml", "trainer", "main"), "nvidia.com/gpu", DeviceId(uuid=GPU_A)),
        (PodRef("web", "nb", "jupyter"), "nvidia.com/mig-1g.10gb", DeviceId(uuid=MIG_1)),
        (PodRef("web", "nb2", "jupyter"), "nvidia.com/gpu.shared", DeviceId(uuid=GPU_B, replica=4)),
    ]


def test_watcher_without_socket_attributes_nothing_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    socket = tmp_path / "absent.sock"
    stats = TelemetryStats()
    watcher = PodWatcher(PodResourcesClient(socket), socket, period_s=60, stats=stats)
    with caplog.at_level(logging.INFO, logger="agent.telemetry.pods"):
        watcher.refresh()
        watcher.refresh()
    assert watcher.current() == ()
    assert [r.getMessage() for r in caplog.records] == [
        f"no kubelet pod-resources socket at {socket}: pods not attributed"
    ]
    assert stats.view().errors == ()


def test_watcher_keeps_the_last_answer_when_kubelet_fails(tmp_path: Path) -> None:
    """Label sets stay stable across a failing List (rate limit, kubelet restart)."""
    socket = tmp_path / "kubelet.sock"
    stats = TelemetryStats()
    kubelet = FakeKubelet([("ml", "trainer", "main", "nvidia.com/gpu", [GPU_A])])
    with serve(socket, kubelet):
        watcher = PodWatcher(
            PodResourcesClient(socket, timeout_s=5), socket, period_s=60, stats=stats
        )
        watcher.refresh()
        before = watcher.current()
        kubelet.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
        watcher.refresh()
        assert watcher.current() == before
        assert len(before) == 1
        assert dict(stats.view().errors) == {"kubelet": 1}
        kubelet.fail_with = None
        kubelet.rows.append(("ml", "eval", "main", "nvidia.com/gpu", [GPU_B]))
        watcher.refresh()
        assert len(watcher.current()) == 2


def test_watcher_thread_refreshes_on_its_period(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet([("ml", "trainer", "main", "nvidia.com/gpu", [GPU_A])])
    with serve(socket, kubelet):
        watcher = PodWatcher(
            PodResourcesClient(socket, timeout_s=5), socket, period_s=0.05, stats=TelemetryStats()
        )
        watcher.start()
        try:
            deadline = time.monotonic() + 5
            while kubelet.calls < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            watcher.stop()
    assert kubelet.calls >= 3
    assert watcher.current()[0].pod == PodRef("ml", "trainer", "main")
