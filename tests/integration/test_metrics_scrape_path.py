"""A scrape of the whole agent returns bytes encoded ahead: while 100 scrapes are served, the
event loop's thread makes no filesystem call, no state-database call and no NVML call on the
scrape's path, although the page carries every owner's series (prewarm cache and volume, state
dir, driver, health, allocation mode), whose reads happen on the publication tick."""

from __future__ import annotations

import os
import sys
import threading
import types
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.unit.api.support import InProcessAgent, agent_config

pytestmark = pytest.mark.integration

PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
#: C modules whose calls touch a file or the database
_IO_MODULES = ("posix", "_sqlite3", "sqlite3", "_io", "io", "builtins")
_IO_NAMES = ("open", "stat", "statvfs", "lstat", "listdir", "scandir", "execute", "connect")


def _scrape(port: int, gzip_ok: bool) -> bytes:
    headers = {"Accept": PROMETHEUS_ACCEPT}
    if gzip_ok:
        headers["Accept-Encoding"] = "gzip"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())


def _in_scrape(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` runs inside the HTTP server's dispatch of a request."""
    while frame is not None:
        if frame.f_code.co_name == "_dispatch" and frame.f_code.co_filename.endswith("http.py"):
            return True
        frame = frame.f_back
    return False


class _Watch:
    """A profile hook for the loop's thread that records I/O and NVML calls made on a scrape."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
            if ("/agent/gpu/" in filename or "pynvml" in filename) and _in_scrape(frame):
                self.seen.append(f"{filename}:{frame.f_code.co_name}")
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
            owner = getattr(arg, "__self__", None)
            module = getattr(arg, "__module__", None) or type(owner).__module__
            if module in _IO_MODULES and name in _IO_NAMES and _in_scrape(frame):
                self.seen.append(f"{module}.{name}")


def _on_loop(agent: InProcessAgent, call: Any, *args: Any) -> None:
    done = threading.Event()
    assert agent._loop is not None

    def run() -> None:
        call(*args)
        done.set()

    agent._loop.call_soon_threadsafe(run)
    assert done.wait(10)


def test_a_scrape_reads_no_file_database_or_nvml(tmp_path: Path) -> None:
    with InProcessAgent(tmp_path, agent_config(tmp_path)) as agent:
        port = agent.node.metrics_port
        exporter = agent.node.services.telemetry.exporter
        for gzip_ok in (False, True):  # a format's first scrape may wait for its encode
            _scrape(port, gzip_ok)
        watch = _Watch()
        _on_loop(agent, sys.setprofile, watch)
        try:
            bodies = [_scrape(port, gzip_ok=i % 2 == 0) for i in range(100)]
        finally:
            _on_loop(agent, sys.setprofile, None)
        assert watch.seen == []
        page = _scrape(port, gzip_ok=False).decode()
        for series in (
            "gpu_agent_prewarm_cache_bytes{",
            "gpu_agent_state_writable{",
            "gpu_agent_driver_ready{",
            "gpu_agent_allocation_mode{",
            "DCGM_FI_DEV_GPU_TEMP{",
        ):
            assert series in page, series
        assert all(bodies)

        # The watch sees a filesystem call when a scrape makes one (as the old collectors did).
        handle = exporter.handle

        async def statting(request: Any) -> Any:
            os.statvfs(tmp_path)
            return await handle(request)

        agent.node.http._routes["/metrics"] = statting
        _on_loop(agent, sys.setprofile, watch)
        try:
            _scrape(port, gzip_ok=False)
        finally:
            _on_loop(agent, sys.setprofile, None)
        assert watch.seen == ["posix.statvfs"]
