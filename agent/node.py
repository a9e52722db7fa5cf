"""The running agent: starts the services (built by agent/services.py), runs the background
tasks they declare (agent/tasks.py) with one runner, and owns the stop.

One process, one asyncio loop: the gRPC API, the /metrics + /healthz HTTP server and the
inventory refresher run on it; blocking work runs in threads (telemetry sampler, prewarm
workers, operation workers, the tasks' passes). SIGTERM/SIGINT resolve one stop event;
shutdown is staged, with a deadline: stop serving, let operations checkpoint, stop the
workers, close the store and the driver.

Start order matters for honest operations: the previous process may have been killed in the
middle of long work, so `agent.api.restart.recover_at_start` runs before the API serves. That
can take minutes (a MIG mode change resumed on eight GPUs, each reset up to 120 s), so the
HTTP server listens first: /healthz answers while the event loop does, /readyz answers 503
naming the start's step (each MIG step included) until the API serves, and /metrics answers
503 until then (no series before the start has checked it). A SIGTERM during the start is
honoured between its steps, never within one (a MIG step runs to its end: agent/mig/apply.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc
from grpc_health.v1._async import HealthServicer

from agent.api import Ports, create_server, set_serving
from agent.api.restart import recover_at_start
from agent.errors import AgentError
from agent.http import Request, Response
from agent.loops import ExhaustionLog, call_soon_from_thread, close, every, log_stuck
from agent.mig.apply import ProgressEvent
from agent.preflight import listen_refusal, split_listen
from agent.services import Services, build_services
from agent.tasks import Daemon, Need, Task
from agent.webconfig import load_web_config, metrics_server

log = logging.getLogger(__name__)

__all__ = ["Node", "Services", "build_services"]

SHUTDOWN_GRACE_S = 20.0
"""Whole shutdown budget; Kubernetes' default terminationGracePeriodSeconds is 30."""
RPC_GRACE_S = 5.0
"""Of it, how long calls in flight may finish after the server stops accepting new ones."""
_CANCEL_AGAIN_S = 0.1
#: How long the start waits for the allocation mode's first list (then it is unknown until the
#: API server answers).
ALLOCATION_SYNC_S = 3.0


class _StoppedStarting(Exception):
    """A stop was asked during the start: the step it names and those after it are not begun."""


class Node:
    """The running agent."""

    def __init__(self, services: Services, *, embedded: bool = False) -> None:
        """``embedded``: inside another program (`agent.embedded`): the API on its socket only,
        no metrics/health HTTP server and no cluster duties (label controllers)."""
        self.services = services
        self.embedded = embedded
        self._stop = asyncio.Event()
        self._ready = False
        #: What the agent is doing while it does not serve (/readyz says it), set by the start.
        self._phase = "starting"
        #: The API served once: /metrics serves from then on, through the stop.
        self._served = False
        self._tasks: list[asyncio.Task[None]] = []
        routes = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
        }
        web = services.config.metrics_web_config
        self.http = metrics_server(
            routes,
            load_web_config(web) if web is not None else None,
            services.config.handshake_timeout_s,
        )
        self.metrics_port: int | None = None
        self._metrics_host = ""
        self.ports: Ports | None = None

    async def _healthz(self, _: Request) -> Response:
        """Answered by the event loop: 200 while it runs, from the start's first step (the
        start's long steps run on threads) to the end of the stop."""
        return Response(200, b"ok\n")

    async def _metrics(self, request: Request) -> Response:
        """The exporter's page once the API served; 503 before: the records the services
        built with (the prewarm cache before its reconcile, the allocation mode before its
        first list, MIG before recovery) are not checked yet."""
        if not self._served:
            return Response(503, f"{self._phase}; /metrics serves once the API does\n".encode())
        return await self.services.telemetry.exporter.handle(request)

    async def _readyz(self, _: Request) -> Response:
        """Ready once serving: the API, prewarm and /metrics are what readiness promises.

        A driver that is not ready yet (or is being upgraded) and no GPU answering (each lost,
        or failing its reads) are states, not failures: the agent serves, and its GetNode is
        how the coordinator and Prometheus learn of them (an unready pod is skipped by the
        coordinator and taken out of the Service), so it stays ready and the body says what is
        missing (docs/operations.md)."""
        if not self._ready:
            return Response(503, f"{self._phase}\n".encode())
        driver = self.services.driver.state
        if not driver.attached:
            return Response(
                200, f"ready; GPU features wait for the driver: {driver.reason}\n".encode()
            )
        silent = self.services.inventory.no_gpu_answers()
        if silent:
            said = f"ready; no GPU answers: {silent}; the API, prewarm and "
            return Response(200, f"{said}/metrics serve\n".encode())
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

    def _run(self, tasks: Sequence[Task | Daemon]) -> None:
        """The one runner: each task whose needs are met, on `every` (a daemon on its own
        schedule), under `_guard`; a task that needs the driver skips its passes while the GPUs
        are detached."""
        s, loop = self.services, asyncio.get_running_loop()
        have = Need.DRIVER | (Need.WRITABLE if s.state.read_only is None else Need.NONE)
        if not self.embedded:
            have |= Need.LISTENER | (Need.KUBE if s.edge is not None else Need.NONE)
        for task in tasks:
            if task.needs & ~have:
                continue
            if isinstance(task, Daemon):
                self._guard(task.name, task.run())
                continue
            wake = None
            if task.wakes:
                wake = woken = asyncio.Event()
                for subscribe in task.wakes:
                    subscribe(functools.partial(call_soon_from_thread, loop, woken.set))
            work = task.work
            if Need.DRIVER in task.needs:
                work = s.driver.passes(task.work)
            self._guard(
                task.name, every(task.name, task.period_s, work, wake, wait_first=task.wait_first)
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
        ``ready`` is called once the API serves; a stop asked during the start ends it at its
        next step, without serving (and without ``ready``).
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
        except _StoppedStarting as stopped:
            log.info("stopping during the start, before %s", stopped)
        else:
            if ready is not None:
                ready()
            await self._stop.wait()
            log.info("stopping")
        finally:
            self._ready = False
            self._phase = "stopping"
            # Not wait_for: a shutdown past its deadline must still be running when it is
            # logged, so the log can say where it waits.
            closing = asyncio.ensure_future(close(stack))
            done, _ = await asyncio.wait({closing}, timeout=SHUTDOWN_GRACE_S)
            if done:
                closing.result()
            else:
                log_stuck(asyncio.current_task())
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
        if not self.embedded:  # first: the probes answer through every step below
            await self._listen(stack)
        # The driver is tried once before serving, so a node that has one serves with its GPUs
        # from the first call; one that has none yet serves everything else and attaches later.
        self._step("probing the NVIDIA driver")
        missing = await asyncio.to_thread(s.driver.probe)
        if s.edge is not None:  # the allocation's informers start before the owner
            # Unwound after the edge's stop: the calls still in flight end then, so no thread
            # holds the stop waiting on an API server that never answers (agent/kube_conn.py).
            stack.callback(s.edge.client.close)
            stack.callback(s.edge.stop)
        self._step("listing the allocation mode")
        await self._follow_allocation(stack)  # before recovery: the mode gates the MIG journal
        self._step("recovering what the last stop left (MIG journal, operations)")
        recover = functools.partial(recover_at_start, progress=self._recovering)
        await asyncio.to_thread(recover, s.state, s.mig, attached=missing is None)
        retention = s.config.operations
        await asyncio.to_thread(s.runner.prune, retention.max_age_s, retention.max_count)
        stack.push_async_callback(asyncio.to_thread, s.driver.stop)
        self._step("reading the GPUs")
        if missing is None:
            # The first snapshot is taken before GetNode serves: it never answers empty.
            await asyncio.to_thread(lambda: s.driver.attach(again=False, count=s.gpus))
        else:
            s.inventory.driver_missing(missing.cause, missing.reason)
        await asyncio.to_thread(s.inventory.refresh_all)
        self._step("starting prewarm")
        if s.state.read_only is None:
            await asyncio.to_thread(s.prewarm.start)
        else:  # its reconcile, queue and retries write the index
            s.state.note("the prewarm cache is listed as last recorded; nothing is fetched")
        stack.push_async_callback(asyncio.to_thread, s.prewarm.stop)
        self._step("starting the API")
        await self._serve(stack, attached=missing is None)

    def _step(self, phase: str) -> None:
        """Begin the start's next step, said on /readyz; a stop asked meanwhile ends the start
        here, between two steps (`_StoppedStarting`)."""
        if self._stop.is_set():
            raise _StoppedStarting(phase)
        self._phase = f"starting: {phase}"

    def _recovering(self, event: ProgressEvent) -> None:
        """Each MIG step of the start's recovery, before it is made (on the recovery's thread;
        one assignment, read whole by /readyz)."""
        self._phase = f"starting: recovering MIG: {event.message}"

    async def _listen(self, stack: contextlib.AsyncExitStack) -> None:
        """Bind the metrics and probe server; serve's preflight checked the port, so a refusal
        here is a port taken since (the same line)."""
        cfg = self.services.config
        self._metrics_host, port = split_listen(cfg.metrics_listen)
        try:
            self.metrics_port = await self.http.start(self._metrics_host, port)
        except OSError as exc:
            raise listen_refusal("metrics_listen", cfg.metrics_listen, exc) from exc
        stack.push_async_callback(self.http.stop)
        log.info(
            "probes and metrics listening on %s:%d; /readyz answers 503 until the API serves",
            self._metrics_host,
            self.metrics_port,
        )

    async def _serve(self, stack: contextlib.AsyncExitStack, *, attached: bool) -> None:
        """Serve the API, then start the background tasks; the Node's owner starts once every
        task that reads the Node's watch has subscribed."""
        s, cfg = self.services, self.services.config
        server, self.ports, health = create_server(s.api(), cfg)
        await server.start()
        stack.push_async_callback(self._stop_serving, server, health)
        await set_serving(health, True)
        self._run([*s.daemons(attached=attached), *s.tasks()])
        if s.edge is not None and not self.embedded:
            s.edge.start()  # one watch of the own Node, read by every feature; its owner writes
        stack.push_async_callback(self._cancel_tasks)
        # Before the line that says so: a reader of the log may probe /readyz and /metrics.
        self._ready = self._served = True
        if self.embedded:
            log.debug("embedded agent serving on %s", self.ports.socket)
            return
        self._say_serving(attached)

    def _say_serving(self, attached: bool) -> None:
        s, ports, host = self.services, self.ports, self._metrics_host
        assert ports is not None
        log.info(
            "agent serving: metrics %s:%d, gRPC %s, socket %s (%s, %s)",
            host,
            self.metrics_port,
            f"mTLS :{ports.tcp}" if ports.tcp else "TCP off",
            ports.socket,
            f"simulated node {s.config.simulate}" if s.config.simulate else "NVML",
            f"{s.gpus()} GPUs" if attached else "waiting for the driver",
        )

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
