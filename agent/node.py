"""Composition root: builds every service from the config and owns start and stop.

One process, one asyncio loop. Blocking NVML work runs in threads. SIGTERM/SIGINT resolve one
stop event; shutdown is staged (stop accepting, stop services, close the driver) with a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from agent.config import AgentConfig
from agent.gpu import GpuDriver, open_driver
from agent.http import HttpServer, Request, Response
from agent.state import StateStore

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 20.0


@dataclass
class Services:
    """Everything the agent runs, built once and passed around as one object."""

    config: AgentConfig
    gpu: GpuDriver
    state: StateStore


def build_services(config: AgentConfig) -> Services:
    # The simulated driver models real NVML latencies when serving, so timings are honest.
    gpu = open_driver(config.simulate, config.state_dir, latency=True)
    state = StateStore(config.state_dir / "agent.db")
    return Services(config=config, gpu=gpu, state=state)


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class Node:
    """The running agent."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._stop = asyncio.Event()
        self._ready = False
        self.http = HttpServer({"/healthz": self._healthz, "/readyz": self._readyz})
        self.metrics_port: int | None = None

    async def _healthz(self, _: Request) -> Response:
        return Response(200, b"ok\n")

    async def _readyz(self, _: Request) -> Response:
        return Response(200, b"ready\n") if self._ready else Response(503, b"starting\n")

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        cfg = self.services.config
        host, port = _split_listen(cfg.metrics_listen)
        self.metrics_port = await self.http.start(host, port)
        gpus = await asyncio.to_thread(self.services.gpu.gpus)
        log.info(
            "agent serving on %s:%d (%s, %d GPUs)",
            host,
            self.metrics_port,
            f"simulated node {cfg.simulate}" if cfg.simulate else "NVML",
            len(gpus),
        )
        self._ready = True
        await self._stop.wait()
        log.info("stopping")
        self._ready = False
        await asyncio.wait_for(self._shutdown(), SHUTDOWN_GRACE_S)

    async def _shutdown(self) -> None:
        await self.http.stop()
        self.services.state.close()
        self.services.gpu.close()
