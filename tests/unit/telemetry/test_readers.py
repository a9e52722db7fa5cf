"""One reader per source, chosen from the counters; a source that fails degrades alone: its
series are absent (never 0), the status names it with the reason, the others keep publishing."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import grpc
import pytest

from agent.gpu.readings import NodeReader
from agent.gpu.xid_events import XidEvents
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.readers import choose
from agent.telemetry.snapshot import PodRef, Snapshot, SourceStatus
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.xid import XidWatcher
from dcgm.counters import load_counters, parse_counters
from dcgm.fields import BY_NAME
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import entity, sim_node, two_ticks

F = {name.removeprefix("DCGM_FI_"): field.id for name, field in BY_NAME.items()}
ALL = ("devices", "gpm", "dcgm", "xid", "pods", "dra", "processes")


def _sources(snapshot: Snapshot) -> dict[str, str | None]:
    return {s.source: s.degraded for s in snapshot.sources}


def test_the_counter_set_chooses_the_readers() -> None:
    """As dcgm-exporter picks collectors from its CSV: no XID field, no XID reader; no DCP
    field, no DCGM reader even where DCGM is installed; pods, DRA and processes where pods are
    attributed. NVML devices and GPM always run (health, layouts, idle)."""
    default = load_counters()
    assert choose(default, pods=True, dra=True, dcgm=True) == ALL
    assert choose(default, pods=False, dra=True, dcgm=False) == ("devices", "gpm", "xid")
    nvml_only = parse_counters("DCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    assert choose(nvml_only, pods=True, dra=False, dcgm=True) == (
        "devices",
        "gpm",
        "pods",
        "processes",
    )


def test_a_broken_xid_event_set_degrades_the_xid_reader_alone(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    node.control.set_workload(0, tensor_active=0.5)
    reader = NodeReader(node.driver)
    watcher = XidWatcher(lambda: XidEvents(reader), node.stats, wait_ms=20)
    node.control.inject_fault("nvmlEventSetWait_v2", "Unknown")
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while "xid" not in dict(node.stats.view().errors) and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler = node.sampler(xids=watcher)
        snapshot = two_ticks(sampler)
    finally:
        watcher.stop()
    reason = _sources(snapshot)["xid"]
    assert reason is not None and "waiting for NVML events failed" in reason
    values = entity(snapshot, 0).values
    assert F["DEV_XID_ERRORS"] not in values, "unknown while XIDs may be missed, not 0"
    assert snapshot.xids == ()
    assert values[F["PROF_PIPE_TENSOR_ACTIVE"]] == pytest.approx(0.5, rel=0.01)
    assert F["DEV_GPU_TEMP"] in values
    assert _sources(snapshot)["devices"] is None and _sources(snapshot)["gpm"] is None
    text = _render(sampler.latest)
    assert 'gpu_agent_collection_source_up{reason="' in text and 'source="xid"} 0.0' in text
    assert 'gpu_agent_collection_source_up{source="gpm"} 1.0' in text
    assert "\nDCGM_FI_DEV_XID_ERRORS{" not in text
    assert "\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in text


def test_xid_events_not_yet_watched_are_not_published_as_0(tmp_path: Path) -> None:
    """Before the event set is registered (start waits at most 10 s), an XID could be missed:
    the reader is degraded and DCGM_FI_DEV_XID_ERRORS is absent, not 0."""
    node = sim_node(tmp_path)
    reader = NodeReader(node.driver)
    watcher = XidWatcher(lambda: XidEvents(reader), node.stats, wait_ms=20)  # not started
    sampler = node.sampler(xids=watcher)
    snapshot = two_ticks(sampler)
    reason = _sources(snapshot)["xid"]
    assert reason is not None and "not registered yet" in reason
    assert F["DEV_XID_ERRORS"] not in entity(snapshot, 0).values
    assert snapshot.xids == ()
    assert "\nDCGM_FI_DEV_XID_ERRORS{" not in _render(sampler.latest)


class _Hostengine:
    """DCGM's profiling backend (not part of the NVML simulator) with a connection to lose."""

    def __init__(self) -> None:
        self.gone = False

    def supports(self, gpu_uuid: str) -> frozenset[int]:
        return frozenset({F["PROF_PIPE_TENSOR_ACTIVE"], F["PROF_GR_ENGINE_ACTIVE"]})

    def read(self, gpu_uuid: str, gpu_instance_id: int | None) -> Mapping[int, float]:
        if self.gone:
            raise ConnectionError("Host engine connection invalid/disconnected")
        return {F["PROF_PIPE_TENSOR_ACTIVE"]: 0.25, F["PROF_GR_ENGINE_ACTIVE"]: 0.5}

    def instances(self) -> frozenset[tuple[str, int]]:
        return frozenset()  # no MIG instance on this node

    def rewatch(self) -> None:
        raise AssertionError("nothing to watch anew")


def test_a_lost_hostengine_degrades_the_dcgm_reader_alone_until_it_answers(
    tmp_path: Path,
) -> None:
    node = sim_node(tmp_path, "dgx-a100")  # Ampere: no GPM, DCP fields come from DCGM
    counters = parse_counters(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\nDCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
    )
    hostengine = _Hostengine()
    sampler = node.sampler(counters, profiling=hostengine)
    assert entity(sampler.tick(), 0).values[F["PROF_PIPE_TENSOR_ACTIVE"]] == 0.25
    hostengine.gone = True
    snapshot = sampler.tick()
    assert _sources(snapshot)["dcgm"] == "Host engine connection invalid/disconnected"
    values = entity(snapshot, 0).values
    assert F["PROF_PIPE_TENSOR_ACTIVE"] not in values, "absent, never 0"
    assert F["DEV_GPU_TEMP"] in values
    assert dict(node.stats.view().errors)["dcgm"] == 1
    hostengine.gone = False
    snapshot = sampler.tick()
    assert _sources(snapshot)["dcgm"] is None
    assert entity(snapshot, 0).values[F["PROF_PIPE_TENSOR_ACTIVE"]] == 0.25


def test_without_the_kubelet_socket_the_pods_reader_says_so_and_gpus_publish(
    tmp_path: Path,
) -> None:
    node = sim_node(tmp_path / "state")
    socket = tmp_path / "absent.sock"
    watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats())
    watcher.refresh()
    snapshot = node.sampler(pods=watcher).tick()
    assert SourceStatus("pods", f"no kubelet pod-resources socket at {socket}") in snapshot.sources
    assert SourceStatus("processes") in snapshot.sources
    assert {s.entity.gpu.index for s in snapshot.entities} == set(range(8))
    assert all(s.pod is None for s in snapshot.entities)
    assert F["DEV_GPU_TEMP"] in entity(snapshot, 3).values


def test_outside_a_cluster_no_kubelet_socket_is_nothing_missing(tmp_path: Path) -> None:
    """Off Kubernetes no kubelet runs and no pod holds a GPU: the pods source is up with no
    allocations, as doctor's pod-resources check says ok, not a source down for good (an
    alert on ``gpu_agent_collection_source_up`` would fire forever on a standalone node)."""
    node = sim_node(tmp_path / "state")
    socket = tmp_path / "absent.sock"
    stats = TelemetryStats()
    watcher = PodWatcher(PodResourcesClient(socket), socket, 60, stats, in_cluster=False)
    watcher.refresh()
    snapshot = node.sampler(pods=watcher).tick()
    assert SourceStatus("pods") in snapshot.sources
    assert all(s.pod is None for s in snapshot.entities)
    assert dict(stats.view().errors).get("kubelet", 0) == 0


def test_a_failing_kubelet_degrades_the_pods_source_and_keeps_its_last_answer(
    tmp_path: Path,
) -> None:
    """kubelet's socket is there but List fails (kubelet down or restarting): the pod labels
    stay kubelet's last answer, so they do not flap, and the pods source says it is degraded
    and why. It read "up" while kubelet failed, so nothing told that the labels were frozen
    (a pod deleted meanwhile kept its labels on the GPU)."""
    node = sim_node(tmp_path / "state")
    socket = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet([("ml", "trainer", "main", "nvidia.com/gpu", [node.uuids[0]])])
    stats = TelemetryStats()
    with serve(socket, kubelet):
        watcher = PodWatcher(PodResourcesClient(socket, timeout_s=5), socket, 60, stats)
        watcher.refresh()
        sampler = node.sampler(pods=watcher)
        assert _sources(sampler.tick())["pods"] is None
        read_at = _last_read(node.stats, "pods")
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        watcher.refresh()
        snapshot = sampler.tick()
        assert _last_read(node.stats, "pods") == read_at, "its age grows while it fails"
        reason = _sources(snapshot)["pods"]
        assert reason == (
            "kubelet pod-resources List failed (UNAVAILABLE): pods as of its last answer"
        )
        assert entity(snapshot, 0).pod == PodRef("ml", "trainer", "main")
        text = _render(sampler.latest)
        assert f'gpu_agent_collection_source_up{{reason="{reason}",source="pods"}} 0.0' in text
        assert 'pod="trainer"' in text
        kubelet.fail_with = None
        watcher.refresh()
        assert _sources(sampler.tick())["pods"] is None


def test_a_kubelet_down_for_long_stops_attributing_its_last_answer_and_says_so(
    tmp_path: Path,
) -> None:
    """kubelet's List fails for good: its last answer was served with no limit, so a pod deleted
    meanwhile kept its labels on the GPU's series and a 0-byte memory row for as long as
    kubelet stayed down. It is served a few List periods (three, at least 30 s), then dropped;
    the pods source says so, and kubelet's next answer is served again."""
    node = sim_node(tmp_path / "state")
    socket = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet([("ml", "trainer", "main", "nvidia.com/gpu", [node.uuids[0]])])
    now = [1000.0]
    with serve(socket, kubelet):
        client = PodResourcesClient(socket, timeout_s=5)
        watcher = PodWatcher(client, socket, 20, TelemetryStats(), clock=lambda: now[0])
        watcher.refresh()
        sampler = node.sampler(pods=watcher)
        sampler.tick()
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        now[0] += 60  # three periods: still served, said to be kubelet's last answer
        watcher.refresh()
        snapshot = sampler.tick()
        assert entity(snapshot, 0).pod == PodRef("ml", "trainer", "main")
        assert "gpu_agent_pod_memory_used_bytes{" in _render(sampler.latest)
        now[0] += 1
        watcher.refresh()
        snapshot = sampler.tick()
        assert entity(snapshot, 0).pod is None
        text = _render(sampler.latest)
        assert 'pod="trainer"' not in text
        assert "gpu_agent_pod_memory_used_bytes{" not in text
        assert _sources(snapshot)["pods"] == (
            "kubelet pod-resources List failed (UNAVAILABLE): pods not attributed: its last "
            "answer is over 60 s old"
        )
        kubelet.fail_with = None
        watcher.refresh()
        snapshot = sampler.tick()
        assert entity(snapshot, 0).pod == PodRef("ml", "trainer", "main")
        assert _sources(snapshot)["pods"] is None


def test_a_kubelet_that_never_answered_attributes_nothing_and_says_so(tmp_path: Path) -> None:
    node = sim_node(tmp_path / "state")
    socket = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet([("ml", "trainer", "main", "nvidia.com/gpu", [node.uuids[0]])])
    kubelet.fail_with = grpc.StatusCode.DEADLINE_EXCEEDED
    with serve(socket, kubelet):
        watcher = PodWatcher(PodResourcesClient(socket, timeout_s=5), socket, 60, TelemetryStats())
        watcher.refresh()
        snapshot = node.sampler(pods=watcher).tick()
    assert _sources(snapshot)["pods"] == (
        "kubelet pod-resources List failed (DEADLINE_EXCEEDED): pods not attributed yet"
    )
    assert all(s.pod is None for s in snapshot.entities)


def _last_read(stats: TelemetryStats, source: str) -> float:
    """gpu_agent_collection_source_timestamp_seconds{source}."""
    (at,) = [s.last_at for s in stats.view().sources if s.source == source]
    return at


def _render(latest: object) -> str:
    exporter = MetricsExporter(load_counters(), "dcgm", latest, TelemetryStats())  # type: ignore[arg-type]
    body, _ = exporter.render("text/plain")
    return body.decode()
