"""Shutdown is bounded, and start-up refuses before it starts anything (issue 36).

Real ``gpu-agent serve`` processes, a real HTTP origin that trickles the body (one 64 KiB write
at a time, paced), real signals. A download cut by SIGTERM keeps its bytes and the next start
asks the origin only for the rest; a start that must refuse (a socket directory others may
write) says so as its last line, with the documented exit code, before any prewarm, listener or
driver started.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import cache_pb2, prewarm_pb2, prewarm_pb2_grpc
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.shutdown_fixtures import (
    assert_quick_clean_exit,
    connecting_to,
    full_listen_queue,
)
from tests.unit.api.support import REPO, AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
SIZE = 8 * MIB
#: 512 KiB/s: the whole file takes 16 s, so a SIGTERM lands mid-body every time.
RATE = 512 * 1024


def payload(n: int) -> bytes:
    return (hashlib.sha256(b"bounded").digest() * (n // 32 + 1))[:n]


def submit(agent: AgentProcess, url: str, digest: str) -> None:
    file = prewarm_pb2.FileTarget(url=url, name="w", sha256=digest)
    target = prewarm_pb2.PrewarmTarget(file=file)
    with unix_channel(agent.socket) as channel:
        prewarm_pb2_grpc.PrewarmServiceStub(channel).SubmitPrewarm(
            prewarm_pb2.SubmitPrewarmRequest(targets=[target]), timeout=10
        )


def item(agent: AgentProcess) -> cache_pb2.CacheItem:
    with unix_channel(agent.socket) as channel:
        listed = prewarm_pb2_grpc.PrewarmServiceStub(channel).ListPrewarmItems(
            prewarm_pb2.ListPrewarmItemsRequest(), timeout=10
        )
    [only] = listed.items
    return only


def partial_bytes(root: Path) -> int:
    partials = root / "cache" / "partial"
    return sum(p.stat().st_size for p in partials.glob("*.part")) if partials.is_dir() else 0


def interrupted_download(tmp_path: Path, origin: Origin, agent: AgentProcess) -> tuple[str, float]:
    """Start the trickled download, SIGTERM the agent once bytes are on disk; returns the
    file's digest and how long the exit took."""
    digest = origin.add("w.bin", payload(SIZE))
    origin.faults.rate_bps["/w.bin"] = RATE
    agent.start()
    submit(agent, origin.url("w.bin"), digest)
    wait_for(lambda: partial_bytes(tmp_path) > 0, "bytes of the download on disk", 30)
    return digest, assert_quick_clean_exit(agent)


def test_sigterm_mid_download_from_a_trickling_origin_exits_0_at_once_and_resumes(
    tmp_path: Path, origin: Origin
) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        digest, _ = interrupted_download(tmp_path, origin, agent)
        kept = partial_bytes(tmp_path)
        assert 0 < kept < SIZE
        origin.faults.rate_bps.clear()
        agent.start()
        ready = cache_pb2.CACHE_ITEM_STATE_READY
        wait_for(lambda: item(agent).state == ready, "the resumed download to finish", 60)
        assert item(agent).sha256 == digest
        first, resumed = origin.ranges("w.bin")
        assert first is None
        assert resumed is not None and int(resumed.removeprefix("bytes=").rstrip("-")) >= kept
        blob = tmp_path / "cache" / "blobs" / "sha256" / digest
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
        agent.terminate(timeout=30)
    finally:
        agent.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unsafe_socket_dir_is_refused_before_a_pending_prewarm_or_any_listener_starts(
    tmp_path: Path, origin: Origin
) -> None:
    """The refusal is the last line, exit 2 (an invalid setting), and nothing ran first: no
    request reached the origin, the metrics and gRPC ports were never bound."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    metrics, grpc_port = free_port(), free_port()
    config = agent_config(
        tmp_path,
        socket_path=str(run / "agent.sock"),
        metrics_listen=f"127.0.0.1:{metrics}",
        grpc_listen=f"127.0.0.1:{grpc_port}",
    )
    agent = AgentProcess(tmp_path, config)
    agent.socket = run / "agent.sock"
    try:
        interrupted_download(tmp_path, origin, agent)
    finally:
        agent.stop()
    asked = len(origin.requests)
    run.chmod(0o777)  # now another user could replace the socket
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--simulate",
            "dgx-h100",
            "--state-dir",
            str(agent.state_dir),
            "--config",
            str(config),
            "serve",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, "\n".join(lines)
    # Nothing but the refusal (its headline, then its field): no line of a start that ran.
    assert lines and lines[0].startswith("error: refusing to serve the API on"), lines
    assert all(line.startswith("  socket_path: ") for line in lines[1:]), lines
    assert len(origin.requests) == asked, "the pending prewarm reached the origin"
    assert not (run / "agent.sock").exists()


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    with full_listen_queue() as port:
        yield port


def test_sigterm_while_a_connect_to_the_origin_hangs_exits_0_at_once(
    tmp_path: Path, unanswered_port: int
) -> None:
    """The connect is not yet a connection the old stop could reach: it held the shutdown for
    the connect timeout (30 s), past the 20 s budget (exit 1)."""
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        submit(agent, f"http://127.0.0.1:{unanswered_port}/w", "0" * 64)
        assert agent.proc is not None
        pid = agent.proc.pid
        wait_for(lambda: connecting_to(pid, unanswered_port), "the hanging connect", 30)
        assert_quick_clean_exit(agent)
    finally:
        agent.stop()
