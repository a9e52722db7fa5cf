"""Composition root: builds every service from the config and owns start and stop.

One process, one asyncio loop: the gRPC API, the /metrics + /healthz HTTP server and the
inventory refresher run on it; blocking work runs in threads (telemetry sampler, prewarm
workers, operation workers). SIGTERM/SIGINT resolve one stop event; shutdown is staged, with a
deadline: stop serving, let operations checkpoint, stop the workers, close the store and the
driver.

Start order matters for honest operations: the previous process may have been killed in the
middle of long work. `Node._recover` runs before the API serves: the MIG service restores what
a killed apply left (from its journal) and the apply's operation records how it ended (finished,
rolled back, or failed with the reason); every other operation still pending or running is
failed as interrupted with the reason. None stays "running" forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1._async import HealthServicer

from agent.api import (
    ApiServices,
    EventBus,
    NodeInventory,
    OperationRunner,
    Ports,
    create_server,
    set_serving,
)
from agent.api.mig import interrupted_apply
from agent.api.operations import MIG_APPLY
from agent.config import AgentConfig
from agent.doctor import Doctor, build_doctor
from agent.dra.detect import configured
from agent.dra.metrics import AllocationCollector
from agent.dra.republish import Republisher
from agent.dra.watch import AllocationSource, AllocationWatch
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.gpu import GpuDriver, load_driver
from agent.gpu.attach import DriverCollector, DriverLink
from agent.health.device_taints import DeviceTaints
from agent.health.machine import Policy
from agent.health.metrics import HealthCollector
from agent.health.monitor import HealthMonitor
from agent.health.publish import NodePublisher
from agent.http import Handler, HttpServer, Request, Response
from agent.kube import InClusterKubeClient, KubeClient
from agent.kube_edge import KubeEdge, KubeEdgeCollector
from agent.loops import ExhaustionLog, call_soon_from_thread, every, restarting
from agent.mig.labels import MigLabelController, MigStateCollector
from agent.mig.lock import PartitionLock
from agent.mig.recovery import ModeFollower, recover_on_attach
from agent.mig.reset import command_reset, simulated_reset
from agent.mig.service import MigService
from agent.power import PowerService
from agent.preflight import listen_refusal, split_listen
from agent.prewarm.factory import build_service as build_prewarm
from agent.prewarm.inventory import PrewarmCollector
from agent.prewarm.labels import CacheLabels
from agent.prewarm.service import PrewarmService
from agent.reclaim import reclaim_tasks
from agent.sharing import SharingService
from agent.state import StateStore
from agent.statedir import StateCollector, probe
from agent.tasks import Need, Task
from agent.telemetry.service import TelemetryService, build_telemetry
from agent.webconfig import MetricsGuard, ReloadingTls, WebConfig, load_web_config
from agent.wire.node import health_event_pb

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 20.0
"""Whole shutdown budget; Kubernetes' default terminationGracePeriodSeconds is 30."""
RPC_GRACE_S = 5.0
"""Of it, how long calls in flight may finish after the server stops accepting new ones."""
_CANCEL_AGAIN_S = 0.1
#: How long the start waits for the allocation mode's first list (then it is unknown until the
#: API server answers).
ALLOCATION_SYNC_S = 3.0
INTERRUPTED_REASON = (
    "the agent stopped while this operation ran (killed or restarted) and could not resume it"
)


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
            *reclaim_tasks(self.edge, c, self.inventory, self.telemetry),
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
        state_dir=config.state_dir,
        kube=client,
        attach=False,  # once the driver is ready (DriverLink.attach)
        slices=edge.slices() if edge is not None else None,
    )
    health = _health(config, telemetry, bus)
    inventory = NodeInventory(
        bus,
        node_name=config.node_name,
        simulated_preset=config.simulate,
        cache=prewarm.inventory,
        xids=telemetry.xid_counts,
        telemetry=telemetry.latest,
        wake=telemetry.wake,
        fresh=telemetry.fresh,
        state=state.health,
        health=health.shown,
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
    allocation, republish = _allocation(config, kube, edge)
    sharing = SharingService(
        config.sharing,
        inventory.layouts,
        kube,
        node_name=config.node_name,
        allocation=allocation.current,
    )
    inventory.watch_sharing(sharing.show)
    reset = (
        simulated_reset(config.state_dir)
        if config.simulate
        else command_reset(config.mig.reset_command)
    )
    lock = PartitionLock(config.state_dir)
    mig = MigService(gpu, state, lock, reset, allocation=allocation.current, republish=republish)
    inventory.watch_allocation(allocation.current, mig.mig_refusal)
    power = PowerService(gpu, state)
    driver = _driver_link(config, gpu, mig, power, telemetry, inventory, state)
    mig_labels = _mig_labels(config, kube, mig)
    doctor = build_doctor(config, driver, client, allocation.current, state, telemetry, health)
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
        health_publisher=_health_publisher(edge, config, health),
        edge=edge,
        cache_labels=CacheLabels(edge.owner, prewarm.items) if edge is not None else None,
    )


def _sim_proc_root(config: AgentConfig) -> Path | None:
    if not config.simulate:
        return None
    from agent.gpu.sim import SimControl

    return SimControl(config.state_dir).proc_root  # the simulator's /proc look-alike


def _health(config: AgentConfig, telemetry: TelemetryService, bus: EventBus) -> HealthMonitor:
    h = config.health
    health = HealthMonitor(
        Policy(h.degrade_events, h.degrade_window_s, h.hold_down_s, h.max_changes_per_hour),
        config.state_dir,
    )
    telemetry.on_xid(health.record_xid)
    telemetry.subscribe(health.observe)  # before the inventory: GetNode shows this tick's marks
    health.subscribe(lambda change: bus.publish(health=health_event_pb(change)))
    return health


def _driver_link(
    config: AgentConfig,
    gpu: GpuDriver,
    mig: MigService,
    power: PowerService,
    telemetry: TelemetryService,
    inventory: NodeInventory,
    state: StateStore,
) -> DriverLink:
    """The driver's attach state, and the parts that attach and detach with it, in order: MIG
    finishes what a killed apply left before anything reads the GPUs, a reloaded driver gets
    back the power caps it forgot (docs/power.md), the sampler starts, the inventory lists."""
    driver = DriverLink(gpu, simulated=bool(config.simulate))
    driver.register(attach=recover_on_attach(mig, writable=state.read_only is None))
    driver.register(attach=lambda _: power.reconcile())

    def sample(_: bool) -> None:
        telemetry.attach()
        telemetry.start()

    driver.register(attach=sample, detach=lambda _: telemetry.detach(), stop=telemetry.stop)
    driver.register(
        attach=lambda _: inventory.refresh_gpus(),
        detach=lambda gone: inventory.driver_missing(gone.cause, gone.reason),
    )
    return driver


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
    publish("health", HealthCollector(health.shown), health.subscribe)
    if mig_labels is not None:
        publish("mig", MigStateCollector(mig_labels))
    publish("doctor", doctor, doctor.subscribe)
    if edge is not None:
        publish("kube", KubeEdgeCollector(edge))


def _health_publisher(
    edge: KubeEdge | None, config: AgentConfig, health: HealthMonitor
) -> NodePublisher | None:
    """In a pod, the health marks stated to the Node's owner, and the DRA device taints."""
    if edge is None:
        return None
    rules = DeviceTaints(
        edge.client.request,
        config.node_name,
        health.shown,
        health.device_uuids,
        slices=edge.slices().objects,
        rules=lambda: edge.apis.path("devicetaintrules"),
    )
    publisher = NodePublisher(
        edge.client, edge.owner, health.shown, taint=config.health.taint, device_taints=rules.sync
    )
    health.subscribe(publisher.on_change)
    return publisher


def _allocation(
    config: AgentConfig, kube: KubeClient | None, edge: KubeEdge | None
) -> tuple[AllocationSource, Republisher | None]:
    """The allocation mode's source (the config's mode, or detection over the API), and on a
    cluster the republisher a MIG apply on a ``dra`` node uses (agent.dra)."""
    dra = config.dra
    # A mode set in config needs no watch, except dra: its applies wait for the slices.
    if kube is None or edge is None or dra.mode not in ("auto", "dra"):
        return AllocationSource(configured(dra.mode, dra.driver), None), None
    watch = AllocationWatch(
        edge.client,
        config.node_name,
        dra.driver,
        slices=edge.slices(),
        node_informer=edge.node_informer(),
    )
    republish = Republisher(
        kube,
        watch,
        namespace=dra.plugin_namespace,
        label_selector=dra.plugin_label_selector,
        timeout_s=dra.republish_timeout_s,
    )
    return AllocationSource(configured(dra.mode, dra.driver), watch), republish


def _mig_labels(
    config: AgentConfig, kube: KubeClient | None, mig: MigService
) -> MigLabelController | None:
    settings = config.mig
    if not settings.watch_node_label:
        return None
    if settings.config_file is None:
        raise InvalidSpec(
            "mig.watch_node_label needs mig.config_file (the mig-parted configs the label names)",
            [FieldViolation("mig.config_file", "path of a mig-parted config file")],
        )
    if kube is None:
        raise InvalidSpec(
            "mig.watch_node_label needs the agent to run in a pod with a service account",
            [FieldViolation("mig.watch_node_label", "false outside Kubernetes")],
        )
    return MigLabelController(kube, config.node_name, mig, settings.config_file)


class Node:
    """The running agent."""

    def __init__(self, services: Services, *, embedded: bool = False) -> None:
        """``embedded``: inside another program (`agent.embedded`): the API on its socket only,
        no metrics/health HTTP server and no cluster duties (label controllers)."""
        self.services = services
        self.embedded = embedded
        self._stop = asyncio.Event()
        self._ready = False
        self._tasks: list[asyncio.Task[None]] = []
        routes = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": services.telemetry.exporter.handle,
        }
        web = services.config.metrics_web_config
        self.http = _metrics_server(
            routes,
            load_web_config(web) if web is not None else None,
            services.config.handshake_timeout_s,
        )
        self.metrics_port: int | None = None
        self.ports: Ports | None = None

    async def _healthz(self, _: Request) -> Response:
        return Response(200, b"ok\n")

    async def _readyz(self, _: Request) -> Response:
        """Ready once serving while at least one GPU answers: a lost GPU degrades the node (it
        is reported as lost), it does not take the others out of the Service.

        A driver that is not ready yet (or is being upgraded) is a state, not a failure: the
        API, prewarm and /metrics serve, so the agent stays ready and says what GPU features
        wait for (docs/operations.md, "The driver arrives late, or goes away")."""
        if not self._ready:
            return Response(503, b"starting\n")
        driver = self.services.driver.state
        if not driver.attached:
            return Response(
                200, f"ready; GPU features wait for the driver: {driver.reason}\n".encode()
            )
        if self.services.inventory.every_gpu_lost():
            return Response(503, b"no GPU answers\n")
        if self.services.state.read_only is not None:  # reads serve: still in the Service
            return Response(200, f"ready; read-only: {self.services.state.read_only}\n".encode())
        return Response(200, b"ready\n")

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def ready(self) -> bool:
        return self._ready

    def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a background task the agent owns; if it dies, log it and stop the agent."""

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task %s crashed; stopping the agent", name)
            else:
                log.error("background task %s ended early; stopping the agent", name)
            self.request_stop()

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    def _run(self, tasks: list[Task]) -> None:
        """The one runner: each task whose needs are met, on `every`, under `_guard`; a task
        that needs the driver skips its passes while the GPUs are detached."""
        s, loop = self.services, asyncio.get_running_loop()
        have = Need.DRIVER | (Need.WRITABLE if s.state.read_only is None else Need.NONE)
        if not self.embedded:
            have |= Need.LISTENER | (Need.KUBE if s.edge is not None else Need.NONE)
        for task in tasks:
            if task.needs & ~have:
                continue
            wake = None
            if task.wakes:
                wake = woken = asyncio.Event()
                for subscribe in task.wakes:
                    subscribe(functools.partial(call_soon_from_thread, loop, woken.set))
            work = task.work
            if Need.DRIVER in task.needs:
                work = functools.partial(_while_attached, s.driver, task.work)
            self._guard(
                task.name, every(task.name, task.period_s, work, wake, wait_first=task.wait_first)
            )

    async def _recover(self, attached: bool) -> None:
        """Before serving: let the MIG service restore what a killed apply left, record on the
        apply's operation how it ended, then fail whatever else was left pending or running.
        Without a driver (not ``attached``) the MIG journal waits for the attach."""
        s = self.services
        if s.state.read_only is not None:
            await asyncio.to_thread(self._recover_later)
            return
        outcomes = await asyncio.to_thread(s.mig.recover) if attached else ()
        left = await asyncio.to_thread(s.state.list_operations, kind=MIG_APPLY, done=False)
        for op in left:
            ended = await asyncio.to_thread(
                s.state.update_operation, op.id, **interrupted_apply(outcomes)
            )
            log.warning("operation %s (mig.apply) was interrupted: it %s", op.id, ended.state)
        failed = await asyncio.to_thread(s.state.mark_interrupted_operations, INTERRUPTED_REASON)
        for op in failed:
            log.warning("operation %s (%s) was interrupted by the last stop", op.id, op.kind)

    def _recover_later(self) -> None:
        """Read-only: recovery writes (the journal, the operations), so nothing is recovered;
        a MIG change cut short is said in the state's health (MIG changes are refused anyway,
        as every change is) and recovered at the first start with a writable state dir."""
        s = self.services
        if s.mig.interrupted():
            left = (
                "a MIG apply was cut short and its journal cannot be recovered (rolled back or "
                "forward) without writing: the GPUs may be between layouts until the agent "
                "restarts with a writable state dir"
            )
            log.error("%s", left)
            s.state.note(left)
        undone = s.state.list_operations(done=False)
        if undone:
            s.state.note(
                f"{len(undone)} operation(s) the last stop left unfinished are shown as they "
                "were recorded, until the agent can mark them interrupted"
            )

    async def run(
        self,
        *,
        handle_signals: bool = True,
        exit_if_stuck: bool = False,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Serve until SIGTERM/SIGINT or `request_stop`; ``handle_signals`` False lets tests run
        the agent on a thread (signal handlers need the main thread).

        A shutdown that overruns SHUTDOWN_GRACE_S logs what still runs. Only the process that
        is nothing but the agent (``serve``, ``exit_if_stuck``) then ends itself; an agent
        embedded in another program (the CLI, tests) raises instead and never ends its host.
        ``ready`` is called once the API serves.
        """
        loop = asyncio.get_running_loop()
        if not self.embedded:  # the host program's loop handler is the host's
            loop.set_exception_handler(ExhaustionLog())
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        stack = contextlib.AsyncExitStack()
        try:
            await self._start(stack)
            if ready is not None:
                ready()
            await self._stop.wait()
            log.info("stopping")
        finally:
            self._ready = False
            # Not wait_for: a shutdown past its deadline must still be running when it is
            # logged, so the log can say where it waits.
            closing = asyncio.ensure_future(_close(stack))
            done, _ = await asyncio.wait({closing}, timeout=SHUTDOWN_GRACE_S)
            if done:
                closing.result()
            else:
                _log_stuck(asyncio.current_task())
                closing.cancel()
                if exit_if_stuck:
                    log.error("shutdown took over %.0fs; exiting now", SHUTDOWN_GRACE_S)
                    os._exit(1)  # last resort: worker threads must not keep the process alive
                raise AgentError(
                    f"the agent's shutdown took over {SHUTDOWN_GRACE_S:.0f}s"
                ) from None

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        s = self.services
        loop = asyncio.get_running_loop()
        stack.callback(s.driver.close)
        stack.callback(s.state.close)
        s.bus.bind(loop)
        s.runner.bind(loop)
        # The driver is tried once before serving, so a node that has one serves with its GPUs
        # from the first call; one that has none yet serves everything else and attaches later.
        missing = await asyncio.to_thread(s.driver.probe)
        if s.edge is not None:  # the allocation's informers start before the owner
            stack.callback(s.edge.stop)
        await self._follow_allocation(stack)  # before recovery: the mode gates the MIG journal
        await self._recover(attached=missing is None)
        retention = s.config.operations
        await asyncio.to_thread(s.runner.prune, retention.max_age_s, retention.max_count)
        stack.push_async_callback(asyncio.to_thread, s.driver.stop)
        if missing is None:
            # The first snapshot is taken before GetNode serves: it never answers empty.
            await asyncio.to_thread(lambda: s.driver.attach(again=False, count=s.gpus))
        else:
            s.inventory.driver_missing(missing.cause, missing.reason)
        await asyncio.to_thread(s.inventory.refresh_all)
        if s.state.read_only is None:
            await asyncio.to_thread(s.prewarm.start)
        else:  # its reconcile, queue and retries write the index
            s.state.note("the prewarm cache is listed as last recorded; nothing is fetched")
        stack.push_async_callback(asyncio.to_thread, s.prewarm.stop)
        await self._serve(stack, attached=missing is None)

    async def _serve(self, stack: contextlib.AsyncExitStack, *, attached: bool) -> None:
        """Listen, then start the background tasks; the Node's owner starts once every task
        that reads the Node's watch has subscribed."""
        s, cfg = self.services, self.services.config
        host = ""
        if not self.embedded:
            host, port = split_listen(cfg.metrics_listen)
            try:
                self.metrics_port = await self.http.start(host, port)
            except OSError as exc:  # taken since serve's preflight
                raise listen_refusal("metrics_listen", cfg.metrics_listen, exc) from exc
            stack.push_async_callback(self.http.stop)
        server, self.ports, health = create_server(s.api(), cfg)
        await server.start()
        stack.push_async_callback(self._stop_serving, server, health)
        await set_serving(health, True)
        self._guard("inventory", restarting("inventory", s.inventory.run))
        follow = s.driver.follow(
            attached=attached,
            check_s=cfg.driver.check_s,
            retry_max_s=cfg.driver.retry_max_s,
            count=s.gpus,
        )
        self._guard("driver", follow)
        self._run(s.tasks())
        if s.edge is not None and not self.embedded:
            s.edge.start()  # one watch of the own Node, read by every feature; its owner writes
        stack.push_async_callback(self._cancel_tasks)
        self._ready = True  # before the line that says so: a reader of the log may probe /readyz
        if self.embedded:
            log.debug("embedded agent serving on %s", self.ports.socket)
            return
        self._say_serving(host, attached)

    def _say_serving(self, host: str, attached: bool) -> None:
        s, ports = self.services, self.ports
        assert ports is not None
        log.info(
            "agent serving: metrics %s:%d, gRPC %s, socket %s (%s, %s)",
            host,
            self.metrics_port,
            f"mTLS :{ports.tcp}" if ports.tcp else "TCP off",
            ports.socket,
            f"simulated node {s.config.simulate}" if s.config.simulate else "NVML",
            f"{len(s.inventory.layouts())} GPUs" if attached else "waiting for the driver",
        )

    # -- the allocation mode (docs/dra.md) -------------------------------------------------------

    async def _follow_allocation(self, stack: contextlib.AsyncExitStack) -> None:
        """Watch the facts the allocation mode is read from; wait (bounded) for their first
        list, so the start's MIG recovery sees the mode, then follow its changes."""
        s = self.services
        watch = s.allocation.watch
        if watch is not None:
            watch.start()
            stack.callback(watch.stop)
            await asyncio.to_thread(watch.wait_synced, ALLOCATION_SYNC_S)
        s.modes.start()
        self._run(s.modes.tasks())

    async def _stop_serving(self, server: grpc.aio.Server, health: HealthServicer) -> None:
        s = self.services
        await set_serving(health, False)
        # Operations start checkpointing while the calls in flight finish.
        operations = asyncio.create_task(s.runner.shutdown(SHUTDOWN_GRACE_S - RPC_GRACE_S - 2))
        await server.stop(RPC_GRACE_S)
        await operations
        s.config.socket_path.unlink(missing_ok=True)

    async def _cancel_tasks(self) -> None:
        pending = set(self._tasks)
        while pending:
            # Cancelled again until done: on Python 3.11 a cancel that lands as an inner
            # wait_for completes is swallowed, and the task's loop goes on (seen in the
            # inventory task: one shutdown in ~20 hung until its deadline).
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_CANCEL_AGAIN_S)


async def _close(stack: contextlib.AsyncExitStack) -> None:
    # Unwinds in reverse start order; a part that failed to start has nothing to stop. Then
    # the threads that blocking calls ran on: inside the deadline, so one stuck call is seen
    # and named here rather than holding up the exit with no word.
    await stack.aclose()
    await asyncio.get_running_loop().shutdown_default_executor()


def _log_stuck(current: asyncio.Task[Any] | None) -> None:
    """Name what kept the shutdown from ending: asyncio tasks, then threads with their frame."""
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        suspended = task.get_stack(limit=4)
        where = " < ".join(
            f"{f.f_code.co_name} ({f.f_code.co_filename}:{f.f_lineno})" for f in suspended
        )
        log.error("still running at shutdown: task %s in %s", task.get_name(), where or "?")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread is threading.current_thread():
            continue
        frame = frames.get(thread.ident or -1)
        stack = traceback.extract_stack(frame, limit=3) if frame else []
        where = " < ".join(f"{f.name} ({f.filename}:{f.lineno})" for f in reversed(stack))
        log.error("still running at shutdown: thread %s in %s", thread.name, where or "?")


def _metrics_server(
    routes: Mapping[str, Handler], web: WebConfig | None, handshake_timeout_s: float
) -> HttpServer:
    """/metrics behind the web config's TLS, client certificates and basic auth, when set."""
    if web is None:
        return HttpServer(routes)
    tls = ReloadingTls(web.tls).context if web.tls is not None else None
    return HttpServer(
        routes,
        tls=tls,
        handshake_timeout_s=handshake_timeout_s,
        guard=MetricsGuard(web),
        protected={"/metrics"},
    )


def _while_attached(driver: DriverLink, work: Callable[[], object]) -> None:
    if driver.is_attached:
        work()
