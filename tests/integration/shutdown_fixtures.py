"""What the shutdown tests share: the promise they hold the agent to, and peers that never
answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from tests.unit.api.support import AgentProcess

#: docs/operations.md and issue 36: SIGTERM mid-download exits 0 within 2 s. Measured from the
#: signal to the process's exit (`AgentProcess.timed_terminate`): 0.6 to 0.9 s beside two CPU
#: hogs on two cores (load 6 to 9); a wait on a peer or a back-off would take 12 to 30 s.
SHUTDOWN_S = 2.0


def assert_quick_clean_exit(agent: AgentProcess) -> float:
    """SIGTERM: exit 0 within the promise, nothing left running; returns the seconds taken."""
    code, took = agent.timed_terminate(timeout=40)
    assert code == 0, agent.output()
    assert took < SHUTDOWN_S, f"SIGTERM took {took:.2f}s:\n{agent.output()}"
    assert "still running at shutdown" not in agent.output()
    return took


@dataclass
class SilentPeer:
    """A TCP server on loopback that accepts, reads what it is sent and never answers (or
    answers the start it was given, then nothing more)."""

    port: int
    asked: threading.Event = field(default_factory=threading.Event)
    requests: list[bytes] = field(default_factory=list)


@contextmanager
def silent_peer(start: bytes = b"") -> Iterator[SilentPeer]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    peer = SilentPeer(int(server.getsockname()[1]))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
                held.append(conn)
                peer.requests.append(conn.recv(65536))
                conn.sendall(start)
            except OSError:
                return
            peer.asked.set()

    threading.Thread(target=serve, name="silent-peer", daemon=True).start()
    try:
        yield peer
    finally:
        server.close()
        for conn in held:
            conn.close()


@contextmanager
def full_listen_queue() -> Iterator[int]:
    """A loopback port whose listen queue is full: a new connect's SYN is dropped, so the
    connect hangs (for the caller's connect timeout) instead of failing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    held = []
    try:
        while True:
            sock = socket.socket()
            sock.settimeout(0.5)
            try:
                sock.connect(("127.0.0.1", port))
            except OSError:
                sock.close()
                break
            held.append(sock)
        yield port
    finally:
        for sock in held:
            sock.close()
        server.close()


def connecting_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` waits in a connect to ``port`` (its SYN unanswered)."""
    return any(
        c.status == psutil.CONN_SYN_SENT and c.raddr and c.raddr[1] == port
        for c in psutil.Process(pid).net_connections(kind="tcp")
    )
