"""A stand-in for nydus-snapshotter's system controller: real HTTP on a real Unix socket.

It answers ``PUT /api/v1/prefetch`` with 200 (the snapshotter answers 200 whatever the body) and
records every request, so a test sees exactly what the agent sent.
"""

from __future__ import annotations

import socketserver
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path


@dataclass
class Received:
    method: str
    path: str
    content_type: str
    body: bytes


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@dataclass
class FakeSnapshotter:
    socket_path: Path
    status: int = 200
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def address_string(self) -> str:
                return "unix"

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                fake.received.append(
                    Received("PUT", self.path, self.headers.get("Content-Type", ""), body)
                )
                self.send_response(fake.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = _Server(str(self.socket_path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSnapshotter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket_path.unlink(missing_ok=True)
