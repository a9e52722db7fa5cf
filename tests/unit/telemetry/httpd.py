"""Serve an exporter on the agent's own HTTP server, on a background event loop."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from agent.http import HttpServer
from agent.telemetry.exporter import MetricsExporter


@contextmanager
def serve_metrics(exporter: MetricsExporter) -> Iterator[int]:
    """Yields the port of ``http://127.0.0.1:<port>/metrics``."""
    loop = asyncio.new_event_loop()
    server = HttpServer({"/metrics": exporter.handle})
    port = loop.run_until_complete(server.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def scrape(port: int, accept: str = "") -> tuple[str, str]:
    """(content type, body) of one GET /metrics."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()
