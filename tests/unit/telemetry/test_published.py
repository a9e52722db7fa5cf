"""Everything /metrics serves is published ahead: owners' records are read on the publication
tick, the page is encoded once per change and shared by concurrent scrapes, a family name has
one owner, and the agent's own collection and scrape figures are series."""

from __future__ import annotations

import gzip
import http.client
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import Collector

from agent.errors import AgentError
from agent.telemetry import exporter as exporter_module
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.published import DuplicateFamily, Published
from agent.telemetry.stats import TelemetryStats
from tests.unit.telemetry.httpd import serve_metrics
from tests.unit.telemetry.test_exporter import COUNTERS, SNAPSHOT


class _Owner(Collector):
    """An owner whose state is read on each collect, as the agent's collectors read theirs."""

    def __init__(self, name: str, value: float = 1.0) -> None:
        self.name = name
        self.value = value
        self.reads = 0

    def collect(self) -> Iterator[Metric]:
        self.reads += 1
        family = GaugeMetricFamily(self.name, "An owner's gauge.")
        family.add_metric([], self.value)
        yield family


def test_a_family_name_registered_twice_is_refused_and_changes_nothing() -> None:
    published = Published()
    published.register("prewarm", ["gpu_agent_prewarm_cache_bytes"])
    with pytest.raises(DuplicateFamily, match=r"gpu_agent_prewarm_cache_bytes \(by prewarm\)"):
        published.register("mig", ["gpu_agent_mig_config_state", "gpu_agent_prewarm_cache_bytes"])
    assert published.owners() == {"gpu_agent_prewarm_cache_bytes": "prewarm"}
    with pytest.raises(DuplicateFamily, match="gpu_agent_x"):
        published.register("driver", ["gpu_agent_x", "gpu_agent_x"])


def test_an_owner_cannot_take_a_family_the_snapshot_renders() -> None:
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, TelemetryStats())
    for name in ("gpu_agent_gpu_up", "DCGM_FI_DEV_GPU_TEMP", "gpu_agent_scrape_duration_seconds"):
        with pytest.raises(DuplicateFamily, match=name):
            exporter.publish_from("rogue", _Owner(name))


def test_publishing_a_family_not_registered_is_refused() -> None:
    published = Published()
    published.register("health", ["gpu_agent_health_state"])
    with pytest.raises(AgentError, match="gpu_agent_other"):
        published.publish("health", list(_Owner("gpu_agent_other").collect()))


def test_a_record_changes_version_only_when_its_bytes_change() -> None:
    published = Published()
    owner = _Owner("gpu_agent_owned")
    published.poll("driver", owner)
    version = published.version
    assert not published.refresh()
    assert published.version == version
    owner.value = 0.0
    assert published.refresh()
    assert published.version == version + 1
    (record,) = published.latest()[1]
    assert record.text.endswith(b"gpu_agent_owned 0.0\n")
    assert not record.openmetrics.endswith(b"# EOF\n")


def test_owners_are_read_on_the_tick_never_on_a_scrape() -> None:
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, TelemetryStats())
    owner = _Owner("gpu_agent_owned", 2.0)
    exporter.publish_from("prewarm", owner)
    reads = owner.reads
    for _ in range(20):
        body, _ = exporter.render("text/plain")
    assert owner.reads == reads
    assert b"\ngpu_agent_owned 2.0\n" in body
    owner.value = 3.0
    exporter.refresh()  # the agent's publication tick
    assert owner.reads == reads + 1
    assert b"\ngpu_agent_owned 3.0\n" in exporter.render("text/plain")[0]


def test_a_failing_owner_keeps_its_last_record_and_the_others_publish() -> None:
    class Broken(_Owner):
        def collect(self) -> Iterator[Metric]:
            if self.reads:
                raise OSError(5, "Input/output error")
            yield from super().collect()

    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, TelemetryStats())
    exporter.publish_from("state", Broken("gpu_agent_broken", 7.0))
    healthy = _Owner("gpu_agent_healthy", 1.0)
    exporter.publish_from("driver", healthy)
    healthy.value = 4.0
    exporter.refresh()
    body = exporter.render("text/plain")[0]
    assert b"\ngpu_agent_broken 7.0\n" in body
    assert b"\ngpu_agent_healthy 4.0\n" in body


def test_fifty_concurrent_scrapes_share_one_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page is stale (a new snapshot, not pre-encoded) when 50 gzip scrapes arrive at once:
    the encode is held until all 50 have reached the handler, so each one sees it in flight;
    they all get the same bytes from one encode, and the event loop keeps serving meanwhile."""
    stats = TelemetryStats()
    current = [SNAPSHOT]
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: current[0], stats)
    arrived = threading.Semaphore(0)
    release = threading.Event()
    real_families = exporter_module.families

    def held_families(*args: object, **kwargs: object) -> list[Metric]:
        release.wait(30)
        return real_families(*args, **kwargs)  # type: ignore[arg-type]

    handle = exporter.handle

    async def counting(request: object) -> object:
        arrived.release()
        return await handle(request)  # type: ignore[arg-type]

    exporter.handle = counting  # type: ignore[assignment,method-assign]
    monkeypatch.setattr(exporter_module, "families", held_families)
    current[0] = replace(SNAPSHOT, taken_at=SNAPSHOT.taken_at + 1)
    before = stats.view().encodes
    with serve_metrics(exporter) as port, ThreadPoolExecutor(50) as pool:
        scrapes = [pool.submit(_scrape_gzip, port) for _ in range(50)]
        for _ in range(50):
            assert arrived.acquire(timeout=30)
        release.set()
        bodies = [s.result(timeout=30) for s in scrapes]
    assert stats.view().encodes - before == 1
    assert len(set(bodies)) == 1
    assert b"1.70000000125e+09" in gzip.decompress(bodies[0])


def _scrape_gzip(port: int) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        assert response.getheader("Content-Encoding") == "gzip"
        return response.read()
    finally:
        connection.close()


def test_scrapes_of_an_unchanged_page_encode_nothing() -> None:
    stats = TelemetryStats()
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, stats)
    with serve_metrics(exporter) as port:
        _scrape_gzip(port)
        before = stats.view().encodes
        for _ in range(30):
            _scrape_gzip(port)
    assert stats.view().encodes == before


def test_self_metrics_name_each_source_its_age_and_the_scrape() -> None:
    stats = TelemetryStats()
    stats.observe_source("devices", 0.004, at=1_700_000_000.0)
    stats.observe_source("kubelet", 0.02, at=1_700_000_001.0)
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: SNAPSHOT, stats)
    with serve_metrics(exporter) as port:
        _scrape_gzip(port)
    exporter.refresh()
    exporter.prerender(replace(SNAPSHOT, taken_mono=SNAPSHOT.taken_mono + 1))
    body, _ = exporter.render("text/plain")
    found = {f.name: f for f in parse_text(body.decode())}
    durations = found["gpu_agent_collection_source_duration_seconds"].samples
    counts = {s.labels["source"]: s.value for s in durations if s.name.endswith("_count")}
    assert counts == {"devices": 1.0, "kubelet": 1.0}
    ages = found["gpu_agent_collection_source_timestamp_seconds"].samples
    assert {s.labels["source"]: s.value for s in ages} == {
        "devices": 1_700_000_000.0,
        "kubelet": 1_700_000_001.0,
    }
    assert found["gpu_agent_scrape_duration_seconds"].samples[-2].value >= 1.0  # the count
    assert found["gpu_agent_metrics_encodes"].samples[0].value >= 1.0


def test_the_page_follows_a_new_snapshot_without_a_scrape_encoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampler thread pre-encodes (identity and gzip) what scrapes asked for lately."""
    stats = TelemetryStats()
    current = [SNAPSHOT]
    exporter = MetricsExporter(COUNTERS, "dcgm", lambda: current[0], stats)
    with serve_metrics(exporter) as port:
        _scrape_gzip(port)
        newer = replace(SNAPSHOT, taken_at=SNAPSHOT.taken_at + 2, taken_mono=time.monotonic())
        exporter.prerender(newer)
        current[0] = newer
        encodes = stats.view().encodes
        body = gzip.decompress(_scrape_gzip(port))
    assert stats.view().encodes == encodes
    assert b"1.70000000225e+09" in body
