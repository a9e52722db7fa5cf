"""Builds the telemetry parts from the agent config and runs them: sampler, XID and pod threads,
the optional DCGM profiling backend and the /metrics exporter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.config import TelemetrySettings
from agent.errors import AgentError
from agent.gpu.nvml import GpuDriver
from agent.gpu.readings import NodeReader
from agent.telemetry.dcgm_backend import load_dcgm_backend
from agent.telemetry.dra import DraDevices, Get
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.sampler import ProfilingBackend, Sampler, SamplerOptions
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.xid import XidWatcher
from dcgm.counters import load_counters
from dcgm.fields import Gpm

log = logging.getLogger(__name__)

__all__ = ["TelemetryService", "build_telemetry"]

#: kubelet's per-container log links, which name each container id's pod (procs.py)
_MIN_POD_REFRESH_S = 1.0  # kubelet rate-limits PodResources; once a second is plenty
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclass
class TelemetryService:
    sampler: Sampler
    exporter: MetricsExporter
    stats: TelemetryStats
    xids: XidWatcher
    pods: PodWatcher | None
    profiling: ProfilingBackend | None = None

    def start(self) -> None:
        """Start the threads; returns after the first snapshot is published."""
        self.xids.start()
        if self.pods is not None:
            self.pods.start()
        self.sampler.start()

    def exposition(self, *, openmetrics: bool) -> tuple[bytes, str]:
        """What a /metrics scrape returns now: (body, content type)."""
        return self.exporter.render(OPENMETRICS if openmetrics else "text/plain")

    def stop(self) -> None:
        self.sampler.stop()
        if self.pods is not None:
            self.pods.stop()
        self.xids.stop()


def build_telemetry(
    driver: GpuDriver,
    settings: TelemetrySettings,
    *,
    hostname: str,
    proc_root: Path | None = None,
    attribute_pods: bool = True,
    state_dir: Path | None = None,
    kube_get: Get | None = None,
) -> TelemetryService:
    """Wire telemetry for one driver. Raises InvalidSpec for a bad counters CSV.

    ``proc_root`` overrides ``settings.proc_root`` (the simulator keeps its own /proc look-alike).
    ``state_dir``: where idle times survive restarts (the agent's; one-shot commands pass none).
    ``kube_get``: an API-server GET (in a pod), for DRA claims' devices from ResourceSlices.
    """
    counters = load_counters(settings.collectors)
    for counter in counters.counters:
        if counter.mistyped:
            log.info(
                "%s line %d: %s is a %s, exported as the %s its row declares",
                counters.source,
                counter.line,
                counter.name,
                counter.field.kind.value,
                counter.declared,
            )
    for note in counters.notes:
        log.warning("%s", note)
    for unserved in counters.unserved:
        log.warning(
            "%s line %d: %s is not served (no series; gpu_agent_dcgm_field_unserved): %s",
            counters.source,
            unserved.line,
            unserved.name,
            unserved.reason,
        )
    stats = TelemetryStats()
    reader = NodeReader(driver)
    prof_ids = [c.field.id for c in counters.values if isinstance(c.field.source, Gpm)]
    needs_dcgm = prof_ids and not all(_has_gpm(reader, g.index) for g in reader.gpus())
    profiling = load_dcgm_backend(prof_ids, settings.interval_s) if needs_dcgm else None
    pods = None
    if attribute_pods:
        socket = settings.kubelet_socket
        period = max(settings.interval_s, _MIN_POD_REFRESH_S)
        dra = DraDevices(kube_get, hostname) if kube_get is not None else None
        pods = PodWatcher(PodResourcesClient(socket), socket, period, stats, dra)
    xids = XidWatcher.for_reader(reader, stats)
    sampler = Sampler(
        reader,
        counters,
        stats,
        SamplerOptions(
            interval_s=settings.interval_s,
            idle_threshold_percent=settings.idle_threshold_percent,
            hostname=hostname,
            proc_root=proc_root or settings.proc_root,
            idle_file=state_dir / "telemetry-idle.json" if state_dir is not None else None,
        ),
        pods=pods,
        containers=ContainerDirectory(settings.container_log_dir),
        xids=xids,
        profiling=profiling,
    )
    exporter = MetricsExporter(
        counters, settings.metric_names, sampler.latest, stats, devices=settings.devices
    )
    sampler.subscribe(exporter.prerender)
    return TelemetryService(sampler, exporter, stats, xids, pods, profiling)


def _has_gpm(reader: NodeReader, gpu: int) -> bool:
    try:
        return reader.gpm_supported(gpu)
    except AgentError:
        return False  # a GPU lost at start: the sampler marks it down
