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
import logging
import os
import signal
import sqlite3
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
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
from agent.doctor.service import REFRESH_S as DOCTOR_S
from agent.dra.detect import NO_API, configured
from agent.dra.metrics import AllocationCollector
from agent.dra.mode import AllocationMode
from agent.dra.republish import Republisher
from agent.dra.watch import AllocationSource, AllocationWatch
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.gpu import GpuDriver, load_driver
from agent.gpu.attach import DriverCollector, DriverLink, DriverState
from agent.health.device_taints import DeviceTaints
from agent.health.machine import Policy
from agent.health.metrics import HealthCollector
from agent.health.monitor import HealthMonitor
from agent.health.publish import NodePublisher
from agent.http import Handler, HttpServer, Request, Response
from agent.kube import InClusterKubeClient, KubeClient
from agent.kube_edge import KubeEdge, KubeEdgeCollector
from agent.loops import ExhaustionLog, call_soon_from_thread, exhaustion
from agent.mig.labels import MigLabelController, MigStateCollector
from agent.mig.lock import PartitionLock
from agent.mig.reset import command_reset, simulated_reset
from agent.mig.service import MigService
from agent.power import PowerService
from agent.preflight import listen_refusal, split_listen
from agent.prewarm.factory import build_service as build_prewarm
from agent.prewarm.inventory import PrewarmCollector
from agent.prewarm.labels import CLAIM as CACHE_LABELS
from agent.prewarm.labels import node_labels
from agent.prewarm.service import PrewarmService
from agent.reclaim import reclaim_marker
from agent.sharing import SharingService
from agent.state import StateStore
from agent.statedir import StateCollector, probe
from agent.telemetry.service import TelemetryService, build_telemetry
from agent.webconfig import MetricsGuard, ReloadingTls, WebConfig, load_web_config
from agent.wire.node import health_event_pb

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 20.0
"""Whole shutdown budget; Kubernetes' default terminationGracePeriodSeconds is 30."""
RPC_GRACE_S = 5.0
"""Of it, how long calls in flight may finish after the server stops accepting new ones."""
_CANCEL_AGAIN_S = 0.1
#: First wait before the driver is probed again; it doubles up to driver.retry_max_s.
_FIRST_RETRY_S = 0.25
RETRY_CHECK_S = 5.0
"""Longest wait between a prewarm retry falling due and it starting."""
#: How often the cache's labels are computed (local); the Node's owner writes only a change.
CACHE_LABELS_CHECK_S = 0.5
#: MIG labels are re-read from the watched Node without a change this often (a failed
#: config's retry; a read of the cache, no request); a change of the Node wakes it at once.
MIG_RESYNC_S = 60.0
#: How often the reclaimable-GPU mark is recomputed (it moves in hours; the write is rare).
RECLAIM_S = 60.0
#: How often the health marks are stated to the Node's owner (local; a change wakes it).
HEALTH_PUBLISH_S = 10.0
#: How long the start waits for the allocation mode's first list (then it is unknown until the
#: API server answers), and how often the mode is looked at without a change.
ALLOCATION_SYNC_S = 3.0
ALLOCATION_CHECK_S = 30.0
#: Modes under which MIG is not touched (agent.dra.gate).
REFUSING = (AllocationMode.UNKNOWN, AllocationMode.DRA_DYNAMIC_MIG)
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
    #: The read-only checks of every duty (agent/doctor): `gpu-agent doctor`, its gauge.
    doctor: Doctor | None = None
    #: The health marks on the Node, in a pod.
    health_publisher: NodePublisher | None = None
    #: The Kubernetes edge (shared informers, API versions, the Node's owner), in a pod.
    edge: KubeEdge | None = None

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
    driver = DriverLink(gpu, simulated=bool(config.simulate))
    # A state dir that takes no writes starts the agent read-only (agent/statedir.py).
    state = StateStore(config.state_dir / "agent.db", read_only=probe(config.state_dir))
    bus = EventBus()
    prewarm = build_prewarm(config.prewarm, state, proc_root=config.telemetry.proc_root)
    proc_root = None
    if config.simulate:
        from agent.gpu.sim import SimControl

        proc_root = SimControl(config.state_dir).proc_root  # the simulator's /proc look-alike
    client = InClusterKubeClient.in_pod()
    edge = KubeEdge.build(client, config.node_name) if client is not None else None
    kube: KubeClient | None = edge.labels_client() if edge is not None else None  # via the edge
    telemetry = build_telemetry(
        gpu,
        config.telemetry,
        hostname=config.node_name,
        proc_root=proc_root,
        state_dir=config.state_dir,
        kube=client,
        attach=False,  # once the driver is ready (Node._attach)
        slices=edge.slices() if edge is not None else None,
    )
    h = config.health
    health = HealthMonitor(
        Policy(h.degrade_events, h.degrade_window_s, h.hold_down_s, h.max_changes_per_hour),
        config.state_dir,
    )
    telemetry.on_xid(health.record_xid)
    telemetry.subscribe(health.observe)  # before the inventory: GetNode shows this tick's marks
    health.subscribe(lambda change: bus.publish(health=health_event_pb(change)))
    publisher = _health_publisher(edge, config, health)
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
    # Sharing reads the node's shape from the inventory: no NVML call per request.
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
    mig = MigService(
        gpu,
        state,
        PartitionLock(config.state_dir),
        reset,
        allocation=allocation.current,
        republish=republish,
    )
    inventory.watch_allocation(allocation.current, mig.mig_refusal)
    mig_labels = _mig_labels(config, kube, mig)
    doctor = build_doctor(config, driver, client, allocation.current, state, telemetry, health)
    _self_metrics(telemetry, driver, state, prewarm, health, mig_labels, allocation, doctor, edge)
    return Services(
        doctor=doctor,
        config=config,
        gpu=gpu,
        driver=driver,
        state=state,
        bus=bus,
        runner=OperationRunner(state, bus),
        inventory=inventory,
        sharing=sharing,
        prewarm=prewarm,
        telemetry=telemetry,
        mig=mig,
        power=PowerService(gpu, state),
        kube=kube,
        mig_labels=mig_labels,
        health=health,
        health_publisher=publisher,
        allocation=allocation,
        edge=edge,
    )


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
        #: Attaching and detaching run on worker threads, one at a time (and never beside the
        #: shutdown's stop of the GPU parts).
        self._gpu_parts = threading.Lock()
        #: Set by the shutdown's stop of the GPU parts: an attach whose thread starts after it
        #: (its task was cancelled, the thread was already queued) starts nothing.
        self._gpu_parts_stopped = False
        #: Set when the own Node changed, or the driver attached: the MIG label pass runs.
        self._mig_wake: asyncio.Event | None = None
        self._allocation_seen = NO_API
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
        cfg = s.config
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
        await asyncio.to_thread(self._prune)
        stack.push_async_callback(asyncio.to_thread, self._stop_gpu_parts)
        if missing is None:
            # The first snapshot is taken before GetNode serves: it never answers empty.
            await asyncio.to_thread(self._attach, False)
        else:
            s.inventory.driver_missing(missing.cause, missing.reason)
        await asyncio.to_thread(s.inventory.refresh_all)
        if s.state.read_only is None:
            await asyncio.to_thread(s.prewarm.start)
        else:  # its reconcile, queue and retries write the index
            s.state.note("the prewarm cache is listed as last recorded; nothing is fetched")
        stack.push_async_callback(asyncio.to_thread, s.prewarm.stop)
        if not self.embedded:
            host, port = split_listen(cfg.metrics_listen)
            try:
                self.metrics_port = await self.http.start(host, port)
            except OSError as exc:  # taken since serve's preflight
                raise listen_refusal("metrics_listen", cfg.metrics_listen, exc) from exc
            stack.push_async_callback(self.http.stop)
        api = s.api()
        server, self.ports, health = create_server(api, cfg)
        await server.start()
        stack.push_async_callback(self._stop_serving, server, health)
        await set_serving(health, True)
        self._guard("inventory", _restarting("inventory", s.inventory.run))
        self._mig_wake = changed = asyncio.Event()
        self._guard("driver", self._follow_driver(attached=missing is None))
        edge = s.edge if not self.embedded else None
        if edge is not None:
            # One watch of the own Node, read by every feature; its owner writes (kube_edge).
            edge.node_informer().add_handler(lambda: call_soon_from_thread(loop, changed.set))
            edge.start()
        if s.mig_labels is not None and not self.embedded:
            period = cfg.mig.label_poll_s if edge is None else MIG_RESYNC_S
            self._guard("mig-labels", _every(period, self._reconcile_mig_labels, changed))
        if edge is not None:
            self._guard("cache-labels", _every(CACHE_LABELS_CHECK_S, self._sync_cache_labels))
        if s.health_publisher is not None and not self.embedded:
            published = asyncio.Event()
            s.health_publisher.wake = lambda: call_soon_from_thread(loop, published.set)
            self._guard("health", _every(HEALTH_PUBLISH_S, s.health_publisher.sync, published))
        if edge is not None and cfg.telemetry.idle_reclaim_after_s > 0:
            marker = reclaim_marker(edge, cfg, s.inventory, s.telemetry)
            self._guard("reclaim", _every(RECLAIM_S, marker.mark))
        # Failed items come back when their retry is due; the agent owns the queue, so this
        # timer is all it takes (nothing else writes the queue).
        retry_every = min(cfg.prewarm.retry_initial_s, RETRY_CHECK_S)
        if s.state.read_only is None:
            self._guard(
                "prewarm-retries", _every(retry_every, s.prewarm.retry_due, wait_first=True)
            )
        self._guard("power", _every(cfg.driver.check_s, self._reconcile_power, wait_first=True))
        self._guard("prewarm-audit", _every(cfg.prewarm.audit_interval_s, self._audit_cache))
        prune = _every(cfg.operations.prune_interval_s, self._prune, wait_first=True)
        self._guard("prune-operations", prune)
        # Owners' series while no snapshot comes (docs/metrics.md, "What a scrape costs").
        self._guard("metrics", _every(cfg.telemetry.interval_s, s.telemetry.exporter.tick))
        if s.doctor is not None and not self.embedded:  # the log starts with its summary
            self._guard("doctor", _every(DOCTOR_S, s.doctor.refresh))
        stack.push_async_callback(self._cancel_tasks)
        self._ready = True  # before the line that says so: a reader of the log may probe /readyz
        if self.embedded:
            log.debug("embedded agent serving on %s", self.ports.socket)
            return
        self._say_serving(host, missing is None)

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
        changed = asyncio.Event()
        if watch is not None:
            loop = asyncio.get_running_loop()
            watch.on_change = lambda: call_soon_from_thread(loop, changed.set)
            watch.start()
            stack.callback(watch.stop)
            await asyncio.to_thread(watch.wait_synced, ALLOCATION_SYNC_S)
        self._allocation_seen = s.allocation.current()
        log.info("GPU allocation mode: %s", self._allocation_seen.describe())
        if watch is not None:
            self._guard("allocation", _every(ALLOCATION_CHECK_S, self._allocation_moved, changed))

    def _allocation_moved(self) -> None:
        """Show a changed mode; a MIG journal a refusing mode left alone is recovered once the
        mode allows it (e.g. unknown at the start, device-plugin once the API answered)."""
        s = self.services
        now, was = s.allocation.current(), self._allocation_seen
        s.inventory.refresh_allocation()
        if now.mode is was.mode:
            return
        self._allocation_seen = now
        log.warning("GPU allocation mode changed: %s (was %s)", now.describe(), was.mode.value)
        if s.driver.is_attached and was.mode in REFUSING and now.mode not in REFUSING:
            with self._gpu_parts:
                for outcome in s.mig.recover():
                    log.warning("MIG recovery once the allocation mode allowed it: %s", outcome)

    # -- the driver: attach when it is ready, detach when it goes away --------------------------

    async def _follow_driver(self, *, attached: bool) -> None:
        """Probe a missing driver with a capped back-off; while attached, check that it stays."""
        s = self.services
        settings = s.config.driver
        delay = _FIRST_RETRY_S
        while True:
            if not attached:
                await asyncio.sleep(min(delay, settings.retry_max_s))
                delay = min(delay * 2, settings.retry_max_s)
                if await asyncio.to_thread(s.driver.probe) is not None:
                    continue
                await asyncio.to_thread(self._attach, True)
                attached, delay = True, _FIRST_RETRY_S
                if self._mig_wake is not None:
                    self._mig_wake.set()  # a label set while the driver was away applies now
                continue
            await asyncio.sleep(settings.check_s)
            gone = await asyncio.to_thread(s.driver.check)
            if gone is not None:
                await asyncio.to_thread(self._detach, gone)
                attached = False

    def _attach(self, recover: bool) -> None:
        """With NVML open (a probe found GPUs): finish what a killed apply left (``recover``;
        at start `_recover` does), start reading the GPUs, then let GPU features in."""
        s = self.services
        with self._gpu_parts:
            if self._gpu_parts_stopped:
                return  # the agent is stopping: the sampler must not outlive the driver
            if recover and s.state.read_only is None:  # read-only: see `_recover_later`
                for outcome in s.mig.recover():
                    log.warning("MIG recovery after the driver attached: %s", outcome)
            s.power.reconcile()  # a reloaded driver forgot the power caps (docs/power.md)
            s.telemetry.attach()
            s.telemetry.start()
            s.inventory.refresh_gpus()
            gpus = len(s.inventory.layouts())
            s.driver.attached(gpus)
        log.info("NVIDIA driver attached: %d GPU(s); GPU features are available", gpus)

    def _detach(self, gone: DriverState) -> None:
        s = self.services
        with self._gpu_parts:
            s.telemetry.detach()
            s.driver.detached(gone)
            s.inventory.driver_missing(gone.cause, gone.reason)

    def _stop_gpu_parts(self) -> None:
        with self._gpu_parts:
            self._gpu_parts_stopped = True
            self.services.telemetry.stop()

    def _reconcile_power(self) -> None:
        if self.services.driver.is_attached:
            self.services.power.reconcile()

    def _reconcile_mig_labels(self) -> None:
        """The GPU Operator's MIG label protocol, only while the GPUs are attached: without
        them no state label is published (it would claim what nobody verified)."""
        s = self.services
        if s.mig_labels is not None and s.driver.is_attached:
            s.mig_labels.reconcile()

    async def _stop_serving(self, server: grpc.aio.Server, health: HealthServicer) -> None:
        s = self.services
        await set_serving(health, False)
        # Operations start checkpointing while the calls in flight finish.
        operations = asyncio.create_task(s.runner.shutdown(SHUTDOWN_GRACE_S - RPC_GRACE_S - 2))
        await server.stop(RPC_GRACE_S)
        await operations
        s.config.socket_path.unlink(missing_ok=True)

    def _audit_cache(self) -> None:
        """Re-check every ready item (blob on disk, image in the CRI), then republish labels."""
        s = self.services
        if s.state.read_only is None:  # an audit records what it finds
            s.prewarm.audit()
        if s.edge is not None and not self.embedded:
            self._sync_cache_labels()

    def _prune(self) -> None:
        """Bound the state database: done operations and request-id records by age and count."""
        retention = self.services.config.operations
        if self.services.state.read_only is not None:
            return
        try:
            gone = self.services.state.prune_operations(
                max_age_s=retention.max_age_s, keep_per_kind=retention.max_count
            )
        except sqlite3.Error as exc:  # e.g. the database busy past its timeout: next time
            log.warning("pruning operations failed, retrying later: %s", exc)
            return
        if gone:
            log.info("pruned %d done operation(s) and request-id record(s)", gone)

    def _sync_cache_labels(self) -> None:
        """``gpu-agent.io/cache.<name>=ready`` on this Node (cache-affinity scheduling), stated
        to the Node's owner: it writes only a change, and retries a failed write."""
        edge = self.services.edge
        if edge is not None:
            edge.owner.part(CACHE_LABELS).set(labels=node_labels(self.services.prewarm.items()))

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


async def _every(
    period_s: float,
    work: Callable[[], object],
    wake: asyncio.Event | None = None,
    *,
    wait_first: bool = False,
) -> None:
    """Run blocking ``work`` in a thread every ``period_s``, and at once when ``wake`` is set;
    a failed pass is logged and retried (the API server or a GPU may be briefly away), it does
    not stop the agent. ``wait_first``: the first pass comes a period after the start (it
    already ran once before serving)."""
    if wait_first:
        await asyncio.sleep(period_s)
    while True:
        try:
            await asyncio.to_thread(work)
        except (AgentError, OSError, MemoryError):
            log.exception("periodic %s failed; retrying in %.0fs", work, period_s)
        if wake is None:
            await asyncio.sleep(period_s)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), period_s)
        wake.clear()


_RESTART_MAX_S = 60.0


async def _restarting(name: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``start()``; when it fails because the process ran out of file descriptors or
    memory, log one line and start it again after a back-off (1 s, doubling to 60 s): load to
    shed, not a reason to stop the agent. Any other failure ends it as before."""
    delay = 1.0
    while True:
        try:
            await start()
            return
        except (OSError, MemoryError) as exc:
            what = exhaustion(exc)
            if what is None:
                raise
            log.warning("background task %s: %s; retrying in %.0fs", name, what, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, _RESTART_MAX_S)
