"""The Kubernetes client's connections, each socket within reach of the agent's stop.

An API server that takes connections and never answers holds a call for the client's timeout
(10 s) in a connect, a TLS handshake or a read; the agent's shutdown waits for the threads
making such calls (17 s of its 20 s budget, measured: the health publish waited out
discovery's call, then its own). `Sockets.close` shuts every socket of a call in flight, so
its blocked connect, handshake or read returns at once, and refuses new calls: the prewarm's
fetches are stopped the same way (agent/prewarm/fetch_http.py).
A write cut so was either whole at the API server (applied) or not (a body cut short is never
applied); the next start reads the Node and writes what it still lacks.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import weakref

__all__ = ["Sockets"]

STOPPING = "the agent is stopping"


class Sockets:
    """The sockets of the client's calls (weakly: one closed and dropped leaves by itself)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.closed = False

    def hold(self, sock: socket.socket) -> None:
        """Within `close`'s reach from now; OSError once closed (the caller closes it)."""
        with self._lock:
            if self.closed:
                raise OSError(STOPPING)
            self._held.add(sock)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            held = list(self._held)
        for sock in held:
            with contextlib.suppress(OSError):  # closed already, or never connected
                # The plain socket's shutdown, also under TLS: it ends a handshake too.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def connection(
        self,
        host: str,
        port: int,
        timeout: float,
        tls: ssl.SSLContext | None,
        server_name: str | None = None,
    ) -> http.client.HTTPConnection:
        """A connection to ``host`` (a proxy's, with a tunnel set after); TLS checks the
        server's certificate against ``server_name`` (kubeconfig's tls-server-name, also sent
        for SNI) when given, else against the host it reaches (the tunnel's end)."""
        if tls is None:
            return _Connection(host, port, timeout, self)
        return _TlsConnection(host, port, timeout, self, tls, server_name)

    def create_connection(
        self, address: tuple[str, int], timeout: float, source: object = None
    ) -> socket.socket:
        """``socket.create_connection``, each socket held before it connects (a connect that
        hangs is ended by `close` too)."""
        host, port = address
        last: OSError | None = None
        for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                self.hold(sock)
                sock.settimeout(timeout)
                sock.connect(where)
                if self.closed:  # closed while it connected: its shutdown found no connection
                    raise OSError(STOPPING)
            except OSError as exc:
                sock.close()
                if self.closed:
                    raise OSError(STOPPING) from exc
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        raise last or OSError(f"{host}: no address")


class _Connection(http.client.HTTPConnection):
    """http.client's, its sockets (a proxy's CONNECT tunnel included) made by `Sockets`."""

    def __init__(self, host: str, port: int, timeout: float, sockets: Sockets) -> None:
        super().__init__(host, port, timeout=timeout)
        self._sockets = sockets
        self._create_connection = sockets.create_connection


class _TlsConnection(_Connection):
    """TLS with its handshake on a held socket (http.client's is inside wrap_socket, where a
    stop cannot reach it)."""

    default_port = http.client.HTTPS_PORT

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        sockets: Sockets,
        context: ssl.SSLContext,
        server_name: str | None,
    ) -> None:
        super().__init__(host, port, timeout, sockets)
        self._context = context
        self._server_name = server_name

    def connect(self) -> None:
        super().connect()
        assert self.sock is not None
        name = self._server_name or self._tunnel_host or self.host  # type: ignore[attr-defined]
        wrapped = self._context.wrap_socket(
            self.sock, server_hostname=name, do_handshake_on_connect=False
        )
        self.sock = wrapped  # closed by the caller's close() whatever follows
        self._sockets.hold(wrapped)
        wrapped.do_handshake()
