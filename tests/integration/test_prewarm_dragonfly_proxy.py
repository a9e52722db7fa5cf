"""Dragonfly proxy mode against a real forward proxy (Debian tinyproxy stands in for dfdaemon's
:4001): requests go through the proxy with the X-Dragonfly-* headers, and resume still works."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.prewarm.model import FileRequest, ItemState
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.prewarm_fixtures.tinyproxy import tinyproxy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("tinyproxy") and not Path("/usr/bin/tinyproxy").exists(),
        reason="Debian package tinyproxy is not installed (scripts/test installs it)",
    ),
]
MIB = 1024 * 1024


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as o:
        yield o


def test_files_go_through_the_proxy_with_dragonfly_headers(tmp_path: Path, origin: Origin) -> None:
    digest = origin.add("w.bin", (b"dragonfly" * MIB)[: 2 * MIB])
    with tinyproxy(tmp_path) as (proxy, log):
        svc = make_service(tmp_path, proxy=proxy)
        item = svc.run(svc.submit(FileRequest(origin.url("w.bin"), sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    assert item.options["via"] == "dragonfly-proxy"
    [seen] = origin.requests
    assert seen.headers["X-Dragonfly-Use-P2P"] == "true"
    assert "tinyproxy" in seen.headers.get("Via", "")  # it really crossed the proxy
    assert origin.url("w.bin") in log.read_text()


def test_resume_through_the_proxy_asks_dfdaemon_for_the_whole_file(
    tmp_path: Path, origin: Origin
) -> None:
    """A resumed Range request carries X-Dragonfly-Prefetch so dfdaemon caches all of it."""
    digest = origin.add("r.bin", hashlib.sha256(b"r").digest() * (4 * MIB // 32))
    origin.faults.drop_after["/r.bin"] = MIB
    with tinyproxy(tmp_path) as (proxy, _):
        svc = make_service(tmp_path, proxy=proxy)
        item = svc.run(svc.submit(FileRequest(origin.url("r.bin"), sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    resumed = [r for r in origin.requests if "Range" in r.headers]
    assert resumed and resumed[0].headers["X-Dragonfly-Prefetch"] == "true"
    assert resumed[0].headers["Range"] == f"bytes={MIB}-"
