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
from collections.abc import Callable, Coroutine
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
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.gpu import GpuDriver, open_driver
from agent.http import HttpServer, Request, Response
from agent.kube import InClusterKubeClient, KubeClient, NodeWatch
from agent.mig.labels import MigLabelController, MigStateCollector
from agent.mig.lock import PartitionLock
from agent.mig.reset import command_reset, simulated_reset
from agent.mig.service import MigService
from agent.prewarm.factory import build_service as build_prewarm
from agent.prewarm.inventory import PrewarmCollector, label_patch
from agent.prewarm.service import PrewarmService
from agent.reclaim import reclaim_marker
from agent.sharing import SharingService
from agent.state import StateStore
from agent.telemetry.service import TelemetryService, build_telemetry

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 20.0
"""Whole shutdown budget; Kubernetes' default terminationGracePeriodSeconds is 30."""
RPC_GRACE_S = 5.0
"""Of it, how long calls in flight may finish after the server stops accepting new ones."""
CACHE_LABELS_S = 10.0
#: With the own Node watched, MIG labels are re-read without a change this often (a failed
#: config's retry); a change of the Node wakes the controller at once.
MIG_RESYNC_S = 60.0
#: How often the reclaimable-GPU mark is recomputed (it moves in hours; the write is rare).
RECLAIM_S = 60.0
"""How often the cache inventory is published as node labels."""
PREWARM_QUEUE_S = 5.0
"""How often the prewarm queue in the shared database is looked at for new items."""
INTERRUPTED_REASON = (
    "the agent stopped while this operation ran (killed or restarted) and could not resume it"
)


@dataclass
class Services:
    """Everything the agent runs, built once and passed around as one object."""

    config: AgentConfig
    gpu: GpuDriver
    state: StateStore
    bus: EventBus
    runner: OperationRunner
    inventory: NodeInventory
    sharing: SharingService
    prewarm: PrewarmService
    telemetry: TelemetryService
    mig: MigService
    kube: KubeClient | None
    #: The GPU Operator's label protocol, when mig.watch_node_label is on.
    mig_labels: MigLabelController | None

    def api(self) -> ApiServices:
        return ApiServices(
            inventory=self.inventory,
            runner=self.runner,
            bus=self.bus,
            sharing=self.sharing,
            prewarm=self.prewarm,
            telemetry=self.telemetry.sampler.latest,
            mig=self.mig,
        )


def build_services(config: AgentConfig, *, simulated_latency: bool = True) -> Services:
    """``simulated_latency``: the simulated driver models real NVML latencies, so timings
    while serving are honest; tests that need no timings turn it off to run at memory speed."""
    gpu = open_driver(config.simulate, config.state_dir, latency=simulated_latency)
    state = StateStore(config.state_dir / "agent.db")
    bus = EventBus()
    prewarm = build_prewarm(config.prewarm, config.state_dir / "agent.db")
    proc_root = None
    if config.simulate:
        from agent.gpu.sim import SimControl

        proc_root = SimControl(config.state_dir).proc_root  # the simulator's /proc look-alike
    telemetry = build_telemetry(
        gpu, config.telemetry, hostname=config.node_name, proc_root=proc_root
    )
    inventory = NodeInventory(
        gpu,
        bus,
        node_name=config.node_name,
        simulated_preset=config.simulate,
        cache=prewarm.inventory,
        xids=lambda: telemetry.xids.state().counts,
        telemetry=telemetry.sampler.latest,
    )
    # Sharing reads the node's shape from the inventory: no NVML call per request.
    kube: KubeClient | None = InClusterKubeClient.in_pod()
    sharing = SharingService(config.sharing, inventory.layouts, kube, node_name=config.node_name)
    inventory.watch_sharing(sharing.show)
    reset = (
        simulated_reset(config.state_dir)
        if config.simulate
        else command_reset(config.mig.reset_command)
    )
    mig = MigService(gpu, state, PartitionLock(config.state_dir), reset)
    telemetry.exporter.add_collector(PrewarmCollector(prewarm.inventory))
    mig_labels = _mig_labels(config, kube, mig)
    if mig_labels is not None:
        telemetry.exporter.add_collector(MigStateCollector(mig_labels))
    return Services(
        config=config,
        gpu=gpu,
        state=state,
        bus=bus,
        runner=OperationRunner(state, bus),
        inventory=inventory,
        sharing=sharing,
        prewarm=prewarm,
        telemetry=telemetry,
        mig=mig,
        kube=kube,
        mig_labels=mig_labels,
    )


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

    def __init__(self, services: Services) -> None:
        self.services = services
        self._stop = asyncio.Event()
        self._ready = False
        self._node_watch: NodeWatch | None = None
        self._tasks: list[asyncio.Task[None]] = []
        routes = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": services.telemetry.exporter.handle,
        }
        self.http = HttpServer(routes)
        self.metrics_port: int | None = None
        self.ports: Ports | None = None

    async def _healthz(self, _: Request) -> Response:
        return Response(200, b"ok\n")

    async def _readyz(self, _: Request) -> Response:
        return Response(200, b"ready\n") if self._ready else Response(503, b"starting\n")

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

    async def _recover(self) -> None:
        """Before serving: let the MIG service restore what a killed apply left, record on the
        apply's operation how it ended, then fail whatever else was left pending or running."""
        s = self.services
        outcomes = await asyncio.to_thread(s.mig.recover)
        left = await asyncio.to_thread(s.state.list_operations, kind=MIG_APPLY, done=False)
        for op in left:
            ended = await asyncio.to_thread(
                s.state.update_operation, op.id, **interrupted_apply(outcomes)
            )
            log.warning("operation %s (mig.apply) was interrupted: it %s", op.id, ended.state)
        failed = await asyncio.to_thread(s.state.mark_interrupted_operations, INTERRUPTED_REASON)
        for op in failed:
            log.warning("operation %s (%s) was interrupted by the last stop", op.id, op.kind)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until SIGTERM/SIGINT or `request_stop`; ``handle_signals`` False lets tests run
        the agent on a thread (signal handlers need the main thread)."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        stack = contextlib.AsyncExitStack()
        try:
            await self._start(stack)
            await self._stop.wait()
            log.info("stopping")
        finally:
            self._ready = False
            try:
                # Unwinds in reverse start order; a part that failed to start has nothing to stop.
                await asyncio.wait_for(stack.aclose(), SHUTDOWN_GRACE_S)
            except TimeoutError:
                log.error("shutdown took over %.0fs; exiting now", SHUTDOWN_GRACE_S)
                os._exit(1)  # last resort: worker threads must not keep the process alive

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        s = self.services
        cfg = s.config
        loop = asyncio.get_running_loop()
        stack.callback(s.gpu.close)
        stack.callback(s.state.close)
        s.bus.bind(loop)
        s.runner.bind(loop)
        await self._recover()
        await asyncio.to_thread(s.inventory.refresh_all)  # GetNode never answers empty
        await asyncio.to_thread(s.prewarm.start)
        stack.push_async_callback(asyncio.to_thread, s.prewarm.stop)
        await asyncio.to_thread(s.telemetry.start)
        stack.push_async_callback(asyncio.to_thread, s.telemetry.stop)
        host, port = _split_listen(cfg.metrics_listen)
        self.metrics_port = await self.http.start(host, port)
        stack.push_async_callback(self.http.stop)
        api = s.api()
        server, self.ports, health = create_server(api, cfg)
        await server.start()
        stack.push_async_callback(self._stop_serving, server, health)
        await set_serving(health, True)
        self._guard("inventory", s.inventory.run())
        changed = asyncio.Event()
        if isinstance(s.kube, InClusterKubeClient):
            # Watch the own Node instead of polling it (the API server's load is per agent).
            self._node_watch = NodeWatch(
                s.kube, cfg.node_name, lambda: loop.call_soon_threadsafe(changed.set)
            )
            self._node_watch.informer.start()
            stack.callback(self._node_watch.informer.stop)
        if s.mig_labels is not None:
            period = cfg.mig.label_poll_s if self._node_watch is None else MIG_RESYNC_S
            self._guard("mig-labels", _every(period, s.mig_labels.reconcile, changed))
        if s.kube is not None:
            self._guard("cache-labels", _every(CACHE_LABELS_S, self._publish_cache_labels))
        if isinstance(s.kube, InClusterKubeClient) and cfg.telemetry.idle_reclaim_after_s > 0:
            marker = reclaim_marker(s.kube, cfg, self._node_watch, s.inventory, s.telemetry)
            self._guard("reclaim", _every(RECLAIM_S, marker.mark))
        # Items queued by the CLI in direct mode (`prewarm file --no-wait`) or by a manifest
        # land in the shared database; pick them up without waiting for a restart.
        self._guard("prewarm-queue", _every(PREWARM_QUEUE_S, s.prewarm.schedule_pending))
        stack.push_async_callback(self._cancel_tasks)
        log.info(
            "agent serving: metrics %s:%d, gRPC %s, socket %s (%s, %d GPUs)",
            host,
            self.metrics_port,
            f"mTLS :{self.ports.tcp}" if self.ports.tcp else "TCP off",
            self.ports.socket,
            f"simulated node {cfg.simulate}" if cfg.simulate else "NVML",
            len(s.inventory.layouts()),
        )
        self._ready = True

    async def _stop_serving(self, server: grpc.aio.Server, health: HealthServicer) -> None:
        s = self.services
        await set_serving(health, False)
        # Operations start checkpointing while the calls in flight finish.
        operations = asyncio.create_task(s.runner.shutdown(SHUTDOWN_GRACE_S - RPC_GRACE_S - 2))
        await server.stop(RPC_GRACE_S)
        await operations
        s.config.socket_path.unlink(missing_ok=True)

    def _publish_cache_labels(self) -> None:
        """``gpu-agent.io/cache.<name>=ready`` on this Node, for cache-affinity scheduling."""
        s = self.services
        assert s.kube is not None
        node = s.config.node_name
        watched = self._node_watch.labels() if self._node_watch is not None else None
        current = watched if watched is not None else s.kube.node_labels(node)
        patch = label_patch(current, s.prewarm.items())
        if patch:
            s.kube.patch_node_labels(node, patch["metadata"]["labels"])

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _every(
    period_s: float, work: Callable[[], object], wake: asyncio.Event | None = None
) -> None:
    """Run blocking ``work`` in a thread every ``period_s``, and at once when ``wake`` is set;
    a failed pass is logged and retried (the API server or a GPU may be briefly away), it does
    not stop the agent."""
    while True:
        try:
            await asyncio.to_thread(work)
        except (AgentError, OSError):
            log.exception("periodic %s failed; retrying in %.0fs", work, period_s)
        if wake is None:
            await asyncio.sleep(period_s)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), period_s)
        wake.clear()


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)
