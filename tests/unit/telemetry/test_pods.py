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


@pytest.mark.parametrize(
    "raw",
    [
        f"{GPU_A}::\u00b2",  # "²": str.isdigit() says yes, int() refuses it
        f"{GPU_A}::" + "9" * 5000,  # past int()'s 4300 digits
        "nvidia" + "9" * 5000,
        "nvidia\u0663",  # an Arabic-Indic 3: int() reads it, no kubelet writes it
        f"MIG-{GPU_A}/\u0662/0",
        "nvidia0/gi" + "1" * 10,  # more digits than any minor, instance or replica has
    ],
)
def test_ids_with_digits_no_kubelet_writes_are_not_parsed(raw: str) -> None:
    """Numbers are ASCII digits, one to nine of them: anything else is no id of ours, and
    never a ValueError out of the parser (which killed the watcher thread)."""
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
    said = [r.getMessage() for r in caplog.records if r.name == "agent.telemetry.pods"]
    assert said == [f"no kubelet pod-resources socket at {socket}: pods not attributed"]
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


def test_malformed_ids_from_kubelet_are_skipped_and_counted_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kubelet answer naming ``nvidia`` + 5000 digits raised ValueError out of refresh(): at
    start() it escaped, later it killed the thread and the last allocations were served as
    current for ever. The id is skipped (counted, said once), the others are attributed."""
    socket = tmp_path / "kubelet.sock"
    stats = TelemetryStats()
    bad = ["nvidia" + "9" * 5000, f"{GPU_A}::\u00b2"]
    rows = [
        ("ml", "trainer", "main", "nvidia.com/gpu", [GPU_B, *bad]),
        ("net", "rdma", "main", "nvidia.com/rdma_shared_device_a", ["mlx5_0"]),
    ]
    with serve(socket, FakeKubelet(rows)):
        watcher = PodWatcher(
            PodResourcesClient(socket, timeout_s=5), socket, period_s=60, stats=stats
        )
        with caplog.at_level(logging.WARNING, logger="agent.telemetry.pods"):
            watcher.refresh()
            watcher.refresh()
    assert [a.device for a in watcher.current()] == [DeviceId(uuid=GPU_B)]
    assert watcher.failing() is None
    assert dict(stats.view().errors) == {"kubelet_device_id": 4}  # two ids, two answers
    [said] = [r.getMessage() for r in caplog.records if r.name == "agent.telemetry.pods"]
    assert "2 device ids of nvidia.com/ resources" in said and len(said) < 400


class _BrokenClient(PodResourcesClient):
    """A client whose List fails with something other than a gRPC error (a bug, an answer it
    cannot read): the watcher must say so, not die."""

    def __init__(self, socket: Path) -> None:
        super().__init__(socket)
        self.calls = 0

    def list(self, dra: object = None, malformed: object = None) -> tuple[Allocation, ...]:  # type: ignore[override]
        self.calls += 1
        if self.calls >= 2:
            raise ValueError("unexpected")
        return (_alloc("ml", "trainer", GPU_A),)


def test_any_failure_of_a_refresh_is_a_kubelet_failure_said_and_the_thread_goes_on(
    tmp_path: Path,
) -> None:
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    stats = TelemetryStats()
    client = _BrokenClient(socket)
    watcher = PodWatcher(client, socket, period_s=0.02, stats=stats)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while client.calls < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert client.calls >= 4  # the thread lived through the failures
    assert len(watcher.current()) == 1  # the last good answer, said to be no longer current
    assert watcher.failing() == (
        "kubelet pod-resources List failed (ValueError): pods as of its last answer"
    )
    assert dict(stats.view().errors)["kubelet"] >= 3


def test_a_failure_of_the_first_refresh_does_not_escape_start(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    client = _BrokenClient(socket)
    client.calls = 1  # the first List fails
    watcher = PodWatcher(client, socket, period_s=60, stats=TelemetryStats())
    watcher.start()
    watcher.stop()
    assert watcher.current() == ()
    assert watcher.failing() == (
        "kubelet pod-resources List failed (ValueError): pods not attributed yet"
    )
