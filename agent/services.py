"""What the agent is built of: every service, made once from the config and wired together
(`build_services`), held as one `Services` object that the running node (agent/node.py) starts,
serves and stops. Each service declares its background work (`Services.tasks`) and registers
with the driver link what it does at attach and detach."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.api import ApiServices, EventBus, NodeInventory, OperationRunner
from agent.api.mig import recovered_rollbacks
from agent.config import AgentConfig
from agent.doctor import Doctor, build_doctor
from agent.dra.metrics import AllocationCollector
from agent.dra.source import allocation_source
from agent.dra.watch import AllocationSource
from agent.gpu import GpuDriver, load_driver
from agent.gpu.attach import DriverCollector, DriverLink
from agent.gpu.types import GpuInfo
from agent.health.boot import boot_id_reader
from agent.health.machine import Policy
from agent.health.metrics import HealthCollector
from agent.health.monitor import HealthMonitor
from agent.health.publish import NodePublisher, build_publisher
from agent.kube import InClusterKubeClient, KubeClient
from agent.kube_edge import KubeEdge, KubeEdgeCollector
from agent.loops import restarting
from agent.mig.labels import MigLabelController, MigStateCollector, label_controller
from agent.mig.lock import PartitionLock
from agent.mig.outcomes import unrolled_status
from agent.mig.recovery import ModeFollower, follow_driver
from agent.mig.reset import ResetFn, command_reset, simulated_reset
from agent.mig.service import MigService
from agent.power.service import PowerService
from agent.prewarm.factory import build_service as build_prewarm
from agent.prewarm.inventory import PrewarmCollector
from agent.prewarm.labels import CacheLabels
from agent.prewarm.service import PrewarmService
from agent.reclaim import reclaim_tasks
from agent.sharing import dra_kube
from agent.sharing.service import SharingService
from agent.state import StateStore
from agent.statedir import StateCollector, probe
from agent.tasks import Daemon, Task
from agent.telemetry.service import TelemetryService, build_telemetry
from agent.wire.node import health_event_pb

__all__ = ["Services", "build_services"]


@dataclass
class Services:
    """Everything the agent runs, built once and passed around as one object."""

    config: AgentConfig
    gpu: GpuDriver
    #: Whether the GPUs are attached: the one state every GPU feature checks.
    driver: DriverLink
    state: StateStore
    bus: EventBus
    runner: OperationRunner
    inventory: NodeInventory
    sharing: SharingService
    prewarm: PrewarmService
    telemetry: TelemetryService
    mig: MigService
    power: PowerService
    kube: KubeClient | None
    #: The GPU Operator's label protocol, when mig.watch_node_label is on.
    mig_labels: MigLabelController | None
    health: HealthMonitor
    #: The node's allocation mode (docs/dra.md): it gates every MIG change.
    allocation: AllocationSource
    modes: ModeFollower
    #: The read-only checks of every duty (agent/doctor): `gpu-agent doctor`, its gauge.
    doctor: Doctor | None = None
    #: The health marks on the Node, in a pod.
    health_publisher: NodePublisher | None = None
    #: The Kubernetes edge (shared informers, API versions, the Node's owner), in a pod.
    edge: KubeEdge | None = None
    #: The cache's labels on the Node (cache-affinity scheduling), in a pod.
    cache_labels: CacheLabels | None = None

    def gpus(self) -> int:
        return len(self.inventory.layouts())

    def daemons(self, *, attached: bool) -> list[Daemon]:
        """The loops that keep their own schedule: the inventory's refresher (restarted after
        a descriptor or memory shortage) and the driver's follower (``attached``: as the start
        found it)."""
        driver = self.config.driver
        follow = functools.partial(
            self.driver.follow,
            attached=attached,
            check_s=driver.check_s,
            retry_max_s=driver.retry_max_s,
            count=self.gpus,
        )
        refresh = functools.partial(restarting, "inventory", self.inventory.run)
        return [Daemon("inventory", refresh), Daemon("driver", follow)]

    def tasks(self) -> list[Task]:
        """Every service's background work; the node's runner starts what its needs allow."""
        c = self.config
        retention = c.operations
        found = [
            *self.runner.tasks(
                retention.prune_interval_s, retention.max_age_s, retention.max_count
            ),
            *self.prewarm.tasks(c.prewarm.audit_interval_s),
            *self.power.tasks(c.driver.check_s),
            *self.telemetry.tasks(c.telemetry.interval_s),
            *reclaim_tasks(self.edge, c, self.inventory, self.telemetry, self.health),
        ]
        if self.mig_labels is not None and self.edge is not None:
            wakes = (self.edge.node_informer().add_handler, self.driver.subscribe)
            found += self.mig_labels.tasks(*wakes)
        for owner in (self.cache_labels, self.health_publisher, self.doctor):
            found += owner.tasks() if owner is not None else []
        return found

    def api(self) -> ApiServices:
        return ApiServices(
            inventory=self.inventory,
            runner=self.runner,
            bus=self.bus,
            sharing=self.sharing,
            prewarm=self.prewarm,
            telemetry=self.telemetry.latest,
            mig=self.mig,
            power=self.power,
            gpu_guard=self.driver.require,
            metrics=lambda openmetrics: self.telemetry.exposition(openmetrics=openmetrics),
            doctor=self.doctor.run if self.doctor is not None else None,
        )


def build_services(config: AgentConfig, *, simulated_latency: bool = True) -> Services:
    """``simulated_latency``: the simulated driver models real NVML latencies, so timings
    while serving are honest (unless the config's ``simulate_latency`` is off); tests that need
    no timings turn it off to run at memory speed."""
    latency = simulated_latency and config.simulate_latency
    gpu = load_driver(config.simulate, config.state_dir, latency=latency)
    # A state dir that takes no writes starts the agent read-only (agent/statedir.py).
    state = StateStore(config.state_dir / "agent.db", read_only=probe(config.state_dir))
    bus = EventBus()
    prewarm = build_prewarm(config.prewarm, state, proc_root=config.telemetry.proc_root)
    client = InClusterKubeClient.in_pod()
    edge = KubeEdge.build(client, config.node_name) if client is not None else None
    telemetry = build_telemetry(
        gpu,
        config.telemetry,
        hostname=config.node_name,
        proc_root=_sim_proc_root(config),
        kube=client,
        attach=False,  # once the driver is ready (DriverLink.attach)
        slices=edge.slices() if edge is not None else None,
    )
    health = _health(config, telemetry, bus, state)
    inventory = NodeInventory(
        bus,
        node_name=config.node_name,
        simulated_preset=config.simulate,
        cache=prewarm.inventory,
        xids=telemetry.xid_counts,
        xid_unwatched=lambda: telemetry.xid_unwatched(answering=True),  # a lost GPU is said
        telemetry=telemetry.latest,
        wake=telemetry.wake,
        fresh=telemetry.fresh,
        state=state.health,
        health=health.shown,
        kube=edge.health if edge is not None else None,
    )
    telemetry.subscribe(inventory.refresh_gpus)  # GetNode follows every snapshot
    return _build_rest(config, gpu, state, bus, prewarm, client, edge, telemetry, health, inventory)


def _build_rest(
    config: AgentConfig,
    gpu: GpuDriver,
    state: StateStore,
    bus: EventBus,
    prewarm: PrewarmService,
    client: InClusterKubeClient | None,
    edge: KubeEdge | None,
    telemetry: TelemetryService,
    health: HealthMonitor,
    inventory: NodeInventory,
) -> Services:
    """The services over the node's shape (read from the inventory: no NVML call per request)."""
    kube: KubeClient | None = edge.labels_client() if edge is not None else None  # via the edge
    allocation, republish = allocation_source(config.dra, config.node_name, kube, edge)
    sim_proc = _sim_proc_root(config)  # a simulated agent is in its node's PID ns, wherever it is
    sharing = SharingService(
        config.sharing,
        inventory.layouts,
        kube,
        node_name=config.node_name,
        allocation=allocation.current,
        namespace_proc=sim_proc,
        gpus_unread=inventory.gpus_unread,
        gpus_lost=inventory.lost_gpus,
        gpus_not_read=inventory.unread_gpus,
        # Cluster-wide, watched from the first read: a node that never reads them holds none.
        device_classes=edge.informers.informer(dra_kube.PATH, dra_kube.QUERY) if edge else None,
    )
    inventory.watch_sharing(sharing.show)
    reset = _reset(config, health)
    lock = PartitionLock(config.state_dir)
    mig = MigService(
        gpu,
        state,
        lock,
        reset,
        allocation=allocation.current,
        republish=republish,
        tell_plugin=sharing.reload_for_mig_change,
        recovered=lambda outcomes: recovered_rollbacks(state, outcomes),
    )
    inventory.watch_allocation(allocation.current, mig.mig_refusal)
    inventory.watch_mig_journal(lambda: unrolled_status(mig.unrolled()))
    power = PowerService(gpu, state)
    # What attaches and detaches with the driver, in this order: MIG finishes a killed apply
    # before anything reads the GPUs, the power caps come back, the sampler, the inventory.
    driver = DriverLink(gpu, simulated=bool(config.simulate))
    follow_driver(driver, mig, writable=state.read_only is None)
    for part in (power, telemetry, inventory):
        part.follow(driver)
    m = config.mig
    mig_labels = label_controller(m.watch_node_label, m.config_file, kube, config.node_name, mig)
    doctor = build_doctor(
        config, driver, edge, allocation.current, state, telemetry, health, power, mig, sim_proc
    )
    _self_metrics(telemetry, driver, state, prewarm, health, mig_labels, allocation, doctor, edge)
    return Services(
        config,
        gpu,
        driver,
        state,
        bus,
        OperationRunner(state, bus),
        inventory,
        sharing,
        prewarm,
        telemetry,
        mig,
        power,
        kube,
        mig_labels,
        health,
        allocation,
        ModeFollower(allocation, mig, driver, inventory.refresh_allocation),
        doctor=doctor,
        health_publisher=_health_publisher(config, edge, health, driver),
        edge=edge,
        cache_labels=_cache_labels(config, edge, prewarm, telemetry),
    )


def _cache_labels(
    config: AgentConfig, edge: KubeEdge | None, prewarm: PrewarmService, telemetry: TelemetryService
) -> CacheLabels | None:
    """The cache's labels on the Node, in a pod; their published/withheld counts on /metrics."""
    if edge is None:
        return None
    labels = CacheLabels(edge.owner, prewarm.items, config.prewarm.max_node_labels)
    telemetry.exporter.publish_from("cache-labels", labels)
    return labels


def _reset(config: AgentConfig, health: HealthMonitor) -> ResetFn:
    """The configured GPU reset (the simulator's in simulated mode), telling the health marks
    when one is done: a mark whose action was a reset is then done with it."""
    chosen = (
        simulated_reset(config.state_dir)
        if config.simulate
        else command_reset(config.mig.reset_command)
    )

    def reset(gpu: GpuInfo) -> None:
        chosen(gpu)
        health.gpu_reset(gpu.uuid)

    return reset


def _sim_proc_root(config: AgentConfig) -> Path | None:
    if not config.simulate:
        return None
    from agent.gpu.sim import SimControl

    return SimControl(config.state_dir).proc_root  # the simulator's /proc look-alike


def _health(
    config: AgentConfig, telemetry: TelemetryService, bus: EventBus, state: StateStore
) -> HealthMonitor:
    h = config.health
    proc_root = _sim_proc_root(config) or config.telemetry.proc_root

    def saved(path: Path, error: OSError | None) -> None:
        lost = "a restart forgets the marks changed since (a failed GPU comes back healthy)"
        state.file_written(path, error, what="the health marks", lost=lost)

    health = HealthMonitor(
        Policy(h.degrade_events, h.degrade_window_s, h.hold_down_s, h.max_changes_per_hour),
        config.state_dir,
        boot_id=boot_id_reader(proc_root),
        saved=saved,
    )
    telemetry.on_xid(health.record_xid)
    telemetry.subscribe(health.observe)  # before the inventory: GetNode shows this tick's marks
    health.subscribe(lambda change: bus.publish(health=health_event_pb(change)))
    return health


def _driver_away(driver: DriverLink) -> Callable[[], str | None]:
    """Why the GPUs are not read now (the driver detached); None while they are."""

    def away() -> str | None:
        state = driver.state
        return None if state.attached else f"{state.cause}: {state.reason}"

    return away


def _health_publisher(
    config: AgentConfig, edge: KubeEdge | None, health: HealthMonitor, driver: DriverLink
) -> NodePublisher | None:
    publisher = build_publisher(
        edge,
        config.node_name,
        health,
        taint=config.health.taint,
        driver_away=_driver_away(driver),
    )
    if publisher is not None:
        driver.subscribe(lambda: publisher.wake())  # the Node says unknown at once, and back
    return publisher


def _self_metrics(
    telemetry: TelemetryService,
    driver: DriverLink,
    state: StateStore,
    prewarm: PrewarmService,
    health: HealthMonitor,
    mig_labels: MigLabelController | None,
    allocation: AllocationSource,
    doctor: Doctor,
    edge: KubeEdge | None,
) -> None:
    """The agent's own gauges beside the GPUs' on /metrics: each owner's record, read with each
    snapshot and on the agent's tick, at once when the owner tells a change; never on a scrape."""
    publish = telemetry.exporter.publish_from
    publish("allocation", AllocationCollector(allocation.current))
    publish("driver", DriverCollector(driver), driver.subscribe)
    publish("state", StateCollector(state.writable))
    publish("prewarm", PrewarmCollector(prewarm.inventory))
    away = _driver_away(driver)

    def health_changes(listener: Callable[..., None]) -> None:
        health.subscribe(listener)
        driver.subscribe(listener)  # detached: the series go; attached: they come back

    publish("health", HealthCollector(health.shown, away), health_changes)
    if mig_labels is not None:
        publish("mig", MigStateCollector(mig_labels))
    publish("doctor", doctor, doctor.subscribe)
    if edge is not None:
        publish("kube", KubeEdgeCollector(edge))
