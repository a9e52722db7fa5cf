"""`InClusterKubeClient.close` (the agent's stop) ends every call in flight at once and refuses
new ones: a call to an API server that never answers otherwise waits the client's timeout, set
to 60 s here so that a call that ends within 10 s was ended by the close."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from agent.errors import AgentError
from agent.kube import InClusterKubeClient
from tests.integration.shutdown_fixtures import connecting_to, full_listen_queue, silent_peer
from tests.unit.api.support import wait_for

TIMEOUT_S = 60.0
ENDED_S = 10.0


def client(url: str) -> InClusterKubeClient:
    return InClusterKubeClient(url, None, token="t", timeout=TIMEOUT_S, insecure=True)


def ended_by_close(kube: InClusterKubeClient, waiting: Callable[[], object]) -> str:
    """Call the API in a thread; once ``waiting()`` says the call waits, close the client;
    what the call raised."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            kube.get("/api/v1/nodes")
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    wait_for(waiting, "the call to wait on the API server", 30)
    kube.close()
    thread.join(ENDED_S)
    assert not thread.is_alive(), "the call went on waiting after close"
    [exc] = raised
    assert isinstance(exc, AgentError)
    return str(exc)


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_close_ends_a_call_waiting_for_its_answer_or_its_handshake(scheme: str) -> None:
    with silent_peer() as api:
        said = ended_by_close(client(f"{scheme}://127.0.0.1:{api.port}"), api.asked.is_set)
    assert said.endswith("(GET /api/v1/nodes): the agent is stopping"), said


def test_close_ends_a_connect_that_hangs() -> None:
    """The API server's listen queue full (or its SYNs dropped): the connect itself waits."""
    with full_listen_queue() as port:
        kube = client(f"http://127.0.0.1:{port}")
        said = ended_by_close(kube, lambda: connecting_to(os.getpid(), port))
    assert said.endswith("the agent is stopping"), said


def test_after_close_a_call_fails_at_once_without_connecting() -> None:
    with silent_peer() as api:
        kube = client(f"http://127.0.0.1:{api.port}")
        kube.close()
        with pytest.raises(AgentError, match="the agent is stopping"):
            kube.get("/api/v1/nodes")
        assert not api.asked.is_set()


class CountingPlugin:
    """An exec plugin's stand-in: counts the tokens asked of it (a real one runs a process
    for up to its timeout)."""

    def __init__(self) -> None:
        self.asked = 0

    def token(self, refresh: bool = False) -> str:
        self.asked += 1
        return "t"


def test_after_close_no_exec_plugin_runs_for_a_call_or_a_watch() -> None:
    with silent_peer() as api:
        plugin = CountingPlugin()
        kube = InClusterKubeClient(
            f"http://127.0.0.1:{api.port}",
            None,
            exec_plugin=plugin,
            timeout=TIMEOUT_S,  # type: ignore[arg-type]
        )
        kube.close()
        with pytest.raises(AgentError, match="the agent is stopping"):
            kube.get("/api/v1/nodes")
        with pytest.raises(AgentError, match="the agent is stopping"):
            kube.stream("/api/v1/nodes", {"watch": "1"}, timeout=TIMEOUT_S)
        assert plugin.asked == 0 and not api.asked.is_set()


def test_a_close_while_a_socket_connects_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """`close` between a socket's hold and its connect finds no connection to shut down
    (ENOTCONN): the connect then succeeds and its call would wait the whole timeout."""
    import socket

    from agent.kube_conn import Sockets

    sockets = Sockets()
    connect = socket.socket.connect

    def closed_meanwhile(sock: socket.socket, address: object) -> None:
        sockets.close()
        connect(sock, address)

    with silent_peer() as api:
        monkeypatch.setattr(socket.socket, "connect", closed_meanwhile)
        with pytest.raises(OSError, match="the agent is stopping"):
            sockets.create_connection(("127.0.0.1", api.port), TIMEOUT_S)
