"""The two exporters that ``bench.telemetry_scrape`` measures, each started in a process of its own.

This module imports nothing at the top beyond ``sys`` and ``pathlib``: whatever it imported would
count in the measured exporter's memory. (It used to be ``telemetry_scrape`` itself, whose grpc,
protobuf and psutil imports for the fake kubelet and the measuring added 17 MB to the peer's RSS.)

Usage: python -m bench.scrape_targets gpu-agent STATE PORT KUBELET_SOCKET LOG_DIR
       python -m bench.scrape_targets nvitop-exporter STATE PORT
       python -m bench.scrape_targets floor BODY_BYTES PORT
"""

from __future__ import annotations

import sys
from pathlib import Path

PRESET = "dgx-h100"
INTERVAL_S = 1.0  # both exporters' collection interval


async def _sigterm() -> None:
    """Returns when this process is sent SIGTERM (how the bench stops a target)."""
    import asyncio
    import signal

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def run_agent(state_dir: Path, port: int, socket: Path, log_dir: Path) -> None:
    """gpu-agent's telemetry service and /metrics server, as ``gpu-agent serve`` builds them."""
    import asyncio

    from agent.config import TelemetrySettings
    from agent.gpu import open_driver
    from agent.gpu.sim import SimControl
    from agent.http import HttpServer
    from agent.telemetry.service import build_telemetry

    driver = open_driver(PRESET, state_dir, latency=True)
    service = build_telemetry(
        driver,
        TelemetrySettings(interval_s=INTERVAL_S, kubelet_socket=socket, container_log_dir=log_dir),
        hostname="bench",
        proc_root=SimControl(state_dir).proc_root,
    )
    service.start()

    async def serve() -> None:
        server = HttpServer({"/metrics": service.exporter.handle})
        await server.start("127.0.0.1", port)
        await _sigterm()
        await server.stop()

    asyncio.run(serve())
    service.stop()
    driver.close()


def run_nvitop(state_dir: Path, port: int) -> None:
    """nvitop-exporter as its console script runs it, seeing the simulator as ``pynvml``."""
    from agent.gpu.sim import install_as_pynvml

    install_as_pynvml(state_dir, latency=True)  # before nvitop imports pynvml
    from nvitop_exporter.cli import main

    sys.argv = [
        "nvitop-exporter",
        *("--bind-address", "127.0.0.1", "--port", str(port), "--interval", str(INTERVAL_S)),
    ]
    sys.exit(main())


def run_floor(body_bytes: int, port: int) -> None:
    """A server that does nothing but answer every request with the same ``body_bytes``, on
    asyncio as gpu-agent's: what the machine (wake-ups from idle) and the bench's client add to
    any scrape, whatever the exporter does."""
    import asyncio

    head = f"HTTP/1.1 200 OK\r\nContent-Length: {body_bytes}\r\nConnection: close\r\n\r\n"
    response = head.encode() + b"#" * body_bytes

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", port)
        await _sigterm()
        server.close()

    asyncio.run(serve())


if __name__ == "__main__":
    name, port = sys.argv[1], int(sys.argv[3])
    if name == "gpu-agent":
        run_agent(Path(sys.argv[2]), port, Path(sys.argv[4]), Path(sys.argv[5]))
    elif name == "nvitop-exporter":
        run_nvitop(Path(sys.argv[2]), port)
    else:
        run_floor(int(sys.argv[2]), port)
