"""Every wait in the agent ends when the agent stops (issue 13).

A fetch that retries against an origin refusing connections sits in its back-off (1+2+4+8 s
before the longest, 16 s); a SIGTERM then must end the process cleanly within 2 s, not after
the back-off or the 20 s shutdown deadline. The item keeps its queue place for the next start.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import (
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from tests.integration.shutdown_fixtures import assert_quick_clean_exit
from tests.unit.api.support import AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the test holds it: bound (so no
    other process can take it) but never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def stalling_origin() -> Iterator[tuple[int, threading.Event]]:
    """An origin that answers the headers of a 1 MiB body, then sends nothing more: the fetch
    blocks in a socket read (30 s read timeout) until something unblocks it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    answered = threading.Event()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n" + b"x" * 1024)
            answered.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(server.getsockname()[1]), answered
    finally:
        server.close()
        for conn in held:
            conn.close()


def submit(agent: AgentProcess, url: str) -> str:
    target = prewarm_pb2.PrewarmTarget(file=prewarm_pb2.FileTarget(url=url, name="m"))
    with unix_channel(agent.socket) as channel:
        answer = prewarm_pb2_grpc.PrewarmServiceStub(channel).SubmitPrewarm(
            prewarm_pb2.SubmitPrewarmRequest(targets=[target]), timeout=10
        )
    return str(answer.operation.name)


def test_sigterm_during_the_longest_fetch_back_off_exits_0_within_2s(
    tmp_path: Path, refusing_port: int
) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        submit(agent, f"http://127.0.0.1:{refusing_port}/m")
        wait_for(lambda: "resuming in 16.0s" in agent.output(), "the longest back-off", 60, 0.1)
        assert_quick_clean_exit(agent)
    finally:
        agent.stop()


def test_sigterm_while_a_fetch_waits_on_a_stalled_origin_exits_0_within_2s(
    tmp_path: Path, stalling_origin: tuple[int, threading.Event]
) -> None:
    port, answered = stalling_origin
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        submit(agent, f"http://127.0.0.1:{port}/m")
        assert answered.wait(30), "the fetch never reached the origin"
        assert_quick_clean_exit(agent)
    finally:
        agent.stop()
