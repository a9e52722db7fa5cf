"""The exporter renders a snapshot exactly: golden text per naming scheme and format."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from agent.http import Request
from agent.telemetry.exporter import MetricsExporter, families
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    FieldSupport,
    GpuIdentity,
    GpuStatus,
    InstanceIdentity,
    PodRef,
    PodUsage,
    Snapshot,
    SourceStatus,
    XidCount,
)
from agent.telemetry.stats import TelemetryStats
from dcgm.counters import parse_counters

GOLDEN = Path(__file__).parent / "golden"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

COUNTERS = parse_counters(
    """\
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Energy (in mJ).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer used (in MiB).
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Tensor pipe active (0-1).
DCGM_FI_PROF_PCIE_TX_BYTES, gauge, PCIe TX (in bytes/s).
DCGM_FI_DEV_XID_ERRORS, gauge, Last XID.
DCGM_FI_DRIVER_VERSION, label, Driver version.
"""
)

GPU0 = GpuIdentity(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 0)
GPU1 = GpuIdentity(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0", 1)
GI3 = Entity(GPU1, InstanceIdentity(3, "3g.40gb"))
TRAINER = PodRef("ml", "trainer-0", "main")
NOTEBOOK = PodRef("team-a", "nb-7", "jupyter")
NB9 = PodRef("team-b", "nb-9", "jupyter")


def _values(**kv: float) -> MappingProxyType[int, float]:
    ids = {
        "temp": 150,
        "power": 155,
        "energy": 156,
        "fb": 252,
        "tensor": 1004,
        "pcie": 1009,
        "xid": 230,
    }
    return MappingProxyType({ids[k]: v for k, v in kv.items()})


SNAPSHOT = Snapshot(
    taken_at=1_700_000_000.25,
    hostname="node-1",
    driver_version="550.90.07",
    nvml_version="12.550.90.07",
    gpus=(GpuStatus(GPU0, up=True), GpuStatus(GPU1, up=True)),
    entities=(
        EntitySample(
            Entity(GPU0),
            _values(
                temp=41, power=312.5, energy=9_876_543, fb=3072, tensor=0.375, pcie=1.5e9, xid=79
            ),
            pod=TRAINER,
            idle_seconds=0.0,
        ),
        EntitySample(Entity(GPU1), _values(temp=35, power=90.0, energy=1000, pcie=0, xid=0)),
        EntitySample(GI3, _values(fb=512, tensor=0.5), pod=None, idle_seconds=12.5),
    ),
    pods=(
        PodUsage(Entity(GPU0), TRAINER, memory_used_bytes=3 * 1024**3, sm_utilization=0.8),
        PodUsage(GI3, NOTEBOOK, memory_used_bytes=256 * 1024**2, sm_utilization=None),
        PodUsage(GI3, NB9, memory_used_bytes=128 * 1024**2, sm_utilization=None),
    ),
    xids=(XidCount(Entity(GPU0), 79, 2, 1_700_000_000.0), XidCount(GI3, 31, 1, 1_700_000_060.0)),
    support=(
        FieldSupport(1004, GPU0, supported=True),
        FieldSupport(1004, GPU1, supported=True),
        FieldSupport(526, GPU1, supported=False),
    ),
    sources=(SourceStatus("devices"), SourceStatus("dcgm", "hostengine gone")),
)  # fmt: skip


def _stats() -> TelemetryStats:
    stats = TelemetryStats()
    stats.observe_collection(0.012)
    stats.observe_scrape(0.0007)
    stats.error("kubelet")
    return stats


def _render(metric_names: str, accept: str) -> str:
    exporter = MetricsExporter(COUNTERS, metric_names, lambda: SNAPSHOT, _stats())
    body, _ = exporter.render(accept)
    return body.decode()


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPU_AGENT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), (
        f"{name} differs; rerun with GPU_AGENT_UPDATE_GOLDEN=1 to accept"
    )


@pytest.mark.parametrize(
    ("metric_names", "accept", "golden"),
    [
        ("dcgm", "text/plain", "dcgm.txt"),
        ("dcgm", OPENMETRICS, "dcgm.om.txt"),
        ("native", "text/plain", "native.txt"),
        ("native", OPENMETRICS, "native.om.txt"),
    ],
)
def test_render_matches_golden(metric_names: str, accept: str, golden: str) -> None:
    _check_golden(golden, _render(metric_names, accept))


def test_dcgm_text_keeps_exporter_names_labels_and_counter_type() -> None:
    """Dashboard 12239 reads these exact names and the gpu label (reference §6)."""
    text = _render("dcgm", "text/plain")
    families_ = {f.name: f for f in parse_text(text)}
    temp = families_["DCGM_FI_DEV_GPU_TEMP"]
    assert temp.type == "gauge"
    by_gpu = {s.labels["gpu"]: s for s in temp.samples}
    assert by_gpu["0"].labels == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        "pod": "trainer-0",
        "namespace": "ml",
        "container": "main",
    }
    # Typed counter as dcgm-exporter does, and the series keeps its name (no _total).
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text


def test_each_xid_series_says_when_its_first_xid_came_under_the_same_labels() -> None:
    """The rules count an XID series whole while its first XID is within their window. They
    told that by whether Prometheus had the series 10 minutes ago, so after a Prometheus
    restart (or on a new replica) every XID since the agent started paged again. The agent now
    says when each series began, under the counter's own labels (the rules match on them)."""
    for metric_names in ("dcgm", "native"):
        found = {f.name: f for f in parse_text(_render(metric_names, "text/plain"))}
        counts = found["gpu_agent_xid_errors"].samples
        first = found["gpu_agent_xid_errors_first_seen_timestamp_seconds"]
        assert first.type == "gauge"
        began = {tuple(sorted(s.labels.items())): s.value for s in first.samples}
        assert sorted(began.values()) == [1_700_000_000.0, 1_700_000_060.0]
        assert {tuple(sorted(s.labels.items())) for s in counts} == set(began), metric_names


def test_physical_fields_never_appear_on_instance_series() -> None:
    families_ = {f.name: f for f in parse_text(_render("dcgm", "text/plain"))}
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_GPU_TEMP"):
        assert all("GPU_I_ID" not in s.labels for s in families_[name].samples), name
    tensor = families_["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples
    instance = [s for s in tensor if "GPU_I_ID" in s.labels]
    assert [(s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"], s.value) for s in instance] == [
        ("3", "3g.40gb", 0.5)
    ]


def test_native_names_use_base_units() -> None:
    families_ = {f.name: f for f in parse_text(_render("native", "text/plain"))}
    power = {s.labels["gpu"]: s.value for s in families_["gpu_agent_power_watts"].samples}
    assert power == {"0": 312.5, "1": 90.0}
    energy = families_["gpu_agent_energy_joules"]
    assert energy.type == "counter"
    assert next((s.name, s.value) for s in energy.samples) == (
        "gpu_agent_energy_joules_total",
        9876.543,
    )
    used = {
        s.labels.get("gpu_instance_id", "-"): s.value
        for s in families_["gpu_agent_memory_used_bytes"].samples
    }
    assert used == {"-": 3 * 1024**3, "3": 512 * 1024**2}
    info = families_["gpu_agent_gpu_info"].samples[0]
    assert info.labels["driver_version"] == "550.90.07"
    assert info.labels["node"] == "node-1"


def test_shared_instance_has_one_row_per_pod_and_no_duplicated_device_rows() -> None:
    families_ = {f.name: f for f in parse_text(_render("dcgm", "text/plain"))}
    pods = families_["gpu_agent_pod_memory_used_bytes"].samples
    on_gi3 = sorted((s.labels["pod"], s.value) for s in pods if s.labels.get("GPU_I_ID") == "3")
    assert on_gi3 == [("nb-7", 256 * 1024**2), ("nb-9", 128 * 1024**2)]
    fb = [s for s in families_["DCGM_FI_DEV_FB_USED"].samples if s.labels.get("GPU_I_ID") == "3"]
    assert len(fb) == 1 and "pod" not in fb[0].labels


def test_missing_values_are_omitted_not_zero() -> None:
    """GPU 1 has no FB_USED this tick: no sample, rather than a 0 (practice 8)."""
    families_ = {f.name: f for f in parse_text(_render("dcgm", "text/plain"))}
    fb = families_["DCGM_FI_DEV_FB_USED"].samples
    assert {(s.labels["gpu"], s.labels.get("GPU_I_ID")) for s in fb} == {("0", None), ("1", "3")}


def test_openmetrics_output_parses_and_ends_with_eof() -> None:
    for names in ("dcgm", "native"):
        text = _render(names, OPENMETRICS)
        assert text.endswith("# EOF\n")
        assert list(parse_om(text))


def test_before_the_first_snapshot_only_agent_metrics_are_served() -> None:
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: None, TelemetryStats())
    body, content_type = exporter.render("")
    assert content_type.startswith("text/plain")
    names = {f.name for f in parse_text(body.decode())}
    assert names == {
        "gpu_agent_collection_duration_seconds",
        "gpu_agent_scrape_duration_seconds",
        "gpu_agent_metrics_encodes",
    }


def test_same_snapshot_is_encoded_once_per_format() -> None:
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, TelemetryStats())
    first, _ = exporter.render("text/plain")
    second, _ = exporter.render("text/plain")
    assert first is second
    om, _ = exporter.render(OPENMETRICS)
    assert om is not first


def test_prerender_encodes_the_formats_scraped_lately() -> None:
    """The sampler thread encodes a new snapshot before the next scrape asks for it."""
    current = [SNAPSHOT]
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: current[0], TelemetryStats())
    exporter.render(OPENMETRICS)
    newer = replace(SNAPSHOT, taken_at=SNAPSHOT.taken_at + 1)
    exporter.prerender(newer)
    current[0] = newer
    body, _ = exporter.render(OPENMETRICS)
    assert exporter.render(OPENMETRICS)[0] is body
    assert b"1.70000000125e+09" in body


def test_handler_negotiates_and_records_scrape_duration() -> None:
    stats = TelemetryStats()
    ticks = iter([1.0, 1.002])
    exporter = MetricsExporter(
        COUNTERS, "native", lambda: SNAPSHOT, stats, clock=lambda: next(ticks)
    )
    response = asyncio.run(exporter.handle(Request("GET", "/metrics", {"accept": OPENMETRICS})))
    assert response.status == 200
    assert response.content_type.startswith("application/openmetrics-text")
    assert stats.view().scrape.count == 1
    assert stats.view().scrape.total == pytest.approx(0.002)


def test_family_order_is_stable() -> None:
    first = [f.name for f in families(SNAPSHOT, COUNTERS, native=False)]
    assert first == [f.name for f in families(SNAPSHOT, COUNTERS, native=False)]


def test_dcgm_names_take_the_rows_type_and_unserved_fields_say_why() -> None:
    """As dcgm-exporter: the CSV's type is the family's type, either way round. A selected field
    the agent does not serve has no series and one gpu_agent_dcgm_field_unserved sample."""
    counters = parse_counters(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, NVLink bandwidth\n"
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, gauge, Energy\n"
        "DCGM_FI_DEV_PSTATE, gauge, Performance state\n"
    )
    snapshot = replace(
        SNAPSHOT,
        entities=(EntitySample(Entity(GPU0), MappingProxyType({449: 12.5, 156: 1000.0})),),
    )
    body, _ = MetricsExporter(counters, "dcgm", lambda: snapshot, _stats()).render("text/plain")
    text = body.decode()
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION gauge\n" in text
    assert "DCGM_FI_DEV_PSTATE{" not in text
    (unserved,) = (f for f in parse_text(text) if f.name == "gpu_agent_dcgm_field_unserved")
    (sample,) = unserved.samples
    assert sample.labels == {
        "field": "DCGM_FI_DEV_PSTATE",
        "reason": "gpu-agent has no NVML reading for it yet",
    }
    assert sample.value == 1.0
    native, _ = MetricsExporter(counters, "native", lambda: snapshot, _stats()).render("text/plain")
    # Native names keep the field's true type: a rate is a gauge, energy a counter.
    assert "# TYPE gpu_agent_nvlink_bandwidth_bytes_per_second gauge\n" in native.decode()
    assert "# TYPE gpu_agent_energy_joules_total counter\n" in native.decode()
