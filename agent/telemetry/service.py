"""Builds the telemetry parts from the agent config and runs them: the /metrics exporter for the
agent's life, and beneath it, while the driver is attached, the collection (sampler, XID and pod
threads, the optional DCGM profiling backend)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config import TelemetrySettings
from agent.errors import AgentError
from agent.gpu.attach import DriverLink
from agent.gpu.nvml import GpuDriver
from agent.gpu.readings import NodeReader
from agent.gpu.xid_events import XidEvent
from agent.tasks import Task
from agent.telemetry.dcgm_backend import ProfilingBackend, load_dcgm_backend
from agent.telemetry.dra import DraDevices, DraSlicesCollector
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.procs import ContainerDirectory
from agent.telemetry.readers import Sources, build_sampler
from agent.telemetry.sampler import Sampler, SamplerOptions
from agent.telemetry.snapshot import Snapshot
from agent.telemetry.stats import TelemetryStats
from agent.telemetry.xid import XidWatcher
from dcgm.counters import CounterSet, load_counters
from dcgm.fields import Gpm

if TYPE_CHECKING:  # given only on a node in a cluster
    from agent.kube import InClusterKubeClient
    from agent.kube_watch import Informer

log = logging.getLogger(__name__)

__all__ = ["Collection", "TelemetryService", "build_telemetry"]

#: kubelet's per-container log links, which name each container id's pod (procs.py)
_MIN_POD_REFRESH_S = 1.0  # kubelet rate-limits PodResources; once a second is plenty
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclass
class Collection:
    """What reads the GPUs while the driver is attached: built per attachment, since NVML's
    handles, event sets and GPM samples do not outlive an nvmlShutdown."""

    sampler: Sampler
    xids: XidWatcher
    pods: PodWatcher | None
    profiling: ProfilingBackend | None = None


class TelemetryService:
    """The /metrics exporter and its statistics, for the agent's whole life, and the GPU
    collection beneath them while the driver is attached (`attach` / `detach`); without one,
    a scrape serves the agent's own series and no GPU's."""

    def __init__(
        self,
        exporter_of: Callable[[Callable[[], Snapshot | None]], MetricsExporter],
        stats: TelemetryStats,
        collect: Callable[[], Collection],
        dra: DraDevices | None = None,
    ) -> None:
        self.stats = stats
        self.exporter = exporter_of(self.latest)
        self._collect = collect
        #: this node's DRA devices, watched while the collection runs (None: no API server)
        self.dra = dra
        self._collection: Collection | None = None
        self._subscribers: list[Callable[[Snapshot], None]] = [self.exporter.prerender]
        self._xid_listeners: list[Callable[[XidEvent], None]] = []

    @property
    def sampler(self) -> Sampler:
        """The attached collection's sampler (AgentError while detached)."""
        return self._attached().sampler

    @property
    def xids(self) -> XidWatcher:
        return self._attached().xids

    def _attached(self) -> Collection:
        collection = self._collection
        if collection is None:
            raise AgentError("telemetry is not attached to a driver")
        return collection

    def tasks(self, interval_s: float) -> list[Task]:
        """Owners' series while no snapshot comes (docs/metrics.md, "What a scrape costs")."""
        return [Task("metrics", self.exporter.tick, interval_s)]

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call ``callback`` with every snapshot, of this collection and the later ones."""
        self._subscribers.append(callback)
        if self._collection is not None:
            self._collection.sampler.subscribe(callback)

    def on_xid(self, listener: Callable[[XidEvent], None]) -> None:
        """Hand every XID of this collection and the later ones to ``listener``."""
        self._xid_listeners.append(listener)
        if self._collection is not None:
            self._collection.xids.listen(listener)

    def follow(self, link: DriverLink) -> None:
        """Sample while the driver is attached; never past the agent's stop."""

        def attach(_: bool) -> None:
            self.attach()
            self.start()

        link.register(attach=attach, detach=lambda _: self.detach(), stop=self.stop)

    def attach(self) -> None:
        """Build the collection over the (open) driver; nothing runs until `start`."""
        collection = self._collect()
        for callback in self._subscribers:
            collection.sampler.subscribe(callback)
        for listener in self._xid_listeners:
            collection.xids.listen(listener)
        self._collection = collection

    def start(self) -> None:
        """Start the collection's threads; returns after the first snapshot is published."""
        collection = self._attached()
        collection.xids.start()
        if self.dra is not None:
            self.dra.start()
        if collection.pods is not None:
            collection.pods.start()
        collection.sampler.start()

    def stop(self) -> None:
        collection = self._collection
        if collection is None:
            return
        collection.sampler.stop()
        if collection.pods is not None:
            collection.pods.stop()
        if self.dra is not None:
            self.dra.stop()
        collection.xids.stop()

    def detach(self) -> None:
        """Stop the collection and drop it: GPU series go, the agent's own stay."""
        self.stop()
        self._collection = None

    # -- reads (any thread) ----------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        collection = self._collection
        return collection.sampler.latest() if collection is not None else None

    def wake(self) -> None:
        collection = self._collection
        if collection is not None:
            collection.sampler.wake()

    def fresh(self) -> bool:
        collection = self._collection
        return collection.sampler.fresh() if collection is not None else False

    def xid_counts(self) -> Mapping[tuple[int, int | None, int], int]:
        """XIDs since the agent started per (GPU, GPU instance or None, XID); a destroyed
        instance's key goes (its XIDs are not new ones on the GPU)."""
        collection = self._collection
        return collection.xids.state().counts if collection is not None else {}

    def xid_totals(self) -> Mapping[tuple[int, int | None, int], int]:
        """Every XID since the agent started, once: :meth:`xid_counts` with a destroyed
        instance's under its GPU (None)."""
        collection = self._collection
        return collection.xids.state().totals() if collection is not None else {}

    def xid_unwatched(self, *, answering: bool = False) -> str | None:
        """Why XID events are not watched now, whatever the counters select: the event set
        broken, or the GPUs that deliver none; None while every GPU's are (or no driver).
        ``answering``: leave out the GPUs that did not answer when the set opened (lost, said
        as such elsewhere; or registered at the next tick)."""
        collection = self._collection
        if collection is None:
            return None
        state = collection.xids.state()
        if state.broken is not None:
            return state.broken
        gpus = "; ".join(
            f"GPU {i}: {why}"
            for i, why in sorted(state.unsupported.items())
            if not (answering and i in state.unreachable)
        )
        return gpus or None

    def exposition(self, *, openmetrics: bool) -> tuple[bytes, str]:
        """What a /metrics scrape returns now: (body, content type)."""
        return self.exporter.render(OPENMETRICS if openmetrics else "text/plain")


def build_telemetry(
    driver: GpuDriver,
    settings: TelemetrySettings,
    *,
    hostname: str,
    proc_root: Path | None = None,
    attribute_pods: bool = True,
    kube: InClusterKubeClient | None = None,
    attach: bool = True,
    slices: Informer | None = None,
) -> TelemetryService:
    """Wire telemetry for one driver. Raises InvalidSpec for a bad counters CSV.

    ``proc_root`` overrides ``settings.proc_root`` (the simulator keeps its own /proc look-alike).
    ``kube``, ``slices``: the API server (in a pod) and the agent's shared informer of the
    ResourceSlices that name DRA claims' devices. ``attach``: build the collection now (the
    driver is open); the agent attaches later, when the driver is ready (`.attach`).
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
    dra = DraDevices(kube, hostname, informer=slices) if kube and attribute_pods else None

    def collect() -> Collection:
        reader = NodeReader(driver)
        prof_ids = [c.field.id for c in counters.values if isinstance(c.field.source, Gpm)]
        needs_dcgm = prof_ids and not all(_has_gpm(reader, g.index) for g in reader.gpus())
        profiling = load_dcgm_backend(prof_ids, settings.interval_s) if needs_dcgm else None
        pods = None
        if attribute_pods:
            socket, period = settings.kubelet_socket, max(settings.interval_s, _MIN_POD_REFRESH_S)
            client = PodResourcesClient(socket)
            pods = PodWatcher(client, socket, period, stats, dra, in_cluster=kube is not None)
        xids = XidWatcher.for_reader(reader, stats)
        options = SamplerOptions(
            interval_s=settings.interval_s,
            idle_threshold_percent=settings.idle_threshold_percent,
            hostname=hostname,
            proc_root=proc_root or settings.proc_root,
        )
        containers = ContainerDirectory(settings.container_log_dir)
        sources = Sources(xids, pods, dra if pods is not None else None, profiling, containers)
        sampler = build_sampler(reader, counters, stats, options, sources)
        return Collection(sampler, xids, pods, profiling)

    def exporter_of(latest: Callable[[], Snapshot | None]) -> MetricsExporter:
        return _exporter(counters, settings, latest, stats, dra)

    service = TelemetryService(exporter_of, stats, collect, dra)
    if attach:
        service.attach()
    return service


def _exporter(
    counters: CounterSet,
    settings: TelemetrySettings,
    latest: Callable[[], Snapshot | None],
    stats: TelemetryStats,
    dra: DraDevices | None,
) -> MetricsExporter:
    exporter = MetricsExporter(
        counters,
        settings.metric_names,
        latest,
        stats,
        devices=settings.devices,
        tick_s=settings.interval_s,
    )
    if dra is not None:
        exporter.publish_from("dra", DraSlicesCollector(dra), dra.subscribe)
    return exporter


def _has_gpm(reader: NodeReader, gpu: int) -> bool:
    try:
        return reader.gpm_supported(gpu)
    except AgentError:
        # A GPU lost at start (the sampler marks it down), or whose probe failed: DCGM is
        # loaded in case it has no GPM; the sampler asks NVML again each tick.
        return False
